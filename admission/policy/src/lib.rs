//! The CSIVolumeAdmission decision core: plain data in (namespace labels, CSIDriver labels, a pod
//! spec), a verdict and a read-only patch out; the shared-resource driver's volume rules on a pod
//! spec (`shared_volumes`, `sub_path`); and the shares a pod asks for by annotation (`share_injection`). No
//! I/O, no async, no logging.
//!
//! The hosts (the in-process chain, the webhook, `check`) look facts up and pass them in; this crate
//! only decides.

pub mod driver_profile;
pub mod exemption;
pub mod labels;
pub mod level;
pub mod message;
pub mod namespace_policy;
pub mod patch;
pub mod pod_spec;
pub mod read_only;
pub mod read_only_check;
pub mod settings;
pub mod share_injection;
pub mod shared_volumes;
pub mod sub_path;
pub mod verdict;

pub use driver_profile::{DriverLabelSource, DriverProfile};
pub use exemption::Exemption;
pub use level::{Level, Mode};
pub use namespace_policy::{LabelError, NamespacePolicy};
pub use patch::PatchOperation;
pub use pod_spec::{ContainerView, CsiVolumeView, PodSpecView, VolumeMountView, VolumeView};
pub use read_only::{ContainerList, MountScope, WritablePlace, force_read_only, writable_places};
pub use read_only_check::{not_forced_message, writable_read_only_volumes};
pub use settings::{Defaults, Exemptions, PolicySettings, ReadOnlyDrivers};
pub use share_injection::{
    INJECT_ANNOTATION, InjectEntry, InjectSource, InjectionPlan, not_injected_message, parse_injection, plan_injection,
};
pub use shared_volumes::{SharedVolume, refusal_message, shared_volumes};
pub use sub_path::sub_path_warnings;
pub use verdict::{Subject, SubjectKind, Verdict, evaluate};

/// Labels as Kubernetes object metadata carries them.
pub type Labels = std::collections::BTreeMap<String, String>;
