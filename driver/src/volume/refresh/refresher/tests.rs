//! The refresher with a content source that can be made to hang for one volume: the other
//! volumes' revocations go ahead, and the hung volume can be unpublished meanwhile.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Condvar;
use std::time::Instant;

use super::*;
use crate::content::ContentSource;
use crate::content::ask::{PodInfo, VolumeAsk};
use crate::content::error::{Error as ContentError, Result};
use crate::content::payload::{FileContent, Payload};
use crate::metrics::Metrics;
use crate::volume::checked::{Publish, Unpublish};
use crate::volume::mounter::FakeMounter;
use crate::volume::refresh::pod_events::{NoEvents, PodEvent};
use crate::volume::service::VolumeSettings;
use crate::volume::store::FileVolumeStore;
use crate::volume::target_path::TargetPath;

/// Content per share name; a share in `held` blocks its fetch until released, then answers what
/// was set when the fetch started.
#[derive(Default)]
struct Gated {
    answers: Mutex<HashMap<String, Result<Payload>>>,
    held: Mutex<HashSet<String>>,
    waiting: Mutex<usize>,
    released: Condvar,
    changes: Arc<Changes>,
}

impl Gated {
    fn answer(&self, share: &str, answer: Result<Payload>) {
        self.answers.lock().unwrap().insert(share.to_string(), answer);
    }

    fn hold(&self, share: &str) {
        self.held.lock().unwrap().insert(share.to_string());
    }

    fn release(&self) {
        self.held.lock().unwrap().clear();
        self.released.notify_all();
    }

    fn waiting(&self) -> usize {
        *self.waiting.lock().unwrap()
    }
}

impl Gated {
    fn content(&self, request: &VolumeAsk) -> Result<Payload> {
        let share = request.attributes.get("share").cloned().unwrap_or_default();
        // Answered as things stood when the fetch started, as an apiserver answers.
        let answer = self
            .answers
            .lock()
            .unwrap()
            .get(&share)
            .cloned()
            .unwrap_or_else(|| Err(ContentError::Unavailable("none".into())));
        let mut held = self.held.lock().unwrap();
        if held.contains(&share) {
            *self.waiting.lock().unwrap() += 1;
            while held.contains(&share) {
                held = self.released.wait(held).unwrap();
            }
            *self.waiting.lock().unwrap() -= 1;
        }
        drop(held);
        answer
    }
}

impl ContentSource for Gated {
    fn ready(&self) -> bool {
        true
    }

    fn open(&self, ask: &VolumeAsk, _: crate::content::Opening) -> Result<crate::content::Opened> {
        self.content(ask).map(crate::content::Opened::files)
    }

    fn changes(&self) -> Option<Arc<Changes>> {
        Some(self.changes.clone())
    }
}

/// Releases every held fetch when a test ends, failed or not: a blocking task left waiting
/// would hold the runtime's shutdown forever.
struct ReleaseOnDrop(Arc<Gated>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// A publish of pod `pod`'s volume, as the CSI layer's check makes it.
fn publish(root: &Path, pod: &str) -> Publish {
    publish_in(root, pod, "apps", "web")
}

/// A publish of pod `pod`'s volume, the pod in `namespace` running as `account`.
fn publish_in(root: &Path, pod: &str, namespace: &str, account: &str) -> Publish {
    let pod_info =
        PodInfo { name: pod.into(), namespace: namespace.into(), uid: pod.into(), service_account: account.into() };
    let target = TargetPath::parse(&target(root, pod).to_string_lossy(), root).unwrap();
    Publish {
        mount_group: None,
        mount_flags: Vec::new(),
        ask: VolumeAsk {
            volume_id: format!("csi-{pod}"),
            volume_name: target.volume_name().to_string(),
            mount_point: target.as_path().to_path_buf(),
            pod: pod_info,
            attributes: [("share".to_string(), pod.to_string())].into(),
            tokens: Default::default(),
            secrets: Default::default(),
            object_versions: Default::default(),
        },
        target,
    }
}

fn target(root: &Path, pod: &str) -> PathBuf {
    root.join("pods").join(pod).join("volumes/kubernetes.io~csi/shared/mount")
}

fn secret(value: &str) -> Payload {
    [("password".to_string(), FileContent::new(value.as_bytes()))].into()
}

/// A Node service under `root` with a fake mounter and `source`, counting into `metrics`.
fn node_over(root: &Path, source: Arc<Gated>, metrics: Arc<Metrics>) -> Arc<NodeService> {
    Arc::new(
        NodeService::new(
            "node-1".into(),
            VolumeSettings::for_tests(root.into(), false),
            Arc::new(FakeMounter::default()),
            Arc::new(FileVolumeStore::open(root.join("state")).unwrap()),
            source,
            Vec::new(),
        )
        .with_metrics(metrics),
    )
}

/// How many refreshes ended with `result` (changed, unchanged, failed).
fn refreshes(metrics: &Metrics, result: &str) -> u64 {
    let line = format!("sharedresource_csi_driver_refreshes_total{{result=\"{result}\"}} ");
    let text = metrics.encode();
    text.lines().find_map(|l| l.strip_prefix(line.as_str())).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// Polls `done` until it holds; a bound far above any machine's pace, never a timing claim.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_volume_delays_no_other_volumes_revocation_and_can_be_unpublished() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let source = Arc::new(Gated::default());
    let metrics = Arc::new(Metrics::new());
    let node = node_over(root, source.clone(), metrics.clone());
    for pod in ["stuck", "other"] {
        source.answer(pod, Ok(secret("s3cret")));
        node.publish(&publish(root, pod)).unwrap();
    }
    let (stop, stopped) = watch::channel(false);
    let refresher =
        tokio::spawn(run(node.clone(), source.clone(), Duration::from_secs(3600), stopped, Arc::new(NoEvents)));

    // One volume's source hangs; the other's access is revoked.
    let password = target(root, "other").join("password");
    assert!(password.exists(), "the positive control: the file is there before the revocation");
    source.hold("stuck");
    let _release = ReleaseOnDrop(source.clone());
    source.answer("other", Err(ContentError::Denied("revoked".into())));
    source.changes.everything();
    eventually("the stuck volume's fetch started", || source.waiting() == 1).await;
    eventually("the other volume was emptied", || !password.exists()).await;
    assert!(target(root, "other").is_dir(), "emptied, still there");
    assert_eq!(source.waiting(), 1, "while the stuck volume's fetch still hangs");

    // The hung volume's pod goes away: unpublish does not wait for its fetch.
    let unpublish = node.clone();
    let stuck = Unpublish {
        volume_id: "csi-stuck".into(),
        target: TargetPath::parse(&target(root, "stuck").to_string_lossy(), root).unwrap(),
    };
    tokio::task::spawn_blocking(move || unpublish.unpublish(&stuck))
        .await
        .unwrap()
        .expect("unpublished while the refresh's fetch hangs");
    assert_eq!(source.waiting(), 1, "the fetch was still hanging when unpublish answered");
    assert_eq!(node.volume_ids_where(|_| true), ["csi-other"], "the stuck volume is no longer published");
    // Published again meanwhile with other arguments (another share): the late answer is the
    // old publish's and must not be written into the new one.
    let mut again = publish(root, "stuck");
    again.ask.attributes.insert("share".into(), "stuck-again".into());
    source.answer("stuck-again", Ok(secret("republished")));
    let republish = node.clone();
    tokio::task::spawn_blocking(move || republish.publish(&again)).await.unwrap().unwrap();
    let stuck_password = target(root, "stuck").join("password");
    assert_eq!(std::fs::read_to_string(&stuck_password).unwrap(), "republished");

    // Released, the late answer finds the volume published otherwise and writes nothing (the
    // fake mounter leaves the files it never really mounted: the version they are at must not
    // move).
    let version = std::fs::read_link(target(root, "stuck").join("..data")).ok();
    assert!(version.is_some(), "the positive control: the version link is there");
    source.answer("stuck", Ok(secret("changed")));
    let unchanged = refreshes(&metrics, "unchanged");
    source.release();
    // The late refresh has ended once it is counted (as unchanged: it wrote nothing).
    eventually("the late refresh ended", || refreshes(&metrics, "unchanged") == unchanged + 1).await;
    assert_eq!(std::fs::read_link(target(root, "stuck").join("..data")).ok(), version, "nothing was written");
    assert_eq!(std::fs::read_to_string(&stuck_password).unwrap(), "republished");
    let _ = stop.send(true);
    refresher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_during_a_refresh_refreshes_the_volume_again_afterwards() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let source = Arc::new(Gated::default());
    let node = web_published(root, &source);
    let refresher = Refresher::new(node.clone(), Arc::new(NoEvents));
    source.hold("web");
    let _release = ReleaseOnDrop(source.clone());
    refresher.dispatch(&Pending::everything());
    eventually("the first refresh's fetch started", || source.waiting() == 1).await;
    // A revocation arrives while that fetch (which will answer with the old content) hangs: the
    // volume is marked to be refreshed again, not refreshed twice at once.
    refresher.dispatch(&Pending::everything());
    let marked = refresher.in_flight.lock().unwrap().again.contains_key("csi-web");
    assert!(marked, "the second change was noted against the running refresh");
    source.answer("web", Err(ContentError::Missing("gone".into())));
    source.release();
    let password = target(root, "web").join("password");
    eventually("the volume was refreshed again and emptied", || !password.exists()).await;
    eventually("the refresher let go of the volume", || refresher.in_flight.lock().unwrap().running.is_empty()).await;
}

/// A node where one tenant's ten volumes hang in their fetches (more than the refresher has
/// slots in a lane), and a victim's volume in another namespace: the victim's content and the
/// refresher.
async fn hung_tenant_and_a_victim(root: &Path, source: &Arc<Gated>) -> (Arc<NodeService>, Refresher) {
    let node = node_over(root, source.clone(), Arc::new(Metrics::new()));
    let slow: Vec<String> = (0..10).map(|n| format!("slow-{n}")).collect();
    for pod in &slow {
        source.answer(pod, Ok(secret("tenant")));
        node.publish(&publish_in(root, pod, "tenant", "slow")).unwrap();
    }
    source.answer("victim", Ok(secret("one")));
    node.publish(&publish_in(root, "victim", "victim", "reader")).unwrap();
    let refresher = Refresher::new(node.clone(), Arc::new(NoEvents));
    for pod in &slow {
        source.hold(pod);
    }
    let tenant =
        Pending { shares: slow.iter().map(|pod| ("share".to_string(), pod.clone())).collect(), ..Pending::default() };
    refresher.dispatch(&tenant);
    let half = CONCURRENT_REFRESHES / 2;
    eventually("the tenant's fetches hold their part of the slots", || source.waiting() == half).await;
    (node, refresher)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_s_hung_volumes_leave_the_slots_another_namespace_needs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let source = Arc::new(Gated::default());
    let (_node, refresher) = hung_tenant_and_a_victim(root, &source).await;
    let _release = ReleaseOnDrop(source.clone());
    let password = target(root, "victim").join("password");
    assert_eq!(std::fs::read_to_string(&password).unwrap(), "one", "the positive control: the first content");
    source.answer("victim", Ok(secret("two")));
    refresher.dispatch(&Pending { shares: [("share".to_string(), "victim".to_string())].into(), ..Pending::default() });
    eventually("the victim's update was written", || std::fs::read_to_string(&password).is_ok_and(|s| s == "two"))
        .await;
    assert_eq!(source.waiting(), CONCURRENT_REFRESHES / 2, "while the tenant's fetches still hang, no more of them");
    assert_eq!(refresher.content_slots.held_by("tenant"), CONCURRENT_REFRESHES / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_never_waits_behind_other_volumes_refreshes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let source = Arc::new(Gated::default());
    let (_node, refresher) = hung_tenant_and_a_victim(root, &source).await;
    let _release = ReleaseOnDrop(source.clone());
    // Every content slot is taken: other namespaces' slow volumes hold the rest (one namespace
    // may hold only half of what the others leave, so it takes several).
    let others: Vec<String> = (0..CONCURRENT_REFRESHES).map(|n| format!("other-{n}")).collect();
    let held: Vec<_> = others.iter().filter_map(|namespace| refresher.content_slots.try_acquire(namespace)).collect();
    assert!(refresher.content_slots.try_acquire("victim").is_none(), "the positive control: no content slot is free");
    let password = target(root, "victim").join("password");
    assert!(password.exists(), "the positive control: the file is there before the revocation");
    source.answer("victim", Err(ContentError::Denied("revoked".into())));
    let grant_changed = Pending {
        accounts: [crate::content::changes::Accounts::One("victim".into(), "reader".into())].into(),
        ..Pending::default()
    };
    refresher.dispatch(&grant_changed);
    eventually("the victim's volume was emptied", || !password.exists()).await;
    drop(held);
}

/// A node with pod `web`'s volume published, its content "one".
fn web_published(root: &Path, source: &Arc<Gated>) -> Arc<NodeService> {
    let node = node_over(root, source.clone(), Arc::new(Metrics::new()));
    source.answer("web", Ok(secret("one")));
    node.publish(&publish(root, "web")).unwrap();
    node
}

/// The Events the refresher told, in order.
#[derive(Default)]
struct Told(Mutex<Vec<PodEvent>>);

impl PodEvents for Told {
    fn tell(&self, event: PodEvent) {
        self.0.lock().unwrap().push(event);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_is_told_of_new_content_and_of_an_update_that_could_not_be_applied() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let source = Arc::new(Gated::default());
    let node = web_published(root, &source);
    let told = Arc::new(Told::default());
    let refresher = Refresher::new(node.clone(), told.clone());
    let password = target(root, "web").join("password");

    source.answer("web", Ok(secret("two")));
    refresher.dispatch(&Pending::everything());
    eventually("the update was written", || std::fs::read_to_string(&password).is_ok_and(|s| s == "two")).await;
    eventually("the refresher let go of the volume", || refresher.in_flight.lock().unwrap().running.is_empty()).await;
    source.answer("web", Err(ContentError::Unavailable("the apiserver did not answer within 10 s".into())));
    refresher.dispatch(&Pending::everything());
    eventually("the failure was told", || told.0.lock().unwrap().len() == 2).await;

    let told = told.0.lock().unwrap();
    let pod = &told[0].pod;
    assert_eq!((pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()), ("apps", "web", "web"));
    assert_eq!((told[0].warning, told[0].reason), (false, "ContentUpdated"));
    assert!(told[0].note.starts_with("volume \"shared\" (its content): new content is in place"), "{}", told[0].note);
    assert_eq!((told[1].warning, told[1].reason), (true, "ContentNotUpdated"));
    assert!(told[1].note.ends_with("still served: the apiserver did not answer within 10 s"), "{}", told[1].note);
    assert_eq!(std::fs::read_to_string(&password).unwrap(), "two", "the previous content is still served");
}
