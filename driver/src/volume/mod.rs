//! A volume's life on the node: the requests the wire checked (`checked`), publish, unpublish
//! and one volume's refresh (`service`), the one table of live volumes (`live`, each entry with
//! its record of what its refreshes did), the refresh wing (`refresh`: the refresher, that
//! record, and its three reporters: pod Events, the per-share gauges, the shares' per-node
//! entries), kubelet's target paths and their
//! symlink-free walk, the mounter, the atomic writer and the node's content budget it writes
//! within, the volume records, recovery after a restart, the state lock, and the lazy wing
//! (`lazy`: volumes served through FUSE, and their handover to a successor).

pub mod atomic_writer;
pub mod checked;
pub mod content_budget;
pub mod error;
pub mod lazy;
pub mod live;
pub mod lock;
pub mod mounter;
pub mod ownership;
pub mod published;
pub mod recovery;
pub mod refresh;
pub mod service;
pub mod store;
pub mod target_dir;
pub mod target_path;
