//! Shares backed by the cluster (their API types are `sharedresource_api::shares`): a volume of
//! one share, its backing Secret or ConfigMap served while the pod's service account may `use`
//! the share (`source`). What the cluster floor keeps for shares (the watches, the cache, the
//! held access answers, the status written back) is in `content::cluster`.

pub mod source;
