//! The driver's own FUSE server, for lazy volumes: the protocol's bytes (`wire`) and one
//! connection served on a thread of its own (`session`). Our own rather than a library's because
//! a lazy volume must outlive the process serving it: a connection is its `/dev/fuse`
//! descriptor, and serving it on needs a reader that stops between two requests (none read and
//! left unanswered) and a session that starts without the handshake the kernel sends only once
//! per connection, neither of which the libraries offer.

pub mod session;
pub mod wire;
