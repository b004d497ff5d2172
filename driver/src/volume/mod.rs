//! A volume's life on the node: the requests the wire checked (`checked`), publish, unpublish
//! and one volume's refresh (`service`), the one table of live volumes (`live`), the refresher,
//! kubelet's target paths and their symlink-free walk, the mounter, the atomic writer and the
//! node's content budget it writes within, the volume records, recovery after a restart, and
//! the state lock.

pub mod atomic_writer;
pub mod checked;
pub mod content_budget;
pub mod error;
pub mod event_series;
pub mod lazy;
pub mod live;
pub mod lock;
pub mod mounter;
pub mod ownership;
pub mod pod_event_sink;
pub mod pod_events;
pub mod published;
pub mod recovery;
pub mod refresh;
pub mod service;
pub mod share_gauges;
pub mod store;
pub mod target_dir;
pub mod target_path;
