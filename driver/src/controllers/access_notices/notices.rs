//! What the watches of the access notices gather: what one change concerns ([`Concerns`]) and
//! the notices gathered for the nodes since the last write ([`Notices`]), which the rule
//! (`plan`) turns into each node's status and the answers (`answers`) look again at.

use std::collections::BTreeSet;

use sharedresource_api::node_view::{NoticedObject, SharedResourceNodeSpec};

/// What a change concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Concerns {
    /// The pods of one namespace.
    Namespace(String),
    /// The pods of every namespace.
    EveryNamespace,
    /// The volumes that read one share or projection.
    Object(NoticedObject),
    /// The volumes that read any share or projection.
    EveryObject,
    /// Nobody: it cannot grant `use`, before or after.
    Nobody,
}

/// Notices gathered for the nodes since the last write.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Notices {
    /// A change that may concern every namespace.
    pub every_namespace: bool,
    /// The namespaces where a grant changed.
    pub namespaces: BTreeSet<String>,
    /// A change that may concern every share and projection (a relist of their watches).
    pub every_object: bool,
    /// The shares and projections that changed, as [`NoticedObject`] entries.
    pub objects: BTreeSet<String>,
}

impl Notices {
    /// Adds what `concerns` says.
    pub fn add(&mut self, concerns: Concerns) {
        match concerns {
            Concerns::Namespace(namespace) => {
                self.namespaces.insert(namespace);
            }
            Concerns::EveryNamespace => self.every_namespace = true,
            Concerns::Object(object) => {
                self.objects.insert(object.key());
            }
            Concerns::EveryObject => self.every_object = true,
            Concerns::Nobody => {}
        }
    }

    /// Adds every notice of `other`.
    pub fn extend(&mut self, other: &Notices) {
        self.every_namespace |= other.every_namespace;
        self.namespaces.extend(other.namespaces.iter().cloned());
        self.every_object |= other.every_object;
        self.objects.extend(other.objects.iter().cloned());
    }

    /// Whether a node with `spec` is to be told of these. A node that serves no namespace has
    /// no volume a grant could concern, and one that reads no object none an object's change
    /// could: it is told nothing of them, even of a change that concerns every namespace or
    /// object (the entry of one it comes to serve is written then).
    pub fn concern(&self, spec: &SharedResourceNodeSpec) -> bool {
        let serves = |namespace: &String| spec.every_namespace || spec.namespaces.contains(namespace);
        let serves_any = spec.every_namespace || !spec.namespaces.is_empty();
        let reads = |object: &String| spec.every_object || spec.objects.contains(object);
        let reads_any = spec.every_object || !spec.objects.is_empty();
        (self.every_namespace && serves_any)
            || self.namespaces.iter().any(serves)
            || (self.every_object && reads_any)
            || self.objects.iter().any(reads)
    }

    /// Whether nothing was gathered.
    pub fn is_empty(&self) -> bool {
        !self.every_namespace && self.namespaces.is_empty() && !self.every_object && self.objects.is_empty()
    }
}
