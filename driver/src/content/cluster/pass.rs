//! One refresh pass's shared answers: the volumes of a pass that ask the same question (a share,
//! an access check, a backing object, a projection) get one answer, asked once; and what the
//! pass saw of each share, for its status. Keyed by the vocabulary crate's checked names.

use std::collections::HashMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use sharedresource_api::ShareKind;
use sharedresource_api::access::AccessQuestion;
use sharedresource_api::object_name::{NamespaceName, ObjectName};
use sharedresource_api::projection::spec::ProjectionSpec;
use sharedresource_api::shares::ObjectRef;

use crate::content::payload::Payload;

/// A share found: the object it names and the conditions it reports.
pub type Found = (ObjectRef, Vec<Condition>);
/// What a pass saw of a share, by share: the object it names, the conditions it reports, and
/// whether that object was read.
pub type SeenShares = HashMap<(ShareKind, String), (ObjectRef, Vec<Condition>, Seen)>;

/// What a pass saw of a share's backing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Read.
    Read,
    /// It does not exist.
    Missing,
    /// It could not be read; why.
    Unreadable(String),
}

/// Answers shared by the volumes of one refresh pass.
#[derive(Default)]
pub struct Pass {
    /// Shares by kind and name, `None` when absent.
    pub shares: HashMap<(ShareKind, ObjectName), Option<Found>>,
    /// Access answers.
    pub access: HashMap<AccessQuestion, bool>,
    /// Backing objects' files by the share's kind, namespace and name, `None` when absent.
    pub backing: HashMap<(ShareKind, NamespaceName, ObjectName), Option<Payload>>,
    /// Projections by namespace and name, `None` when absent.
    pub projections: HashMap<(NamespaceName, ObjectName), Option<ProjectionSpec>>,
    /// What the pass saw of each share (written to the shares' status when it ends).
    pub seen: SeenShares,
}
