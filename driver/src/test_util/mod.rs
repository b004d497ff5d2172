//! What tests and benchmarks of the driver share (feature `test-util`): the one way they reach
//! the driver's socket (`client`) and a directory that unmounts what is left below it
//! (`mounted_dir`).

pub mod client;
pub mod mounted_dir;
