//! The driver's apiserver rate, seen by the apiserver: requests sent all at once through the
//! driver's client stack, with a bucket of 2 a second and a burst of 1 (taken by a warm-up
//! request first), reach the apiserver the last at least 2.5 s after the warm-up was sent (the
//! audit log's receive time, on the machine's clock); without the limit, within milliseconds.

use std::time::{Duration, Instant};

use sharedresource_csi_driver::apiserver::client::ApiserverClients;
use sharedresource_csi_driver::apiserver::rate::RateLayer;

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
    // The apiserver runs on this machine, on the same clock: its receive times compare with
    // this one, taken before the warm-up takes its token.
    let started = now_of_day();
    let _ = shares.get_opt("rate-probe-warm-up").await;
    // All at once: only the bucket spaces them. Each is refused (the probe may read nothing),
    // which the apiserver logs like any other request.
    let sent = futures_util::future::join_all((0..REQUESTS).map(|_| shares.get_opt("rate-probe"))).await;
    if sent.iter().any(|answer| !matches!(answer, Err(kube::Error::Api(status)) if status.code == 403)) {
        return Err(format!("expected {REQUESTS} refusals (403) of the probe's reads, got {sent:?}"));
    }
    // Polled on a condition (the log is written after the answers), never a fixed wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (warm_up, received) = loop {
        let events = suite.cluster.audit_events()?;
        let arrivals = |name: &str| -> Result<Vec<f64>, String> {
            let mut times: Vec<f64> = events
                .iter()
                .filter(|event| event.acting_user() == PROBE && event.stage == "ResponseComplete")
                .filter(|event| event.object_ref.as_ref().is_some_and(|object| object.name == name))
                .map(|event| seconds_of_day(&event.request_received_timestamp))
                .collect::<Result<_, _>>()?;
            times.sort_by(f64::total_cmp);
            Ok(times)
        };
        let (warm_up, received) = (arrivals("rate-probe-warm-up")?, arrivals("rate-probe")?);
        if (warm_up.len() == 1 && received.len() >= REQUESTS) || Instant::now() > deadline {
            break (warm_up, received);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if warm_up.len() != 1 || received.len() != REQUESTS {
        return Err(format!(
            "the audit log shows {} warm-up and {} measured requests of the probe, expected 1 and {REQUESTS}",
            warm_up.len(),
            received.len()
        ));
    }
    // The warm-up took the burst's token after `started`, leaving the bucket empty, so the last
    // of the five could go no sooner than 5 tokens (2.5 s) after `started`: that is a lower
    // bound a slow machine only adds to. Without the limit it is milliseconds. (10 ms for the
    // log's microsecond rounding.)
    let gaps: Vec<f64> = received.windows(2).map(|pair| pair[1] - pair[0]).collect();
    let spread = received[REQUESTS - 1] - started;
    if spread < 2.49 {
        return Err(format!(
            "the last of {REQUESTS} requests reached the apiserver {spread:.3} s after the warm-up was sent (gaps \
             {gaps:?} s), not 2.5 s or more"
        ));
    }
    println!(
        "apiserver rate: {REQUESTS} requests sent at once, the last {spread:.2} s after the warm-up was sent, {gaps:.2?} s apart (2 a second, burst 1)"
    );
    Ok(())
}

/// Now, as seconds since this UTC day's midnight (the form [`seconds_of_day`] reads).
fn now_of_day() -> f64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (since_epoch.as_secs() % 86_400) as f64 + f64::from(since_epoch.subsec_nanos()) / 1e9
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
