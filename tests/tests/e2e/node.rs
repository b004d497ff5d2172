//! The real node: kubelet and containerd running pods that read the driver's volumes, each
//! outcome observed from inside the container (what it wrote to its log) or as a client sees
//! the pod (its events), with the static shares as content.

use std::time::{Duration, Instant};

use inline_guard_tests::node::Node;

use crate::support::{Outcome, SHARED_RESOURCE_DRIVER, Suite};

fn node(suite: &Suite) -> Result<&Node, String> {
    suite.node.as_ref().map_err(|error| format!("the node did not start: {error}"))
}

/// 1. kubelet found the driver's registration socket, asked who it is, and registered it: the
/// CSINode object lists the driver with this node's id.
pub async fn kubelet_registers_the_driver(suite: &Suite) -> Outcome {
    let node = node(suite)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let drivers = node.csi_node_drivers(&suite.admin).await;
        if drivers.contains(&(SHARED_RESOURCE_DRIVER.to_string(), node.name().to_string())) {
            println!("CSINode {}: {drivers:?}", node.name());
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("CSINode {} lists {drivers:?} after 30 s\n{}", node.name(), node.log_tails()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
