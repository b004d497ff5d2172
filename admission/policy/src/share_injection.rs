//! Share injection: a pod annotated `sharedresource.inlineguard.dev/inject:
//! "<kind>/<name>:<mountPath>[,...]"` gets, for each share or projection it names, a read-only
//! inline volume of the shared-resource driver and a read-only mount of it in every container and
//! init container. The annotation is read once into typed entries ([`annotation`]); a plan says
//! what the spec lacks, or why it cannot take the entries ([`plan`]); applying the plan changes
//! the spec and returns the same change as JSON Patch. Pure, like the rest of the core.

pub mod annotation;
pub mod plan;

pub use annotation::{INJECT_ANNOTATION, InjectEntry, InjectSource, parse_injection};
pub use plan::{InjectedMount, InjectedVolume, InjectionPlan, not_injected_message, plan_injection};

#[cfg(test)]
mod tests;
