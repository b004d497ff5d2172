//! Every request the driver's binaries make passes through [`ask`]: it is given up after the
//! request timeout, so one stalled call cannot hold a volume (or, through it, any other) for
//! longer; and its failure is told in the driver's own words ([`RequestFailed`], which the
//! content layer reads as `Unavailable`). The apiserver's text can name
//! the driver's ServiceAccount and the RBAC rule it lacks: that goes to the driver's log
//! (bounded), never into the error kubelet turns into the pod's event.

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use crate::quote::Logged;

/// How long one request may take unless configured (`requestTimeoutSeconds`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A request the apiserver did not answer, or not in time: what was asked and how it failed, in
/// general terms (never the apiserver's own message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RequestFailed(pub String);

/// `call`'s answer, or why it failed, saying what was asked and how in general terms.
/// `what` describes the request ("reading SharedSecret \"db\""), from validated names and
/// quoted input only; it is built only when the request fails.
pub async fn ask<T>(
    timeout: Duration,
    what: impl FnOnce() -> String,
    call: impl Future<Output = std::result::Result<T, kube::Error>>,
) -> Result<T, RequestFailed> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => {
            let what = what();
            warn!(request = %Logged(&what), error = %Logged(&error), "the apiserver request failed");
            Err(RequestFailed(format!("{what}: {}; the driver's log has the details", in_general(&error))))
        }
        Err(_) => {
            let what = what();
            warn!(request = %Logged(&what), ?timeout, "the apiserver did not answer in time; the request was given up");
            Err(RequestFailed(format!("{what}: the apiserver did not answer within {} s", timeout.as_secs_f64())))
        }
    }
}

/// What may be said of `error` to the pod's owner: the HTTP code and the apiserver's one-word
/// reason, or that it could not be reached; never its message.
fn in_general(error: &kube::Error) -> String {
    match error {
        // kube's reason when the body was not a Status (a 429's text, a proxy's page) is its own
        // words, not the apiserver's: only the code is told then.
        kube::Error::Api(status) if status.reason == "Failed to parse error data" => {
            format!("the apiserver answered HTTP {}", status.code)
        }
        kube::Error::Api(status) => {
            let reason: String = status.reason.chars().filter(char::is_ascii_alphanumeric).take(64).collect::<String>();
            if reason.is_empty() {
                format!("the apiserver answered HTTP {}", status.code)
            } else {
                format!("the apiserver answered HTTP {} {reason}", status.code)
            }
        }
        kube::Error::SerdeError(_) => "the apiserver's answer could not be decoded".into(),
        _ => "the apiserver could not be reached".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_never_answers_is_given_up_at_the_timeout() {
        let never = std::future::pending::<std::result::Result<(), kube::Error>>();
        let error = ask(Duration::from_millis(20), || "reading SharedSecret \"db\"".into(), never).await.unwrap_err();
        assert_eq!(
            error,
            RequestFailed("reading SharedSecret \"db\": the apiserver did not answer within 0.02 s".into())
        );
    }

    #[tokio::test]
    async fn the_apiserver_s_message_never_reaches_the_error() {
        let status = kube::core::Status::failure(
            "sharedsecrets.sharedresource.inlineguard.dev \"x\" is forbidden: User \"system:serviceaccount:inline-guard-driver:sharedresource-csi-driver\" cannot get resource",
            "Forbidden",
        )
        .with_code(403);
        let refused = async { Err::<(), _>(kube::Error::Api(Box::new(status))) };
        let error = ask(DEFAULT_REQUEST_TIMEOUT, || "reading SharedSecret \"x\"".into(), refused).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "reading SharedSecret \"x\": the apiserver answered HTTP 403 Forbidden; the driver's log has the details"
        );
    }

    #[tokio::test]
    async fn an_answer_that_was_no_status_is_told_by_its_code_alone() {
        let status =
            kube::core::Status::failure("Too many requests, please try again later.\n", "Failed to parse error data")
                .with_code(429);
        let refused = async { Err::<(), _>(kube::Error::Api(Box::new(status))) };
        let error = ask(DEFAULT_REQUEST_TIMEOUT, || "asking".into(), refused).await.unwrap_err();
        assert_eq!(error.to_string(), "asking: the apiserver answered HTTP 429; the driver's log has the details");
    }
}
