//! An apiserver in memory, for the unit tests of code that talks to one (the controllers, the
//! startup taint): a `kube::Client` whose requests are answered from a map of objects, each
//! request recorded, and faults injected by method and path. It speaks just enough of the API
//! for kube's own calls: get, list and watch (equality selectors on labels and on
//! `metadata.name` / `metadata.namespace`), create, delete, server-side apply (taken as a merge
//! of the applied fields, creating the object when absent) and merge patch (conditional on a
//! `metadata.resourceVersion` it carries, as the real one is: 409 on a mismatch). Anything else is
//! answered 400 naming what it does not speak, so a test meets a fake's limit loudly, never as a
//! silent success. The real apiserver's semantics are proven by the end-to-end suite; this one is
//! for the logic around the requests (which are made, in what order, after what failure).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Where an object lives: its API prefix (`/api/v1`, `/apis/GROUP/VERSION`), its resource (plural),
/// its namespace (none for a cluster-scoped one) and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    /// `/api/v1` or `/apis/GROUP/VERSION`.
    pub prefix: String,
    /// The resource's plural.
    pub resource: String,
    /// None for a cluster-scoped object.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl Place {
    /// The place of an object at a request's `path`, or `None` for a collection's path.
    pub fn of_path(path: &str) -> Option<Place> {
        match parse(path)? {
            (prefix, resource, namespace, Some(name)) => Some(Place { prefix, resource, namespace, name }),
            _ => None,
        }
    }
}

/// One request as it came: when, its method, path, query, and its body read as JSON (`Null` when
/// empty).
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it came (paused time in the tests that pause it).
    pub at: tokio::time::Instant,
    /// Its method.
    pub method: Method,
    /// Its path.
    pub path: String,
    /// Its query, as sent.
    pub query: String,
    /// Its body as JSON.
    pub body: Value,
}

/// A fault: requests of `method` whose path contains `path` are answered `status`, `times` more
/// times.
struct Fault {
    method: Method,
    path: String,
    status: u16,
    times: usize,
}

/// One change, as watches replay it: the resource version it made, its type, where, what.
struct Change {
    version: u64,
    kind: &'static str,
    place: Place,
    object: Value,
}

type Answer = Box<dyn Fn(&Value) -> Value + Send + Sync>;

#[derive(Default)]
struct State {
    objects: BTreeMap<Place, Value>,
    version: u64,
    log: Vec<Change>,
    seen: Vec<Seen>,
    faults: Vec<Fault>,
    /// How a create of a resource (a review: SubjectAccessReview) is answered instead of stored.
    answers: BTreeMap<String, Arc<Answer>>,
    /// The watches open now, by number: each one's path and query.
    watches: BTreeMap<u64, String>,
    watches_made: u64,
    /// Bumped by [`FakeApiserver::expire_watches`]: a watch of an older one ends.
    watch_epoch: u64,
    /// A watch from a resource version below this is answered 410 Gone (the client lists again).
    expired_below: u64,
}

/// The apiserver in memory; see the module's comment.
pub struct FakeApiserver {
    state: Mutex<State>,
    /// The newest resource version, watched by the open watches.
    newest: watch::Sender<u64>,
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

impl FakeApiserver {
    /// An apiserver with no object.
    pub fn new() -> Arc<FakeApiserver> {
        Arc::new(FakeApiserver { state: Mutex::new(State::default()), newest: watch::channel(0).0 })
    }

    /// A client whose every request this apiserver answers.
    pub fn client(self: &Arc<Self>) -> kube::Client {
        let apiserver = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let apiserver = apiserver.clone();
            async move { Ok::<_, Infallible>(apiserver.answer(request).await) }
        });
        kube::Client::new(service, "default")
    }

    /// Puts `object` at the place its `path` names (creating or replacing it), as another client
    /// would: watches hear of it.
    pub fn put(&self, path: &str, object: Value) {
        let place = Place::of_path(path).unwrap_or_else(|| panic!("not an object's path: {path}"));
        let mut state = self.lock();
        self.store(&mut state, place, object);
    }

    /// Deletes the object at `path`, as another client would.
    pub fn remove(&self, path: &str) {
        let place = Place::of_path(path).unwrap_or_else(|| panic!("not an object's path: {path}"));
        let mut state = self.lock();
        self.delete(&mut state, &place);
    }

    /// The object at `path`, if any.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.lock().objects.get(&Place::of_path(path)?).cloned()
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The requests so far other than reads (get, list, watch).
    pub fn writes(&self) -> Vec<Seen> {
        self.seen().into_iter().filter(|seen| seen.method != Method::GET).collect()
    }

    /// The watches open now (their client has not dropped them) whose path and query contain
    /// `text`.
    pub fn watching(&self, text: &str) -> usize {
        self.lock().watches.values().filter(|watch| watch.contains(text)).count()
    }

    /// Ends every open watch, and answers a watch from any resource version so far 410 Gone, as
    /// an apiserver whose watch cache moved on does: its clients list again. What changes before
    /// they do is seen only in that list.
    pub fn expire_watches(&self) {
        let mut state = self.lock();
        state.watch_epoch += 1;
        // A version of its own, so that a list made after this is not itself expired.
        state.version += 1;
        state.expired_below = state.version;
        let version = state.version;
        drop(state);
        self.newest.send_replace(version);
    }

    /// Answers the next `times` requests of `method` on a path containing `path` with `status`.
    pub fn fail(&self, method: Method, path: &str, status: u16, times: usize) {
        self.lock().faults.push(Fault { method, path: path.into(), status, times });
    }

    /// Answers each create of `resource` (a review) with what `answer` makes of the request's body.
    pub fn answer_creates(&self, resource: &str, answer: impl Fn(&Value) -> Value + Send + Sync + 'static) {
        self.lock().answers.insert(resource.into(), Arc::new(Box::new(answer)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn answer(self: Arc<Self>, request: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return status(400, &format!("the request's body could not be read: {error}")),
        };
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(body) => body,
                Err(error) => return status(400, &format!("the request's body is not JSON: {error}")),
            }
        };
        let path = parts.uri.path().to_owned();
        let query = query_pairs(parts.uri.query().unwrap_or_default());
        let content_type =
            parts.headers.get(hyper::header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or_default();
        let mut state = self.lock();
        state.seen.push(Seen {
            at: tokio::time::Instant::now(),
            method: parts.method.clone(),
            path: path.clone(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            body: body.clone(),
        });
        if let Some(fault) = state
            .faults
            .iter_mut()
            .find(|fault| fault.times > 0 && fault.method == parts.method && path.contains(&fault.path))
        {
            fault.times -= 1;
            return status(fault.status, "a fault the test asked for");
        }
        let Some((prefix, resource, namespace, name)) = parse(&path) else {
            return status(400, &format!("the fake apiserver does not speak the path {path}"));
        };
        let collection = (prefix, resource, namespace);
        match (parts.method, name) {
            (Method::GET, Some(name)) => {
                let place = Place { prefix: collection.0, resource: collection.1, namespace: collection.2, name };
                match state.objects.get(&place) {
                    Some(object) => ok(object),
                    None => status(404, &format!("{} {} not found", place.resource, place.name)),
                }
            }
            (Method::GET, None) => {
                let selector = match Selector::from_query(&query) {
                    Ok(selector) => selector,
                    Err(error) => return status(400, &error),
                };
                if query.get("watch").map(String::as_str) == Some("true") {
                    let since = query.get("resourceVersion").and_then(|version| version.parse().ok()).unwrap_or(0);
                    if since < state.expired_below {
                        let gone = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": "too old resource version", "reason": "Expired", "code": 410});
                        let line = json!({"type": "ERROR", "object": gone}).to_string() + "\n";
                        return Response::new(Full::new(Bytes::from(line)).boxed_unsync());
                    }
                    state.watches_made += 1;
                    let number = state.watches_made;
                    state.watches.insert(number, format!("{path}?{}", parts.uri.query().unwrap_or_default()));
                    drop(state);
                    return self.watch(collection, selector, since, number);
                }
                let items: Vec<Value> = state
                    .objects
                    .iter()
                    .filter(|(place, object)| in_collection(place, &collection) && selector.matches(place, object))
                    .map(|(_, object)| object.clone())
                    .collect();
                let version = state.version.to_string();
                ok(
                    &json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": version}, "items": items}),
                )
            }
            (Method::POST, None) => {
                if let Some(answer) = state.answers.get(&collection.1).cloned() {
                    drop(state);
                    return created(&answer(&body));
                }
                let Some(name) = body.pointer("/metadata/name").and_then(Value::as_str).map(str::to_owned) else {
                    return status(400, "a create without metadata.name");
                };
                let place = Place { prefix: collection.0, resource: collection.1, namespace: collection.2, name };
                if state.objects.contains_key(&place) {
                    return status(409, &format!("{} {} already exists", place.resource, place.name));
                }
                created(&self.store(&mut state, place, body))
            }
            (Method::DELETE, Some(name)) => {
                let place = Place { prefix: collection.0, resource: collection.1, namespace: collection.2, name };
                match self.delete(&mut state, &place) {
                    Some(object) => ok(&object),
                    None => status(404, &format!("{} {} not found", place.resource, place.name)),
                }
            }
            (Method::PATCH, Some(name)) => {
                let place = Place { prefix: collection.0, resource: collection.1, namespace: collection.2, name };
                let current = state.objects.get(&place).cloned();
                let patched = match (content_type, current) {
                    ("application/apply-patch+yaml", current) => {
                        let mut object = current.unwrap_or_else(|| json!({}));
                        merge(&mut object, &body);
                        object
                    }
                    ("application/merge-patch+json", None) => {
                        return status(404, &format!("{} {} not found", place.resource, place.name));
                    }
                    ("application/merge-patch+json", Some(mut object)) => {
                        let wanted = body.pointer("/metadata/resourceVersion").and_then(Value::as_str);
                        let now = object.pointer("/metadata/resourceVersion").and_then(Value::as_str);
                        if wanted.is_some() && wanted != now {
                            return status(409, "the object has been modified");
                        }
                        merge(&mut object, &body);
                        object
                    }
                    (other, _) => return status(400, &format!("the fake apiserver does not speak the patch {other}")),
                };
                ok(&self.store(&mut state, place, patched))
            }
            (method, _) => status(400, &format!("the fake apiserver does not speak {method} {path}")),
        }
    }

    /// Stores `object` at `place` with a new resource version (and a uid when it has none), and
    /// logs the change for the watches; returns the object as stored.
    fn store(&self, state: &mut State, place: Place, mut object: Value) -> Value {
        state.version += 1;
        let version = state.version;
        let existed = state.objects.contains_key(&place);
        if let Some(map) = object.as_object_mut() {
            let metadata = map.entry("metadata").or_insert_with(|| json!({}));
            if let Some(metadata) = metadata.as_object_mut() {
                metadata.insert("name".into(), place.name.clone().into());
                if let Some(namespace) = &place.namespace {
                    metadata.insert("namespace".into(), namespace.clone().into());
                }
                metadata.entry("uid").or_insert_with(|| format!("uid-{version}").into());
                metadata.insert("resourceVersion".into(), version.to_string().into());
            }
        }
        state.objects.insert(place.clone(), object.clone());
        let kind = if existed { "MODIFIED" } else { "ADDED" };
        state.log.push(Change { version, kind, place, object: object.clone() });
        self.newest.send_replace(version);
        object
    }

    fn delete(&self, state: &mut State, place: &Place) -> Option<Value> {
        let object = state.objects.remove(place)?;
        state.version += 1;
        let version = state.version;
        state.log.push(Change { version, kind: "DELETED", place: place.clone(), object: object.clone() });
        self.newest.send_replace(version);
        Some(object)
    }

    /// A watch of `collection` as `selector` selects, from the change after `since` on, open
    /// (`number` in the open watches) until the client drops it.
    fn watch(self: Arc<Self>, collection: Collection, selector: Selector, since: u64, number: u64) -> Response<Body> {
        let newest = self.newest.subscribe();
        let epoch = self.lock().watch_epoch;
        let open = OpenWatch { apiserver: self.clone(), number };
        let events = futures_util::stream::unfold((open, newest, since), move |(open, mut newest, mut since)| {
            let collection = collection.clone();
            let selector = selector.clone();
            async move {
                loop {
                    let lines: Vec<String> = {
                        let state = open.apiserver.lock();
                        if state.watch_epoch != epoch {
                            return None;
                        }
                        let lines = state
                            .log
                            .iter()
                            .filter(|change| change.version > since)
                            .filter(|change| {
                                in_collection(&change.place, &collection)
                                    && selector.matches(&change.place, &change.object)
                            })
                            .map(|change| json!({"type": change.kind, "object": change.object}).to_string() + "\n")
                            .collect();
                        since = state.version;
                        lines
                    };
                    if !lines.is_empty() {
                        let frame = Ok::<_, Infallible>(Frame::data(Bytes::from(lines.concat())));
                        return Some((frame, (open, newest, since)));
                    }
                    if newest.changed().await.is_err() {
                        return None;
                    }
                }
            }
        });
        Response::new(StreamBody::new(events.boxed()).boxed_unsync())
    }
}

/// Waits until `done` holds, for at most ten minutes: in a test that pauses time, a bound on the
/// steps taken, not on the machine's speed.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("never happened: {what}");
}

/// A watch counted open until its stream is dropped.
struct OpenWatch {
    apiserver: Arc<FakeApiserver>,
    number: u64,
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.apiserver.lock().watches.remove(&self.number);
    }
}

/// A collection: prefix, resource, and a namespace (none: every namespace, or cluster-scoped).
type Collection = (String, String, Option<String>);

fn in_collection(place: &Place, (prefix, resource, namespace): &Collection) -> bool {
    &place.prefix == prefix && &place.resource == resource && (namespace.is_none() || &place.namespace == namespace)
}

/// Splits a request's path into prefix, resource, namespace and name (none for a collection).
fn parse(path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
    let (prefix, rest) = if let Some(rest) = path.strip_prefix("/api/v1/") {
        ("/api/v1".to_owned(), rest)
    } else {
        let mut parts = path.strip_prefix("/apis/")?.splitn(3, '/');
        let (group, version, rest) = (parts.next()?, parts.next()?, parts.next()?);
        (format!("/apis/{group}/{version}"), rest)
    };
    let owned = |text: &str| text.to_owned();
    match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["namespaces", namespace, resource] => Some((prefix, owned(resource), Some(owned(namespace)), None)),
        ["namespaces", namespace, resource, name] => {
            Some((prefix, owned(resource), Some(owned(namespace)), Some(owned(name))))
        }
        [resource] => Some((prefix, owned(resource), None, None)),
        [resource, name] => Some((prefix, owned(resource), None, Some(owned(name)))),
        _ => None,
    }
}

/// The equality selectors of a list or watch.
#[derive(Debug, Clone, Default)]
struct Selector {
    labels: Vec<(String, String)>,
    fields: Vec<(String, String)>,
}

impl Selector {
    fn from_query(query: &BTreeMap<String, String>) -> Result<Selector, String> {
        let pairs = |text: Option<&String>| -> Result<Vec<(String, String)>, String> {
            let Some(text) = text.filter(|text| !text.is_empty()) else { return Ok(Vec::new()) };
            text.split(',')
                .map(|term| match term.split_once('=') {
                    Some((key, value)) if !key.ends_with('!') => {
                        Ok((key.to_owned(), value.trim_start_matches('=').to_owned()))
                    }
                    _ => Err(format!("the fake apiserver does not speak the selector {term}")),
                })
                .collect()
        };
        let selector =
            Selector { labels: pairs(query.get("labelSelector"))?, fields: pairs(query.get("fieldSelector"))? };
        match selector.fields.iter().find(|(field, _)| field != "metadata.name" && field != "metadata.namespace") {
            Some((field, _)) => Err(format!("the fake apiserver does not select by {field}")),
            None => Ok(selector),
        }
    }

    fn matches(&self, place: &Place, object: &Value) -> bool {
        let labels_match = self.labels.iter().all(|(key, value)| {
            object.pointer("/metadata/labels").and_then(|labels| labels.get(key)).and_then(Value::as_str)
                == Some(value.as_str())
        });
        let fields_match = self.fields.iter().all(|(field, value)| match field.as_str() {
            "metadata.name" => &place.name == value,
            _ => place.namespace.as_deref() == Some(value.as_str()),
        });
        labels_match && fields_match
    }
}

/// A query's pairs, percent-decoded (kube encodes selectors' `=` and `,`).
fn query_pairs(query: &str) -> BTreeMap<String, String> {
    let decode = |text: &str| {
        let bytes = text.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            let hex =
                bytes.get(at + 1..at + 3).and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
            match (bytes[at], hex) {
                (b'%', Some(byte)) => {
                    decoded.push(byte);
                    at += 3;
                }
                (b'+', _) => {
                    decoded.push(b' ');
                    at += 1;
                }
                (byte, _) => {
                    decoded.push(byte);
                    at += 1;
                }
            }
        }
        String::from_utf8_lossy(&decoded).into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// A JSON merge patch (RFC 7386) of `patch` onto `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(map) = target.as_object_mut() {
        for (key, value) in fields {
            if value.is_null() {
                map.remove(key);
            } else {
                merge(map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

fn ok(object: &Value) -> Response<Body> {
    respond(StatusCode::OK, object)
}

fn created(object: &Value) -> Response<Body> {
    respond(StatusCode::CREATED, object)
}

fn status(code: u16, message: &str) -> Response<Body> {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        429 => "TooManyRequests",
        _ => "BadRequest",
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    respond(StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST), &body)
}

fn respond(code: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}
