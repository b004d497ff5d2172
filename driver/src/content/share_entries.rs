//! This node's entries in the shares' status (`status.nodesNotUpdated`), as the volume layer
//! wants them after a refresh pass (`volume::refresh::node_entries` composes them from the
//! volumes' records) and the cluster's floor writes them (`cluster::written_entries`).

use std::collections::BTreeMap;
use std::time::SystemTime;

use sharedresource_api::ShareKind;

/// A share, by kind and name.
pub type ShareKey = (ShareKind, String);

/// This node's entry in a share's status: how many of its volumes fail, why the first does,
/// and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    /// The words of the entry.
    pub message: String,
    /// When the first of those volumes started failing.
    pub since: SystemTime,
}

/// The entry wanted for each share this node's volumes mount and have said something of
/// (`None`: no entry, its volumes are current); a share missing has no volume here any more.
pub type ShareEntries = BTreeMap<ShareKey, Option<NodeEntry>>;
