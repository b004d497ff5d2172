//! Every cell of the enforce, warn and audit tables, observed the way a client and a cluster
//! admin observe them: the apiserver's denial, the `Warning` headers of the create response, and
//! the audit annotations in the apiserver's audit log.

use crate::support::{
    Outcome, POD_WEBHOOK, Suite, annotations_from, audit_event, create, create_csi_driver, create_namespace, denied_by,
    pod, pods_path, violation,
};

const LEVELS: [&str; 3] = ["privileged", "baseline", "restricted"];

/// `restricted` < `baseline` < `privileged`.
fn permissiveness(level: &str) -> usize {
    LEVELS.len() - 1 - LEVELS.iter().position(|l| *l == level).unwrap_or(0)
}

/// What one cell should look like to a client and in the audit log.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    message: String,
    warnings: Vec<String>,
    annotations: Vec<(String, String)>,
}

/// Runs the 3 × 3 table of `mode`: a namespace per level with only that mode's label set, a
/// driver per profile, one pod per cell.
pub async fn table(suite: &Suite, mode: &str) -> Outcome {
    let admin = &suite.admin;
    for profile in LEVELS {
        create_csi_driver(admin, &format!("{profile}.{mode}.table.e2e.inlineguard.dev"), Some(profile)).await?;
    }
    let mut mismatches = Vec::new();
    for level in LEVELS {
        let namespace = format!("table-{mode}-{level}");
        let label = format!("pod-security.kubernetes.io/{mode}");
        create_namespace(admin, &namespace, "shared", &[(label.as_str(), level)]).await?;
        for profile in LEVELS {
            let driver = format!("{profile}.{mode}.table.e2e.inlineguard.dev");
            let name = format!("uses-{profile}");
            let answer = create(admin, &pods_path(&namespace), &pod(&name, &[("v", &driver)]), false).await?;
            let event = audit_event(&suite.cluster, "pods", &namespace, &name).await?;
            let seen = Seen {
                status: answer.status,
                message: answer.message().to_string(),
                warnings: answer.warnings.clone(),
                annotations: annotations_from(&event, POD_WEBHOOK),
            };

            let message = violation(&name, &driver, &namespace, mode, profile);
            let violates = permissiveness(profile) > permissiveness(level);
            let expected = match (mode, violates) {
                ("enforce", true) => Seen {
                    status: 403,
                    message: denied_by(POD_WEBHOOK, &message),
                    warnings: vec![],
                    annotations: vec![("enforce-violations".into(), message)],
                },
                ("warn", true) => {
                    Seen { status: 201, message: String::new(), warnings: vec![message], annotations: vec![] }
                }
                ("audit", true) => Seen {
                    status: 201,
                    message: String::new(),
                    warnings: vec![],
                    annotations: vec![("audit-violations".into(), message)],
                },
                _ => Seen { status: 201, message: String::new(), warnings: vec![], annotations: vec![] },
            };
            if seen != expected {
                mismatches
                    .push(format!("{mode} {level} × driver {profile}:\n  expected {expected:?}\n  seen     {seen:?}"));
            } else {
                println!("{mode:>7} namespace {level:<10} × driver {profile:<10} → {}", describe(&seen));
            }
        }
    }
    if mismatches.is_empty() { Ok(()) } else { Err(mismatches.join("\n")) }
}

fn describe(seen: &Seen) -> &'static str {
    match (seen.status, seen.warnings.is_empty(), seen.annotations.is_empty()) {
        (403, _, _) => "denied (403) + enforce-violations",
        (_, false, _) => "admitted with a warning",
        (_, _, false) => "admitted, audit-violations annotated",
        _ => "admitted silently",
    }
}
