//! A gRPC channel to the driver's unix socket, for tests and benchmarks (feature `test-util`):
//! the one way they all reach the socket, retried while it appears.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A channel to the socket at `path`, retried for up to `patience`: the file may not exist yet,
/// or still be a killed predecessor's.
pub async fn unix_channel(path: PathBuf, patience: Duration) -> Result<Channel, String> {
    let deadline = Instant::now() + patience;
    // The URI is required by tonic and never dialled: the connector ignores it.
    let endpoint = Endpoint::from_static("http://[::]:50051");
    loop {
        let connector = {
            let path = path.clone();
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
            })
        };
        match endpoint.connect_with_connector(connector).await {
            Ok(channel) => return Ok(channel),
            Err(error) if Instant::now() > deadline => {
                return Err(format!("connecting to the driver socket {}: {error}", path.display()));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
