//! The `SharedProjection` API: its types, from which the CRD is generated ([`spec`]), the pod
//! fields a `podInfo` source may show ([`pod_field`]), and the check that needs no data
//! ([`check`]), run by the driver before it composes a volume and by the admission plugin when
//! a projection is written.

pub mod check;
pub mod pod_field;
pub mod spec;

pub use check::check_spec;
pub use spec::{ProjectionSource, ProjectionSpec, SharedProjection};
