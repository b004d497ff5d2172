//! The shipped manifests on the real apiserver: RBAC that grants exactly what each component
//! needs, the read-grants controller, and every object of `config/` passing a server-side dry run.

pub mod dry_run;
pub mod flow_control;
pub mod node_writes;
pub mod rbac;
pub mod read_grants;
