//! Pods flooding the webhook's port, as any pod can where no NetworkPolicy narrows it: eight
//! addresses open 40 connections each, more than the shipped 256 places, hold them idle past
//! their handshakes, and open another each time one is closed. The real apiserver, calling the
//! webhook meanwhile, must still get every answer (the fine pod admitted, the forbidden one
//! denied by the webhook), never fail the call: a newcomer from an address holding fewer takes
//! an idle connection's place (`admission/server/src/fair_share.rs`). Before that, the
//! apiserver's connection waited in the listen backlog until one of the flood's was cut off by
//! the 10 s request timeout, longer than the webhook's 5 s `timeoutSeconds`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use inline_guard_tests::repo_root;
use inline_guard_tests::webhook::{WebhookServer, register};
use serde_json::json;
use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::support::{
    Outcome, SERVICE_ACCOUNT, Suite, WEBHOOK_LABEL, create, create_csi_driver, create_namespace, pod, pods_path,
    wait_until_called,
};

/// The shipped `--max-connections`.
const SHIPPED_CONNECTIONS: usize = inline_guard_server::server::DEFAULT_MAX_CONNECTIONS;
/// The flood's addresses (as many pods), and the connections each keeps open or opening: more
/// than the places, so some always wait.
const FLOOD_ADDRESSES: usize = 8;
const FLOOD_PER_ADDRESS: usize = SHIPPED_CONNECTIONS / FLOOD_ADDRESSES + 8;
/// Pods created through the apiserver while the flood holds on, of each kind.
const CREATES: usize = 10;
/// Longer than the server's request timeout (10 s): every connection the apiserver kept alive
/// from before the flood has been closed as idle, so it must open a new one.
const PAST_THE_REQUEST_TIMEOUT: Duration = Duration::from_secs(12);

pub async fn does_not_keep_the_apiserver_out(suite: &Suite) -> Outcome {
    let admin = suite.admin.clone();
    let identity = suite.cluster.kubeconfig_as(SERVICE_ACCOUNT)?;
    let config = repo_root().join("config/admission.yaml");
    let server = WebhookServer::start(&suite.cluster, "webhook-flood", &config, &identity)?;
    let registration = register(&admin, &server, "flood", json!({"matchLabels": {WEBHOOK_LABEL: "flood"}})).await?;
    wait_until_called(&admin, "flood").await?;
    let namespace = "flood";
    create_namespace(&admin, namespace, "flood", &[("pod-security.kubernetes.io/enforce", "restricted")]).await?;
    let (forbidden, fine) = ("forbidden.flood.e2e.inlineguard.dev", "fine.flood.e2e.inlineguard.dev");
    create_csi_driver(&admin, forbidden, Some("privileged")).await?;
    create_csi_driver(&admin, fine, Some("restricted")).await?;

    let port: u16 =
        server.url.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or("the webhook's URL has no port")?;
    let connector =
        inline_guard_server::tls::connector_trusting(&[server.ca_pem.as_str()]).map_err(|e| e.to_string())?;
    let held = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = watch::channel(false);
    let mut flood = Vec::new();
    for address in 0..FLOOD_ADDRESSES {
        let source = format!("127.0.0.{}", 20 + address);
        for _ in 0..FLOOD_PER_ADDRESS {
            flood.push(tokio::spawn(hold_a_connection(
                source.clone(),
                port,
                connector.clone(),
                held.clone(),
                stopped.clone(),
            )));
        }
    }
    let result = async {
        // The flood holds every place before the apiserver needs one.
        let deadline = Instant::now() + Duration::from_secs(120);
        while held.load(Ordering::SeqCst) < SHIPPED_CONNECTIONS {
            if Instant::now() > deadline {
                return Err(format!(
                    "the flood never held every connection: {} of {SHIPPED_CONNECTIONS}",
                    held.load(Ordering::SeqCst)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(PAST_THE_REQUEST_TIMEOUT).await;
        let mut unanswered = Vec::new();
        for n in 0..CREATES {
            for (kind, driver, expected) in [("forbidden", forbidden, 403), ("fine", fine, 201)] {
                let name = format!("{kind}-{n}");
                let answer = create(&admin, &pods_path(namespace), &pod(&name, &[("v", driver)]), false).await?;
                let denied_by_the_webhook = answer.status != 403 || answer.message().contains(forbidden);
                if answer.status != expected || !denied_by_the_webhook {
                    unanswered.push(format!(
                        "{name}: {} {}",
                        answer.status,
                        answer.message().chars().take(300).collect::<String>()
                    ));
                }
            }
        }
        let holding = held.load(Ordering::SeqCst);
        println!(
            "{} creates through the apiserver while {FLOOD_ADDRESSES} addresses flooded the webhook's {SHIPPED_CONNECTIONS} connections ({holding} held at the end): {} not answered as the webhook answers",
            2 * CREATES,
            unanswered.len()
        );
        if !unanswered.is_empty() {
            return Err(format!("creates not answered by the webhook during the flood: {unanswered:?}"));
        }
        // The flood was still there: it held nearly every place at the end (the apiserver's
        // connection and those on their way back excepted).
        if holding < SHIPPED_CONNECTIONS / 2 {
            return Err(format!("the flood had let go ({holding} held): the creates proved nothing"));
        }
        Ok(())
    }
    .await;
    let _ = stop.send(true);
    for task in flood {
        let _ = task.await;
    }
    registration.remove().await?;
    drop(server);
    result
}

/// One of the flood's connections: from `source`, past its handshake, held idle until the server
/// closes it, then opened again, until `stopped`.
async fn hold_a_connection(
    source: String,
    port: u16,
    connector: TlsConnector,
    held: Arc<AtomicUsize>,
    mut stopped: watch::Receiver<bool>,
) {
    while !*stopped.borrow() {
        let connected = async {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(format!("{source}:0").parse().ok()?).ok()?;
            let tcp = socket.connect(([127, 0, 0, 1], port).into()).await.ok()?;
            connector.connect(ServerName::try_from("localhost").ok()?, tcp).await.ok()
        };
        let stream = tokio::select! {
            stream = connected => stream,
            _ = stopped.changed() => return,
        };
        let Some(mut stream) = stream else {
            // Refused or cut off before its handshake: tried again at once, as a flood would be.
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        held.fetch_add(1, Ordering::SeqCst);
        let mut buffer = [0u8; 64];
        tokio::select! {
            _ = stream.read(&mut buffer) => {}
            _ = stopped.changed() => {}
        }
        held.fetch_sub(1, Ordering::SeqCst);
    }
}
