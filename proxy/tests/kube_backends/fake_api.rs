//! A small Kubernetes API server on 127.0.0.1:0 that speaks the API's JSON
//! for what the backends use: list and watch (chunked, from a
//! resourceVersion), get, create, replace with a resourceVersion
//! precondition (409 when stale), the status subresource, JSON merge
//! patch, and delete. Every request is logged so tests can assert the
//! method, path, query and body the client sent. Not a general API server:
//! no field selectors, label selectors only as `k=v[,k=v]`.
//!
//! The backends' tests run against the real kube-apiserver; these stay
//! here, for what it cannot be made to do:
//! - `inventory::discovery_creates_a_device_then_writes_its_status_subresource`:
//!   the bodies sent (each write's resourceVersion precondition);
//! - `inventory::bind_replaces_the_status_with_the_resource_version_it_read`:
//!   the same, for the finalizer and status writes of a bind;
//! - `inventory::a_conflict_re_reads_and_binds_another_device_never_the_same_twice`:
//!   another writer's change the watch never delivers (`put_silently`);
//! - `inventory::an_update_that_loses_on_the_server_re_reads_and_reports_a_conflict`:
//!   the same, so the loss is the server's 409, not the cache's;
//! - `leader::the_lease_is_acquired_renewed_and_lost_to_a_replica_after_it_expired`:
//!   the Lease writes' bodies, and one replica cut off by injected 503s.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

/// One logged request.
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub query: HashMap<String, String>,
    pub body: Value,
}

/// A test's rule: answer this request with an error status instead.
pub type Rule = Box<dyn Fn(&Logged) -> Option<u16> + Send + Sync>;

/// The server; dropping it stops accepting (open watches end on their own).
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<Change>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    collection: String,
    namespace: String,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// collection ("group/plural") -> (namespace, name) -> object
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    history: Vec<Change>,
    log: Vec<Logged>,
    rules: Vec<Rule>,
}

/// What a path names.
struct Target {
    group: String,
    version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    status: bool,
}

impl FakeApi {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let (events, _) = broadcast::channel(4096);
        let (st, ev) = (state.clone(), events.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (st, ev) = (st.clone(), ev.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(st.clone(), ev.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            events,
            task,
        }
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().expect("url");
        let mut config = kube::Config::new(url);
        config.read_timeout = Some(Duration::from_secs(60));
        kube::Client::try_from(config).expect("client")
    }

    /// Stores `object` (its apiVersion, kind, metadata.name and namespace
    /// name where) as a create would, with a watch event.
    pub fn put(&self, plural: &str, object: Value) -> Value {
        let mut st = self.state.lock().expect("state");
        let (collection, ns, name) = key_of(plural, &object);
        st.store(&collection, &ns, &name, object, &self.events, true)
    }

    /// Changes an object as another writer would, but keeps the change
    /// from open watches: the client's cache goes stale.
    pub fn put_silently(&self, plural: &str, object: Value) -> Value {
        let mut st = self.state.lock().expect("state");
        let (collection, ns, name) = key_of(plural, &object);
        st.store(&collection, &ns, &name, object, &self.events, false)
    }

    /// The stored object.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let st = self.state.lock().expect("state");
        st.objects
            .get(&collection_of(plural))?
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Requests so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.state.lock().expect("state").log.clone()
    }

    /// Writes (anything but GET) so far.
    pub fn writes(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }

    /// Adds a rule that can fail requests.
    pub fn rule(&self, rule: Rule) {
        self.state.lock().expect("state").rules.push(rule);
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Known collections: plural -> "group/plural" (core group is "").
fn collection_of(plural: &str) -> String {
    let group = match plural {
        "scsitargets" | "scsidevices" | "pendingresizerequests" => "csi-scsi.io",
        "leases" => "coordination.k8s.io",
        "events" => "events.k8s.io",
        _ => "",
    };
    format!("{group}/{plural}")
}

fn key_of(plural: &str, object: &Value) -> (String, String, String) {
    let ns = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
    (collection_of(plural), ns, name)
}

fn has_status_subresource(collection: &str) -> bool {
    collection.starts_with("csi-scsi.io/")
}

impl State {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn store(
        &mut self,
        collection: &str,
        ns: &str,
        name: &str,
        mut object: Value,
        events: &broadcast::Sender<Change>,
        announce: bool,
    ) -> Value {
        let rv = self.next_rv();
        let existed = self
            .objects
            .get(collection)
            .and_then(|m| m.get(&(ns.to_owned(), name.to_owned())))
            .cloned();
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        if meta.get("uid").is_none() {
            meta["uid"] = existed
                .as_ref()
                .map(|e| e["metadata"]["uid"].clone())
                .unwrap_or_else(|| json!(format!("uid-{name}-{rv}")));
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = existed
                .as_ref()
                .map(|e| e["metadata"]["creationTimestamp"].clone())
                .unwrap_or_else(|| {
                    json!(format!(
                        "2026-01-01T00:{:02}:{:02}Z",
                        (rv / 60) % 60,
                        rv % 60
                    ))
                });
        }
        self.objects
            .entry(collection.to_owned())
            .or_default()
            .insert((ns.to_owned(), name.to_owned()), object.clone());
        let change = Change {
            rv,
            collection: collection.to_owned(),
            namespace: ns.to_owned(),
            kind: if existed.is_some() {
                "MODIFIED"
            } else {
                "ADDED"
            },
            object: object.clone(),
        };
        if announce {
            self.history.push(change.clone());
            let _ = events.send(change);
        }
        object
    }

    fn remove(
        &mut self,
        collection: &str,
        ns: &str,
        name: &str,
        events: &broadcast::Sender<Change>,
    ) -> Option<Value> {
        let mut obj = self
            .objects
            .get_mut(collection)?
            .remove(&(ns.to_owned(), name.to_owned()))?;
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let change = Change {
            rv,
            collection: collection.to_owned(),
            namespace: ns.to_owned(),
            kind: "DELETED",
            object: obj.clone(),
        };
        self.history.push(change.clone());
        let _ = events.send(change);
        Some(obj)
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn respond(code: u16, body: Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn status(code: u16, reason: &str, message: String) -> Response<Body> {
    respond(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}),
    )
}

fn parse_target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match *segs.first()? {
        "api" => (String::new(), segs.get(1)?.to_string(), &segs[2..]),
        "apis" => (
            segs.get(1)?.to_string(),
            segs.get(2)?.to_string(),
            &segs[3..],
        ),
        _ => return None,
    };
    let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    Some(Target {
        group,
        version,
        namespace,
        plural: rest.first()?.to_string(),
        name: rest.get(1).map(|s| s.to_string()),
        status: rest.get(2) == Some(&"status"),
    })
}

fn query_map(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn selector_matches(selector: Option<&String>, object: &Value) -> bool {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    sel.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => object["metadata"]["labels"][k].as_str() == Some(v),
        None => object["metadata"]["labels"].get(term).is_some(),
    })
}

fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    if let Some(map) = target.as_object_mut() {
                        map.remove(k);
                    }
                } else {
                    merge_patch(&mut target[k], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<Change>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = query_map(req.uri().query());
    let bytes = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let logged = Logged {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        body: body.clone(),
    };
    let Some(t) = parse_target(&path) else {
        return Ok(status(404, "NotFound", format!("no route {path}")));
    };
    let collection = format!("{}/{}", t.group, t.plural);
    let ns = t.namespace.clone().unwrap_or_default();
    let mut st = state.lock().expect("state");
    st.log.push(logged.clone());
    if let Some(code) = st.rules.iter().find_map(|r| r(&logged)) {
        return Ok(status(
            code,
            "InternalError",
            format!("refused by the test ({code})"),
        ));
    }
    let api_version = if t.group.is_empty() {
        t.version.clone()
    } else {
        format!("{}/{}", t.group, t.version)
    };
    match (method.clone(), t.name.clone()) {
        (Method::GET, None) if query.get("watch").map(String::as_str) == Some("true") => {
            let from: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|v| v.parse().ok())
                .unwrap_or(290u64)
                .min(30);
            let mut rx = events.subscribe();
            let backlog: Vec<Change> = st
                .history
                .iter()
                .filter(|c| {
                    c.rv > from
                        && c.collection == collection
                        && (t.namespace.is_none() || c.namespace == ns)
                })
                .cloned()
                .collect();
            drop(st);
            let selector = query.get("labelSelector").cloned();
            let only_ns = t.namespace.clone();
            let (tx, out) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
            tokio::spawn(async move {
                let line = |c: &Change| {
                    Frame::data(Bytes::from(format!(
                        "{}\n",
                        json!({"type": c.kind, "object": c.object})
                    )))
                };
                let mut last = from;
                for c in &backlog {
                    if selector_matches(selector.as_ref(), &c.object)
                        && tx.send(Ok(line(c))).await.is_err()
                    {
                        return;
                    }
                    last = last.max(c.rv);
                }
                let deadline = tokio::time::sleep(Duration::from_secs(timeout));
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        () = &mut deadline => return,
                        got = rx.recv() => match got {
                            Ok(c) => {
                                let wanted = c.rv > last && c.collection == collection
                                    && only_ns.as_ref().is_none_or(|n| *n == c.namespace)
                                    && selector_matches(selector.as_ref(), &c.object);
                                if wanted && tx.send(Ok(line(&c))).await.is_err() {
                                    return;
                                }
                                last = last.max(c.rv);
                            }
                            Err(broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(_) => return,
                        }
                    }
                }
            });
            Ok(Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(StreamBody::new(ReceiverStream::new(out)).boxed())
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())))
        }
        (Method::GET, None) => {
            let items: Vec<Value> = st
                .objects
                .get(&collection)
                .map(|m| {
                    m.iter()
                        .filter(|((n, _), o)| {
                            (t.namespace.is_none() || *n == ns)
                                && selector_matches(query.get("labelSelector"), o)
                        })
                        .map(|(_, o)| o.clone())
                        .collect()
                })
                .unwrap_or_default();
            Ok(respond(
                200,
                json!({"apiVersion": api_version, "kind": "List", "metadata": {"resourceVersion": st.rv.to_string()}, "items": items}),
            ))
        }
        (Method::GET, Some(name)) => match st
            .objects
            .get(&collection)
            .and_then(|m| m.get(&(ns.clone(), name.clone())))
        {
            Some(o) => Ok(respond(200, o.clone())),
            None => Ok(status(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", t.plural),
            )),
        },
        (Method::POST, None) => {
            let mut obj = body;
            let Some(name) = obj["metadata"]["name"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| {
                    obj["metadata"]["generateName"]
                        .as_str()
                        .map(|g| format!("{g}{}", st.rv + 1))
                })
            else {
                return Ok(status(
                    422,
                    "Invalid",
                    "metadata.name: Required value".into(),
                ));
            };
            if st
                .objects
                .get(&collection)
                .is_some_and(|m| m.contains_key(&(ns.clone(), name.clone())))
            {
                return Ok(status(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", t.plural),
                ));
            }
            obj["metadata"]["name"] = json!(name);
            if t.namespace.is_some() {
                obj["metadata"]["namespace"] = json!(ns);
            }
            if let (true, Some(map)) = (has_status_subresource(&collection), obj.as_object_mut()) {
                map.remove("status");
            }
            let stored = st.store(&collection, &ns, &name, obj, &events, true);
            Ok(respond(201, stored))
        }
        (Method::PUT, Some(name)) | (Method::PATCH, Some(name)) => {
            let Some(current) = st
                .objects
                .get(&collection)
                .and_then(|m| m.get(&(ns.clone(), name.clone())))
                .cloned()
            else {
                return Ok(status(
                    404,
                    "NotFound",
                    format!("{} \"{name}\" not found", t.plural),
                ));
            };
            let current_rv = current["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let precondition = body["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_owned);
            if method == Method::PUT && precondition.is_none() {
                return Ok(status(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                        .into(),
                ));
            }
            if precondition.as_ref().is_some_and(|p| *p != current_rv) {
                return Ok(status(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        t.plural
                    ),
                ));
            }
            let mut next = current.clone();
            let sub = has_status_subresource(&collection);
            match (method == Method::PUT, t.status) {
                (true, true) => next["status"] = body["status"].clone(),
                (true, false) => {
                    next = body.clone();
                    if sub {
                        match current.get("status") {
                            Some(s) => next["status"] = s.clone(),
                            None => {
                                if let Some(m) = next.as_object_mut() {
                                    m.remove("status");
                                }
                            }
                        }
                    }
                    next["metadata"]["uid"] = current["metadata"]["uid"].clone();
                    next["metadata"]["creationTimestamp"] =
                        current["metadata"]["creationTimestamp"].clone();
                }
                (false, true) => merge_patch(&mut next["status"], &body["status"]),
                (false, false) => {
                    let mut p = body.clone();
                    if let (true, Some(m)) = (sub, p.as_object_mut()) {
                        m.remove("status");
                    }
                    merge_patch(&mut next, &p);
                }
            }
            let stored = st.store(&collection, &ns, &name, next, &events, true);
            Ok(respond(200, stored))
        }
        (Method::DELETE, Some(name)) => match st.remove(&collection, &ns, &name, &events) {
            Some(o) => Ok(respond(200, o)),
            None => Ok(status(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", t.plural),
            )),
        },
        _ => Ok(status(405, "MethodNotAllowed", format!("{method} {path}"))),
    }
}
