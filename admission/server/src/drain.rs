//! The drain switch, thrown at SIGTERM. From then on `/readyz` fails, so the endpoints controller
//! takes the pod out of the Service, and every webhook response carries `Connection: close`, so a
//! kept-alive client (kube-apiserver reuses its connections indefinitely) reconnects, reaching
//! another replica, after its answer instead of losing its next request to a closing socket. The
//! listener keeps accepting meanwhile; the server closes it only after the shutdown delay.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the server is draining.
#[derive(Debug, Default)]
pub struct Drain(AtomicBool);

impl Drain {
    /// Not draining.
    pub fn new() -> Drain {
        Drain::default()
    }

    /// Starts draining (for good).
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once draining has started.
    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
