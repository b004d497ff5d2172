//! The driver's binaries and the apiserver: the client they talk through (`client`: kube's
//! stack on connections that send each write at once, watches multiplexed over HTTP/2), the
//! rate every request takes a token of (`rate`), holding back while the apiserver is
//! overloaded (`overload`), and the one way a request is made (`request`: timed, its failure
//! told in the driver's own words).

pub mod client;
pub mod overload;
pub mod rate;
pub mod request;

#[cfg(test)]
pub mod fake;
