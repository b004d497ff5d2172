//! The lazy wing: a lazy provider's volume served through FUSE, its files fetched when first
//! read. Two doors: mounting a lazy volume ([`LazyMount`], `filesystem`, over the kernel's FUSE
//! session and wire in `fuse` and the page-cache rules of `open_files`), and taking one handed
//! over by a predecessor at a planned restart ([`handover::take`]; `handover::offer` is the
//! predecessor's side, which reaches the volumes it hands through [`HandsOverLazy`]).

pub mod filesystem;
pub mod fuse;
pub mod handover;
pub mod open_files;

pub use filesystem::LazyMount;
pub use handover::take::TakenVolume;
pub use handover::{HandOver, HandsOverLazy};
