//! The shared-resource driver's public vocabulary, in one crate so that the driver (at mount) and
//! the admission plugin (at creation) refuse the same things with the same words: the volume
//! attributes a pod may give ([`volume_attributes`]), object names as typed values
//! ([`object_name`]), the two kinds of share ([`share_kind`]), the file-name rule every key
//! follows ([`key`]), the `SharedSecret` and `SharedConfigMap` API ([`shares`]), the
//! `SharedProjection` API with the check that needs no data ([`projection`]), the access
//! question with its refusal ([`access`]), each node's view by name ([`node_view`]) and the
//! revocations' broadcast on the notices' Lease ([`revocations`]): every
//! custom resource of the driver. Pure: no I/O, no
//! clock, no client.

pub mod access;
pub mod invalid;
pub mod key;
pub mod missing;
pub mod node_view;
pub mod object_name;
pub mod projection;
pub mod quote;
pub mod revocations;
pub mod share_kind;
pub mod shares;
pub mod volume_attributes;

pub use invalid::{Invalid, Result};
pub use object_name::{InvalidName, NamespaceName, NamespacedObject, ObjectName};
pub use share_kind::ShareKind;
pub use volume_attributes::{Selection, VolumeAttributes};

/// The CSI driver's name, as pods name it in `spec.volumes[].csi.driver`.
pub const DRIVER_NAME: &str = "sharedresource.csi.inlineguard.dev";
/// The API group of the shares and projections.
pub const API_GROUP: &str = "sharedresource.inlineguard.dev";
