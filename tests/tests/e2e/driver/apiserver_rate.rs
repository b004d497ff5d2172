//! The driver's apiserver rate, seen by the apiserver: requests sent all at once through the
//! driver's client stack, with a bucket of 2 a second and a burst of 1, reach the apiserver
//! spread over the 2 s the bucket spaces them by (its audit log's receive times, not the
//! client's clock); sent without the limit, they arrive within milliseconds.

use std::time::{Duration, Instant};

use sharedresource_csi_driver::apiserver_client::ApiserverClients;
use sharedresource_csi_driver::apiserver_rate::RateLayer;

use crate::support::{Outcome, Suite};

/// Whom the requests act as: a name no other scenario uses, so the audit log's events of it
/// are exactly these requests.
const PROBE: &str = "system:serviceaccount:rate-probe:driver";
const REQUESTS: usize = 5;

pub async fn the_drivers_requests_keep_to_its_rate(suite: &Suite) -> Outcome {
    let config = suite.cluster.config_as(PROBE, &["system:authenticated"]).await?;
    let clients = ApiserverClients::new(config, RateLayer::new(2, 1)).map_err(|e| e.to_string())?;
    // A share: the suite's audit policy logs every request for one.
    let shares =
        kube::Api::<kube::api::DynamicObject>::all_with(clients.requests.clone(), &crate::shares::shared_secrets());
    // One request first, of another name (not counted below): it opens the connection and takes
    // the burst's token, so the measured ones pay no handshake and each waits for its token.
    let _ = shares.get_opt("rate-probe-warm-up").await;
    // All at once: only the bucket spaces them. Each is refused (the probe may read nothing),
    // which the apiserver logs like any other request.
    let sent = futures_util::future::join_all((0..REQUESTS).map(|_| shares.get_opt("rate-probe"))).await;
    if sent.iter().any(|answer| !matches!(answer, Err(kube::Error::Api(status)) if status.code == 403)) {
        return Err(format!("expected {REQUESTS} refusals (403) of the probe's reads, got {sent:?}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let received = loop {
        let mut received: Vec<f64> = suite
            .cluster
            .audit_events()?
            .iter()
            .filter(|event| event.acting_user() == PROBE && event.stage == "ResponseComplete")
            .filter(|event| event.object_ref.as_ref().is_some_and(|object| object.name == "rate-probe"))
            .map(|event| seconds_of_day(&event.request_received_timestamp))
            .collect::<Result<_, _>>()?;
        if received.len() >= REQUESTS || Instant::now() > deadline {
            received.sort_by(f64::total_cmp);
            break received;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if received.len() != REQUESTS {
        return Err(format!("the audit log shows {} requests of the probe, expected {REQUESTS}", received.len()));
    }
    // A token every 0.5 s: the five were sent 2 s apart from first to last. Each one's way to
    // the apiserver takes its own time (on a busy machine, tens of milliseconds apart), so the
    // spread is asked to be over 1.5 s, never exactly 2; without the limit it is milliseconds.
    let gaps: Vec<f64> = received.windows(2).map(|pair| pair[1] - pair[0]).collect();
    let spread = received[REQUESTS - 1] - received[0];
    if spread < 1.5 {
        return Err(format!(
            "{REQUESTS} requests reached the apiserver within {spread:.3} s (gaps {gaps:?} s), not spread over 2 s"
        ));
    }
    println!(
        "apiserver rate: {REQUESTS} requests sent at once arrived over {spread:.2} s, {gaps:.2?} s apart (2 a second, burst 1)"
    );
    Ok(())
}

/// `2026-11-29T08:40:01.123456Z` as seconds since that day's midnight (a run never spans one:
/// the five requests take two seconds).
fn seconds_of_day(timestamp: &str) -> Result<f64, String> {
    let unreadable = || format!("an audit timestamp that is not RFC 3339 UTC: {timestamp:?}");
    let time = timestamp.split_once('T').and_then(|(_, time)| time.strip_suffix('Z')).ok_or_else(unreadable)?;
    let parts: Vec<f64> = time.split(':').map(str::parse).collect::<Result<_, _>>().map_err(|_| unreadable())?;
    match parts[..] {
        [hours, minutes, seconds] => Ok(hours * 3600.0 + minutes * 60.0 + seconds),
        _ => Err(unreadable()),
    }
}
