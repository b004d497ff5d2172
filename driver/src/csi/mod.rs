//! The CSI wire: the Identity and Node gRPC services, the ordered check that turns a
//! NodePublishVolume request into a volume's publish, kubelet's plugin registration (and the
//! `:authority` rewrite its grpc-go client needs), and the unix sockets they are served on.

pub mod authority_rewrite;
pub mod error;
pub mod identity;
pub mod node;
pub mod registration;
pub mod request;
pub mod socket;
