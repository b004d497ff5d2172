//! A CSIDriver and the objects using it created back to back, as a Helm chart does: the webhook
//! must decide on the driver's real label, not on what its cache held a moment before.

use crate::support::{
    Outcome, POD_WEBHOOK, Suite, create, create_csi_driver, create_namespace, denied_by, deployment, deployments_path,
    pod, pods_path, violation,
};

/// Under the OpenShift-compatible configuration an unknown driver counts as privileged and an
/// unlabelled namespace as restricted, so a cache that has not seen the new `restricted` driver
/// would deny (or warn about) objects that are fine.
pub async fn no_spurious_violation(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let namespace = "cold-cache-openshift";
    create_namespace(admin, namespace, "openshift", &[]).await?;
    let mut wrong = Vec::new();
    for round in 0..5 {
        let driver = format!("fresh-{round}.cold-cache.e2e.inlineguard.dev");
        create_csi_driver(admin, &driver, Some("restricted")).await?;
        let workload = create(
            admin,
            &deployments_path(namespace),
            &deployment(&format!("chart-{round}"), &[("v", &driver)]),
            false,
        )
        .await?;
        let direct =
            create(admin, &pods_path(namespace), &pod(&format!("direct-{round}"), &[("v", &driver)]), false).await?;
        for (what, answer) in [("deployment", workload), ("pod", direct)] {
            if answer.status != 201 || !answer.warnings.is_empty() {
                wrong.push(format!(
                    "round {round} {what}: {} {:?} {}",
                    answer.status,
                    answer.warnings,
                    answer.message()
                ));
            }
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(format!("spurious violations from a cold cache:\n{}", wrong.join("\n"))) }
}

/// The other direction under the shipped default (an unknown driver counts as restricted): a new
/// `privileged` driver must be denied in a restricted namespace on its very first use.
pub async fn no_spurious_admission(suite: &Suite) -> Outcome {
    let admin = &suite.admin;
    let namespace = "cold-cache-default";
    create_namespace(admin, namespace, "shared", &[("pod-security.kubernetes.io/enforce", "restricted")]).await?;
    let mut wrong = Vec::new();
    for round in 0..5 {
        let driver = format!("fresh-{round}.privileged.cold-cache.e2e.inlineguard.dev");
        create_csi_driver(admin, &driver, Some("privileged")).await?;
        let name = format!("first-use-{round}");
        let answer = create(admin, &pods_path(namespace), &pod(&name, &[("v", &driver)]), false).await?;
        let expected = denied_by(POD_WEBHOOK, &violation(&name, &driver, namespace, "enforce", "privileged"));
        if answer.status != 403 || answer.message() != expected {
            wrong.push(format!("round {round}: {} {}", answer.status, answer.message()));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("a cold cache let privileged drivers in:\n{}", wrong.join("\n")))
    }
}
