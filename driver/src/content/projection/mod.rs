//! Projections: one read-only volume composed from several shares, pod facts and a token, with
//! the rules of kubelet's `projected` volume (items, paths, modes, collisions): the spec's
//! vocabulary and its static checks (`api`), the composition of resolved data into one payload
//! (`compose`), the downward API's rendering of pod facts (`downward`, with Go's printable table
//! in `go_printable`), and the fetching of a projection's
//! sources from the cluster, each share access-checked (`fetch`).

pub mod compose;
pub mod downward;
pub mod fetch;
pub mod go_printable;
