//! The refresh wing: what changed becomes a refresh of each volume it touches (`refresher`),
//! each refresh's outcome is written once, into the volume's own record in the live table
//! (`volume::live::record`), and three reporters read those records: the pods' Events (`pod_events`, their
//! series in `event_series`, the sink that writes them in `pod_event_sink`), the per-share
//! gauges (`share_gauges`) and the shares' per-node entries (`node_entries`). Nothing here
//! keeps a table of volumes of its own: a volume's history goes with it when the live table
//! forgets it.

pub mod event_series;
pub mod node_entries;
pub mod pod_event_sink;
pub mod pod_events;
pub mod refresher;
pub mod share_gauges;

pub use refresher::{CONCURRENT_REFRESHES, GAUGES_EVERY, run};
