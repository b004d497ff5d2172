//! A label change governs the next pod: the webhook's lister cache follows a CSIDriver relabel
//! and a namespace relabel through its watches. How fast is measured and printed (about 5 ms
//! here), not asserted: a busy machine may be slow. The bound only tells a watch from a relist,
//! which would come after the watch's own timeout, minutes later.

use std::time::{Duration, Instant};

use crate::support::{
    Outcome, Suite, create, create_csi_driver, create_namespace, label_csi_driver, label_namespace, pod, pods_path,
};

/// Far above any watch delivery on a loaded machine, far below the watch timeout (290 s) after
/// which a relist would have found the change without the watch.
const WITHIN: Duration = Duration::from_secs(60);

/// Creates dry-run pods until one answers `want` (403 or 201); returns how long that took.
async fn until_status(suite: &Suite, namespace: &str, driver: &str, want: u16) -> Result<Duration, String> {
    let started = Instant::now();
    let object = pod("next", &[("v", driver)]);
    loop {
        let answer = create(&suite.admin, &pods_path(namespace), &object, true).await?;
        // A 403 counts only as this webhook's denial of this driver, not any refusal.
        let denial = format!(
            "admission webhook \"pods.csi-volume-admission.inlineguard.dev\" denied the request: next uses an inline \
             volume provided by CSIDriver {driver} and namespace {namespace} has a pod security enforce level that \
             is lower than privileged"
        );
        if answer.status == want && (want != 403 || answer.message() == denial) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > WITHIN {
            return Err(format!(
                "still {} ({}) after {:?}, waiting for {want}",
                answer.status,
                answer.message(),
                started.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// restricted → privileged on the driver: the next pod in a restricted namespace is denied.
pub async fn driver_relabel(suite: &Suite) -> Outcome {
    let namespace = "relabel-driver";
    let driver = "relabelled.e2e.inlineguard.dev";
    create_namespace(&suite.admin, namespace, "shared", &[("pod-security.kubernetes.io/enforce", "restricted")])
        .await?;
    create_csi_driver(&suite.admin, driver, Some("restricted")).await?;
    until_status(suite, namespace, driver, 201).await?;

    label_csi_driver(&suite.admin, driver, "privileged").await?;
    let took = until_status(suite, namespace, driver, 403).await?;
    println!("CSIDriver relabel governed the next pod after {took:?}");
    Ok(())
}

/// privileged → restricted on the namespace: the next pod using a privileged driver is denied;
/// and back, admitted again.
pub async fn namespace_relabel(suite: &Suite) -> Outcome {
    let namespace = "relabel-namespace";
    let driver = "namespace-relabel.e2e.inlineguard.dev";
    let key = "pod-security.kubernetes.io/enforce";
    create_namespace(&suite.admin, namespace, "shared", &[(key, "privileged")]).await?;
    create_csi_driver(&suite.admin, driver, Some("privileged")).await?;
    until_status(suite, namespace, driver, 201).await?;

    label_namespace(&suite.admin, namespace, key, Some("restricted")).await?;
    let tightened = until_status(suite, namespace, driver, 403).await?;
    label_namespace(&suite.admin, namespace, key, None).await?;
    let loosened = until_status(suite, namespace, driver, 201).await?;
    println!("namespace relabel governed the next pod after {tightened:?} (tightened), {loosened:?} (label removed)");
    Ok(())
}
