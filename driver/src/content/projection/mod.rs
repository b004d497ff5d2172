//! Projections: one read-only volume composed from several shares, pod facts and a token, with
//! the rules of kubelet's `projected` volume (items, paths, modes, collisions). This room holds
//! the pure core so far: the spec's vocabulary, its static checks, the composition of resolved
//! data into one payload, and the downward API's rendering of pod facts. Fetching the sources
//! (access checks, the `SharedProjection` CRD, tokens from kubelet) is not wired yet.

pub mod api;
pub mod compose;
pub mod downward;
pub mod fetch;
pub mod go_printable;
pub mod tokens;
