//! What operators see, over real HTTP from real processes: `/healthz`,
//! `/readyz` (following the certificate files), `/metrics` (parsed by a
//! strict OpenMetrics parser; counters move after calls), `/status` on both
//! binaries, the `csi-scsi` CLI over them, request IDs that cross from the
//! proxy to the agent's log, and CHAP secrets that reach no log, no status
//! document and no error message.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_scsi_certs::{CertificateAuthority, Identity, Validity, write_issued};
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::identity_client::IdentityClient;
use csi_scsi_proto::csi::node_client::NodeClient;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode;
use csi_scsi_proto::csi::*;
use csi_scsi_tests::binaries::binary;
use csi_scsi_tests::csi_client::csi_channel;
use csi_scsi_tests::daemon::{Daemon, free_port};
use csi_scsi_tests::lab::scenario::{self, capability, create};
use csi_scsi_tests::patience::eventually;
use csi_scsi_tests::pki::as_secret_volume;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::Env;

// === HTTP, the status address, the CLI ===

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    fn json(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        assert_eq!(self.content_type, "application/json", "{}", self.body);
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// A plain HTTP/1.1 request (`Connection: close`), parsed by hand so the
/// test depends on nothing the servers use.
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> Answer {
    let mut stream = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .expect("connect timeout")
    .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("answer timeout")
        .expect("read");
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("headers end");
    let mut lines = head.lines();
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    if let Some(len) = headers.get("content-length") {
        assert_eq!(
            len.parse::<usize>().expect("length"),
            body.len(),
            "content-length"
        );
    }
    Answer {
        status,
        content_type: headers.get("content-type").cloned().unwrap_or_default(),
        body: body.to_owned(),
    }
}

pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    // `/status` and the state-read gauges of `/metrics` are snapshots of
    // at most SNAPSHOT_TTL ago: a read that must see what the test just
    // did waits that out.
    if matches!(path, "/status" | "/metrics") {
        tokio::time::sleep(csi_scsi_daemon::SNAPSHOT_TTL).await;
    }
    http(addr, "GET", path).await
}

/// The status address a daemon logged at start (`status=<addr>`).
pub async fn status_addr(daemon: &Daemon) -> SocketAddr {
    eventually("the status address in the startup log", || async {
        let log = daemon.log();
        let rest = &log[log.find(" status=")? + " status=".len()..];
        let end = rest.find(char::is_whitespace)?;
        rest[..end].parse().ok()
    })
    .await
}

/// Runs the `csi-scsi` CLI: exit success, stdout, stderr.
pub async fn cli(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(binary("csi-scsi"))
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .await
        .expect("run csi-scsi");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// === A strict OpenMetrics text parser ===

/// One sample line.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition: family types and every sample.
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The value of the sample `name` whose labels are exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if s.contains(char::is_alphabetic) && !s.contains(['e', 'E']) => {
            Err(format!("bad number {s:?}"))
        }
        _ => s.parse().map_err(|_| format!("bad number {s:?}")),
    }
}

/// `{a="x",b="y"}` -> labels, and the rest of the line.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let Some(mut rest) = s.strip_prefix('{') else {
        return Ok((labels, s));
    };
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !is_name(name) || name.contains(':') {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((i, '"')) => break i,
                Some((_, '\n')) | None => return Err("unterminated label value".into()),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err(format!("expected , or }} at {rest:?}"));
        }
    }
}

/// Parses OpenMetrics 1.0 text strictly: declared families, suffixes that
/// fit each type, quoted and escaped labels, numbers, contiguous families,
/// consistent histograms, and the final `# EOF`.
pub fn parse_openmetrics(text: &str) -> Result<Exposition, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("the exposition does not end with # EOF")?;
    if body.contains("# EOF") {
        return Err("# EOF before the end".into());
    }
    let mut exp = Exposition::default();
    let mut current: Option<String> = None;
    let mut closed: Vec<String> = Vec::new();
    let mut helps: BTreeMap<String, ()> = BTreeMap::new();
    for (n, line) in body.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if let Some(comment) = line.strip_prefix("# ") {
            let mut parts = comment.splitn(3, ' ');
            let (kind, name, rest) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next(),
            );
            if !is_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            if current.as_deref() != Some(name) {
                if let Some(prev) = current.take() {
                    closed.push(prev);
                }
                if closed.iter().any(|c| c == name) {
                    return Err(at(format!("family {name} is not contiguous")));
                }
                current = Some(name.to_owned());
            }
            match kind {
                "TYPE" => {
                    let ty = rest.ok_or_else(|| at("TYPE without a type".into()))?;
                    if ![
                        "counter",
                        "gauge",
                        "histogram",
                        "gaugehistogram",
                        "summary",
                        "info",
                        "stateset",
                        "unknown",
                    ]
                    .contains(&ty)
                    {
                        return Err(at(format!("unknown type {ty}")));
                    }
                    if exp.types.insert(name.to_owned(), ty.to_owned()).is_some() {
                        return Err(at(format!("{name} typed twice")));
                    }
                }
                "HELP" => {
                    if helps.insert(name.to_owned(), ()).is_some() {
                        return Err(at(format!("{name} has two HELP lines")));
                    }
                }
                "UNIT" => {
                    let unit = rest.ok_or_else(|| at("UNIT without a unit".into()))?;
                    if !name.ends_with(&format!("_{unit}")) {
                        return Err(at(format!("{name} does not end with its unit {unit}")));
                    }
                }
                other => return Err(at(format!("unknown comment {other}"))),
            }
            continue;
        }
        if line.is_empty() {
            return Err(at("empty line".into()));
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_name(name) {
            return Err(at(format!("bad sample name {name:?}")));
        }
        let (labels, rest) = parse_labels(&line[name_end..]).map_err(at)?;
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("no space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(at)?;
        if let Some(ts) = fields.next() {
            parse_value(ts).map_err(at)?;
        }
        if fields.next().is_some() {
            return Err(at("trailing fields".into()));
        }
        let family = current
            .clone()
            .ok_or_else(|| at("sample before any TYPE".into()))?;
        let ty = exp
            .types
            .get(&family)
            .cloned()
            .ok_or_else(|| at(format!("family {family} has no TYPE")))?;
        let suffix = name
            .strip_prefix(family.as_str())
            .ok_or_else(|| at(format!("sample {name} outside family {family}")))?;
        let allowed: &[&str] = match ty.as_str() {
            "counter" => &["_total", "_created"],
            "gauge" | "unknown" | "stateset" => &[""],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "gaugehistogram" => &["_bucket", "_gcount", "_gsum"],
            "summary" => &["", "_count", "_sum", "_created"],
            "info" => &["_info"],
            _ => &[],
        };
        if !allowed.contains(&suffix) {
            return Err(at(format!("suffix {suffix:?} does not fit a {ty}")));
        }
        if ty == "counter" && suffix == "_total" && (value < 0.0 || value.is_nan()) {
            return Err(at("negative counter".into()));
        }
        exp.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    check_histograms(&exp)?;
    Ok(exp)
}

/// Buckets ascend in `le`, counts never decrease, `+Inf` equals `_count`.
fn check_histograms(exp: &Exposition) -> Result<(), String> {
    for (family, ty) in &exp.types {
        if ty != "histogram" {
            continue;
        }
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for s in exp
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let mut key = s.labels.clone();
            let le = key
                .remove("le")
                .ok_or_else(|| format!("{family}: bucket without le"))?;
            series
                .entry(key)
                .or_default()
                .push((parse_value(&le)?, s.value));
        }
        for (key, buckets) in series {
            for w in buckets.windows(2) {
                if !(w[0].0 < w[1].0 && w[0].1 <= w[1].1) {
                    return Err(format!(
                        "{family} {key:?}: buckets out of order: {buckets:?}"
                    ));
                }
            }
            let inf = buckets
                .last()
                .filter(|b| b.0.is_infinite())
                .ok_or_else(|| format!("{family} {key:?}: no +Inf bucket"))?;
            let count = exp
                .samples
                .iter()
                .find(|s| s.name == format!("{family}_count") && s.labels == key)
                .ok_or_else(|| format!("{family} {key:?}: no _count"))?;
            if inf.1 != count.value {
                return Err(format!(
                    "{family} {key:?}: +Inf bucket {} != count {}",
                    inf.1, count.value
                ));
            }
        }
    }
    Ok(())
}

/// Scrapes `/metrics` and parses it; the content type must be OpenMetrics.
pub async fn scrape(addr: SocketAddr) -> Exposition {
    let a = get(addr, "/metrics").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    parse_openmetrics(&a.body).unwrap_or_else(|e| panic!("{e}\n{}", a.body))
}

const HANDLING: &str = "csi_scsi_grpc_server_handling_seconds_count";

fn calls(exp: &Exposition, service: &str, method: &str, code: &str) -> f64 {
    exp.value(
        HANDLING,
        &[("service", service), ("method", method), ("code", code)],
    )
    .unwrap_or(0.0)
}

fn with_rid<T>(msg: T, rid: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-request-id", rid.parse().expect("ascii"));
    r
}

#[test]
fn the_parser_refuses_what_prometheus_would_refuse() {
    let ok = "# HELP x A.\n# TYPE x counter\nx_total{a=\"1\\\"\"} 3\n# EOF\n";
    let exp = parse_openmetrics(ok).expect("valid");
    assert_eq!(exp.value("x_total", &[("a", "1\"")]), Some(3.0));
    for bad in [
        "# TYPE x counter\nx_total 1\n",      // no EOF
        "# TYPE x gauge\nx_total 1\n# EOF\n", // suffix of another type
        "x 1\n# EOF\n",                       // undeclared
        "# TYPE x gauge\nx{a=1} 1\n# EOF\n",  // unquoted label
        "# TYPE x gauge\nx one\n# EOF\n",     // not a number
        "# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\n# TYPE x gauge\n# EOF\n", // not contiguous
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n# EOF\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 1\n# EOF\n",
        "# TYPE x_seconds gauge\n# UNIT x_seconds bytes\nx_seconds 1\n# EOF\n",
    ] {
        parse_openmetrics(bad).expect_err(bad);
    }
}

// === Each endpoint on the agent ===

#[tokio::test]
async fn the_agent_serves_health_readiness_metrics_and_status() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let status = status_addr(&agent.daemon).await;

    let a = get(status, "/healthz").await;
    assert_eq!(
        (a.status, a.content_type.as_str(), a.body.as_str()),
        (200, "text/plain; charset=utf-8", "ok\n")
    );
    let a = get(status, "/readyz").await;
    assert_eq!(a.status, 200);
    // The issued certificate lasts 90 days (the CLI's default): 2159 h and some minutes left.
    assert!(
        a.body
            .starts_with("ready\n[+] tls: certificate expires in 215"),
        "{}",
        a.body
    );
    assert_eq!(get(status, "/nowhere").await.status, 404);
    assert_eq!(http(status, "POST", "/status").await.status, 405);

    let before = scrape(status).await;
    assert_eq!(
        before.types.get("csi_scsi_build").map(String::as_str),
        Some("info")
    );
    assert_eq!(
        before.value(
            "csi_scsi_build_info",
            &[
                ("component", "agent"),
                ("version", env!("CARGO_PKG_VERSION"))
            ]
        ),
        Some(1.0)
    );
    let left = before
        .value("csi_scsi_certificate_expiry_seconds", &[])
        .expect("expiry gauge");
    assert!(
        (89.0 * 86400.0..90.0 * 86400.0).contains(&left),
        "a fresh certificate has about 90 days: {left}"
    );
    for g in ["csi_scsi_node_luns", "csi_scsi_volumes"] {
        assert_eq!(
            before.types.get(g).map(String::as_str),
            Some("gauge"),
            "{g}"
        );
    }

    // CSI calls move the histogram by method and code.
    let channel = csi_channel(&agent.csi).await.expect("CSI socket");
    let mut identity = IdentityClient::new(channel.clone());
    for _ in 0..3 {
        identity.probe(ProbeRequest {}).await.expect("probe");
    }
    let mut node = NodeClient::new(channel);
    let err = node
        .node_stage_volume(with_rid(
            NodeStageVolumeRequest::default(),
            "obs-agent-bad-stage",
        ))
        .await
        .expect_err("an empty request is refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let after = scrape(status).await;
    assert_eq!(
        calls(&after, "csi.v1.Identity", "Probe", "OK")
            - calls(&before, "csi.v1.Identity", "Probe", "OK"),
        3.0
    );
    assert_eq!(
        calls(&after, "csi.v1.Node", "NodeStageVolume", "InvalidArgument"),
        1.0
    );
    assert_eq!(
        after
            .types
            .get("csi_scsi_grpc_server_handling_seconds")
            .map(String::as_str),
        Some("histogram")
    );

    let doc = get(status, "/status").await.json();
    assert_eq!(doc["component"], "agent");
    assert_eq!(doc["node"], "node-a");
    assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"));
    for key in ["sessions", "devices", "recent_errors", "problems"] {
        assert!(doc[key].is_array(), "{key}: {doc}");
    }
    assert!(
        doc["volumes"]["staged"].is_array() && doc["volumes"]["published"].is_array(),
        "{doc}"
    );
    let e = &doc["recent_errors"][0];
    assert_eq!(e["method"], "NodeStageVolume", "{doc}");
    assert_eq!(e["code"], "InvalidArgument");
    assert_eq!(e["request_id"], "obs-agent-bad-stage");
    assert_eq!(e["message"], err.message());
    assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");

    // kubelet sends no request ID: the agent makes one, and the error and
    // the log lines of the call carry it.
    let mut node = NodeClient::new(csi_channel(&agent.csi).await.expect("CSI socket"));
    node.node_unstage_volume(NodeUnstageVolumeRequest::default())
        .await
        .expect_err("an empty request is refused");
    let doc = get(status, "/status").await.json();
    let e = &doc["recent_errors"][0];
    assert_eq!(e["method"], "NodeUnstageVolume", "{doc}");
    let rid = e["request_id"].as_str().expect("request ID").to_owned();
    assert!(
        rid.len() == 16 && rid.bytes().all(|b| b.is_ascii_hexdigit()),
        "{rid:?}"
    );
    let log = agent.daemon.log();
    assert!(
        log.lines()
            .any(|l| l.contains("NodeUnstageVolume") && l.contains(&format!("request_id={rid}"))),
        "{log}"
    );
}

// === Each endpoint on the proxy ===

/// Starts a proxy whose agents file lists `agents`.
async fn start_proxy(env: &Env, agents: &str) -> (Daemon, PathBuf, SocketAddr) {
    let tls = env.pki.issue_proxy("proxy-tls");
    let csi = env.path("proxy/csi.sock");
    std::fs::write(env.path("agents.txt"), agents).expect("agents file");
    let args: Vec<String> = [
        "--csi-endpoint",
        &csi.display().to_string(),
        "--tls-dir",
        &tls.display().to_string(),
        "--store",
        &env.path("proxy/inventory.db").display().to_string(),
        "--agents-file",
        &env.path("agents.txt").display().to_string(),
        "--status-listen",
        "127.0.0.1:0",
        "--agent-probe-interval",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let daemon = Daemon::spawn("csi-scsi-proxy", &args, &env.path("proxy.log"));
    let status = status_addr(&daemon).await;
    eventually("the proxy's CSI socket", || async {
        tokio::net::UnixStream::connect(&csi).await.ok()
    })
    .await;
    (daemon, csi, status)
}

#[tokio::test]
async fn the_proxy_serves_health_readiness_metrics_and_status_with_every_agent() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let dead = free_port();
    let (proxy, csi, status) = start_proxy(
        &env,
        &format!("node-a {}\nnode-b 127.0.0.1:{dead}\n", agent.api),
    )
    .await;

    assert_eq!(get(status, "/healthz").await.status, 200);
    let a = get(status, "/readyz").await;
    assert_eq!(
        (a.status, a.body.lines().next()),
        (200, Some("ready")),
        "{}",
        proxy.log()
    );

    let doc = eventually("both agents probed", || async {
        let doc = get(status, "/status").await.json();
        let probed = doc["agents"]
            .as_array()?
            .iter()
            .all(|a| a["reachable"].is_boolean());
        probed.then_some(doc)
    })
    .await;
    assert_eq!(doc["component"], "proxy");
    assert_eq!(doc["leader"]["this_replica_leads"], true);
    let agents = doc["agents"].as_array().expect("agents");
    assert_eq!(agents.len(), 2, "{doc}");
    assert_eq!(agents[0]["node"], "node-a");
    assert_eq!(agents[0]["address"], agent.api.to_string());
    assert_eq!(agents[0]["reachable"], true, "{doc}");
    assert_eq!(agents[0]["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        agents[0]["round_trip_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{doc}"
    );
    assert_eq!(agents[1]["node"], "node-b");
    assert_eq!(agents[1]["reachable"], false, "{doc}");
    assert!(
        agents[1]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{doc}"
    );
    let phases = &doc["inventory"]["devices_by_phase"];
    for phase in ["Available", "Bound", "Releasing", "Failed", "Lost"] {
        assert_eq!(phases[phase], 0, "{doc}");
    }
    assert!(
        doc["pending_resizes"].is_array() && doc["devices"].is_array(),
        "{doc}"
    );

    let before = scrape(status).await;
    let mut controller = ControllerClient::new(csi_channel(&csi).await.expect("CSI"));
    for _ in 0..2 {
        controller
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await
            .expect("capabilities");
    }
    let err = controller
        .controller_publish_volume(with_rid(
            ControllerPublishVolumeRequest {
                volume_id: "naa.6001405f00000000000000000000dead:nope".into(),
                node_id: "node-a".into(),
                volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
                ..Default::default()
            },
            "obs-proxy-bad-publish",
        ))
        .await
        .expect_err("no such volume");
    let after = scrape(status).await;
    let service = "csi.v1.Controller";
    assert_eq!(
        calls(&after, service, "ControllerGetCapabilities", "OK")
            - calls(&before, service, "ControllerGetCapabilities", "OK"),
        2.0
    );
    let code = csi_scsi_daemon::code_name(err.code());
    assert_eq!(calls(&after, service, "ControllerPublishVolume", code), 1.0);
    assert_eq!(
        after.value("csi_scsi_agents", &[("state", "reachable")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("csi_scsi_agents", &[("state", "unreachable")]),
        Some(1.0)
    );
    assert_eq!(
        after.value("csi_scsi_devices", &[("phase", "Available")]),
        Some(0.0)
    );
    // The probes run every second, one per agent: node-b's (a closed
    // port) and node-a's may both be under way when the scrape is taken
    // (a local CI run on 2026-12-01 saw 2 on a loaded machine). More than
    // one per agent is a leak.
    assert!(
        after
            .value("csi_scsi_agent_calls_in_flight", &[])
            .is_some_and(|n| n <= 2.0),
        "{:?}",
        after.value("csi_scsi_agent_calls_in_flight", &[])
    );
    assert!(
        after
            .value(
                "csi_scsi_agent_client_handling_seconds_count",
                &[("method", "Status"), ("code", "OK")]
            )
            .is_some_and(|n| n >= 1.0),
        "the probes are agent calls too"
    );

    let doc = get(status, "/status").await.json();
    let e = doc["recent_errors"]
        .as_array()
        .and_then(|e| {
            e.iter()
                .find(|e| e["request_id"] == "obs-proxy-bad-publish")
        })
        .unwrap_or_else(|| panic!("the failed publish in {doc}"));
    assert_eq!(e["method"], "ControllerPublishVolume");
    assert_eq!(e["code"], code);
}

// === Readiness follows the certificate files ===

/// Points a Secret volume's `..data` at a fresh copy of `files` (whether
/// or not `..data` exists now), atomically, as kubelet does.
fn point_data_at(dir: &Path, files: &Path, generation: u32) {
    let stamp = dir.join(format!("..2026_02_02_00_00_00.{generation}"));
    std::fs::create_dir(&stamp).expect("stamp dir");
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::copy(files.join(f), stamp.join(f)).expect("copy");
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(stamp.file_name().expect("name"), &tmp).expect("link");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
}

async fn readiness(addr: SocketAddr) -> (u16, String) {
    let a = get(addr, "/readyz").await;
    assert_eq!(a.content_type, "text/plain; charset=utf-8");
    (a.status, a.body)
}

#[tokio::test]
async fn readyz_turns_unready_without_certificates_or_once_expired_and_ready_after_rotation() {
    let env = Env::new();
    let tls = env.pki.issue_agent("node-a", "node-a-tls");
    as_secret_volume(&tls);
    let agent = env.start_agent_with("node-a", &tls, &[]).await;
    let status = status_addr(&agent.daemon).await;
    assert_eq!(readiness(status).await.0, 200);

    // The Secret's files disappear.
    std::fs::remove_file(tls.join("..data")).expect("remove ..data");
    let body = eventually("unready without the files", || async {
        let (code, body) = readiness(status).await;
        (code == 503).then_some(body)
    })
    .await;
    assert!(
        body.starts_with("not ready\n[-] tls: ") && body.contains("missing"),
        "{body}"
    );

    // A rotated certificate arrives.
    let fresh = env.pki.issue_agent("node-a", "node-a-fresh");
    point_data_at(&tls, &fresh, 1);
    eventually("ready with the rotated files", || async {
        (readiness(status).await.0 == 200).then_some(())
    })
    .await;

    // A certificate that expires a few seconds after it is loaded.
    let ca_dir = env.pki.ca_dir();
    let ca =
        CertificateAuthority::load(&ca_dir.join("ca.crt"), &ca_dir.join("ca.key")).expect("CA");
    let mut validity = Validity::days(1);
    validity.not_after = validity.not_before + Duration::from_secs(5 * 60 + 6);
    let short = ca
        .issue(&Identity::Node("node-a".into()), validity)
        .expect("issue");
    let short_dir = env.path("node-a-short");
    write_issued(&short_dir, &short).expect("write");
    point_data_at(&tls, &short_dir, 2);
    eventually("the short-lived certificate in use", || async {
        let left = scrape(status)
            .await
            .value("csi_scsi_certificate_expiry_seconds", &[])?;
        (left < 60.0).then_some(())
    })
    .await;
    let body = eventually("unready once it expired", || async {
        let (code, body) = readiness(status).await;
        (code == 503).then_some(body)
    })
    .await;
    assert!(
        body.contains("[-] tls: ") && body.contains("has expired"),
        "{body}"
    );
    assert_eq!(
        scrape(status)
            .await
            .value("csi_scsi_certificate_expiry_seconds", &[]),
        Some(0.0)
    );

    // Rotation again brings it back.
    let renewed = env.pki.issue_agent("node-a", "node-a-renewed");
    point_data_at(&tls, &renewed, 3);
    eventually("ready after renewal", || async {
        (readiness(status).await.0 == 200).then_some(())
    })
    .await;
    assert!(
        scrape(status)
            .await
            .value("csi_scsi_certificate_expiry_seconds", &[])
            .is_some_and(|s| s > 86400.0)
    );
}

// === The CLI over a running agent and proxy ===

#[tokio::test]
async fn the_cli_prints_tables_and_json_from_a_running_agent_and_proxy() {
    let env = Env::new();
    let agent = env.start_agent("node-a").await;
    let agent_url = format!("http://{}", status_addr(&agent.daemon).await);
    let (_proxy, _csi, proxy_status) = start_proxy(&env, &format!("node-a {}\n", agent.api)).await;
    let proxy_url = proxy_status.to_string(); // without the scheme: also accepted

    let (ok, out, err) = cli(&agent_url, &["status"]).await;
    assert!(ok, "{err}");
    let line = |out: &str, key: &str| -> String {
        out.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in\n{out}"))[key.len()..]
            .trim()
            .to_owned()
    };
    assert_eq!(line(&out, "component"), "agent");
    assert_eq!(line(&out, "node"), "node-a");
    assert_eq!(line(&out, "ready"), "yes");

    let (ok, out, _) = cli(&agent_url, &["devices"]).await;
    assert!(ok);
    assert!(out.starts_with("WWID  SIZE"), "{out}");
    let (ok, out, _) = cli(&agent_url, &["volumes"]).await;
    assert!(ok);
    assert!(out.starts_with("STATE  VOLUME"), "{out}");
    let (ok, out, _) = cli(&agent_url, &["-o", "json", "volumes"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["staged"].is_array() && v["published"].is_array(), "{v}");
    let (ok, _, err) = cli(&agent_url, &["agents"]).await;
    assert!(!ok, "agents is the proxy's view");
    assert!(err.contains("point --url at the proxy"), "{err}");

    let (ok, out, err) = eventually("the proxy to probe its agent", || {
        let url = proxy_url.clone();
        async move {
            let r = cli(&url, &["agents"]).await;
            r.1.contains(" yes ").then_some(r)
        }
    })
    .await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    // Aligned: every column starts where its header does.
    let header = lines[0];
    for col in ["ADDRESS", "REACHABLE", "RTT", "VERSION"] {
        let at = header.find(col).expect("column");
        assert!(
            lines[1].len() > at
                && lines[1].as_bytes()[at - 1] == b' '
                && lines[1].as_bytes()[at] != b' ',
            "{col} misaligned:\n{out}"
        );
    }
    assert!(lines[1].starts_with("node-a "), "{out}");
    assert!(lines[1].contains(&agent.api.to_string()), "{out}");

    let (ok, out, _) = cli(&proxy_url, &["status"]).await;
    assert!(ok);
    assert_eq!(line(&out, "component"), "proxy");
    assert!(line(&out, "agents").starts_with("1 (1 reachable"), "{out}");
    let (ok, out, _) = cli(&proxy_url, &["-o", "json", "agents"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v[0]["node"], "node-a");
    let (ok, out, _) = cli(&proxy_url, &["-o", "json", "status"]).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (v["component"].as_str(), v["ready"].as_bool()),
        (Some("proxy"), Some(true)),
        "{v}"
    );

    let (ok, _, err) = cli(&format!("127.0.0.1:{}", free_port()), &["status"]).await;
    assert!(!ok);
    assert!(
        err.starts_with("csi-scsi: cannot connect to http://127.0.0.1:"),
        "{err}"
    );
}

// === Through a lab: request IDs across nodes, CHAP secrets nowhere ===

/// Every log a lab process wrote: the proxy's, each agent's, each kernel
/// stand-in's.
fn lab_logs(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files = vec![dir.join("proxy.log")];
    for entry in std::fs::read_dir(dir).expect("lab dir").flatten() {
        if entry.file_name().to_string_lossy().ends_with(".agent.log") {
            files.push(entry.path());
        }
    }
    for entry in std::fs::read_dir(dir.join("nodes"))
        .expect("nodes")
        .flatten()
    {
        files.push(entry.path().join("kernel.log"));
    }
    files
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f, text)
        })
        .collect()
}

#[tokio::test]
async fn a_request_id_follows_an_operation_across_nodes_and_chap_secrets_appear_nowhere() {
    let (_dir, lab, mut cl) = crate::lab::lab().await;
    let dir = lab.config.dir.clone();
    let secret_file = dir.join("secrets/chap-array-a/password");
    let secret = std::fs::read_to_string(&secret_file).expect("the lab's CHAP secret");
    assert!(
        secret.len() >= 12,
        "a secret long enough to grep for: {secret:?}"
    );
    let wrong = format!("wrong-{}-chap", fastrand_suffix());

    // Two volumes on array-a (the CHAP target): one for node-a, and one
    // for node-b big enough to need a2, the 1 GiB LUN only array-a exports
    // (the multipath LUN is reachable through array-b as well).
    let vol = create(
        &mut cl,
        "obs-a",
        100 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-a",
    )
    .await
    .expect("create");
    let vol_b = create(
        &mut cl,
        "obs-b",
        600 << 20,
        false,
        &[("deviceSelector", "array=a")],
        "node-b",
    )
    .await
    .expect("create");

    // A request ID on ControllerPublishVolume reaches node-a's agent (Attach).
    let rid = format!("obs-publish-{}", fastrand_suffix());
    cl.controller
        .controller_publish_volume(with_rid(
            ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "node-a".into(),
                volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
                ..Default::default()
            },
            &rid,
        ))
        .await
        .expect("publish");
    let agent_log = std::fs::read_to_string(dir.join("node-a.agent.log")).expect("agent log");
    let hits: Vec<&str> = agent_log.lines().filter(|l| l.contains(&rid)).collect();
    assert!(
        hits.iter()
            .any(|l| l.contains("Attach") && l.contains(vol.volume_context["wwid"].as_str())),
        "node-a's log has the Attach of {rid}:\n{}",
        hits.join("\n")
    );
    let proxy_log = std::fs::read_to_string(dir.join("proxy.log")).expect("proxy log");
    assert!(
        proxy_log
            .lines()
            .any(|l| l.contains(&rid) && l.contains("ControllerPublishVolume")),
        "the proxy logs {rid} too"
    );
    for other in ["node-b.agent.log", "node-c.agent.log"] {
        let log = std::fs::read_to_string(dir.join(other)).expect("log");
        assert!(!log.contains(&rid), "{other} took no part in {rid}");
    }

    // Staged and published, as the node's /status shows.
    let target = scenario::attach_and_mount(&lab, &mut cl, &vol, "node-a", false, "pod-obs")
        .await
        .expect("stage and publish");
    let node_a = get(lab.nodes[0].status, "/status").await.json();
    let wwid = vol.volume_context["wwid"].as_str();
    assert!(
        node_a["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .any(|d| d["wwid"] == wwid),
        "{node_a}"
    );
    let staged = &node_a["volumes"]["staged"];
    assert!(
        staged
            .as_array()
            .expect("staged")
            .iter()
            .any(|v| v["wwid"] == wwid && v["fs_type"] == "xfs"),
        "{node_a}"
    );
    let published = node_a["volumes"]["published"]
        .as_array()
        .expect("published");
    // The document is unauthenticated: a pod's UID (here the pod name the
    // test used in its place) is shown as `*`, and no initiator name.
    let shown = target
        .display()
        .to_string()
        .replace("/pods/pod-obs/", "/pods/*/");
    assert!(
        published
            .iter()
            .any(|v| v["wwid"] == wwid && v["path"] == shown.as_str()),
        "{node_a}"
    );
    assert!(!node_a.to_string().contains("pod-obs"), "{node_a}");
    assert!(
        !node_a.to_string().contains(":node-a\""),
        "no initiator name: {node_a}"
    );
    assert!(
        node_a["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .any(|s| s["state"] == "LOGGED_IN"),
        "{node_a}"
    );
    // The test reads from the lab's bridge, not loopback: the agent names
    // no target IQN or portal to it (issue 36: the open port tells a
    // reader off the machine less).
    assert_eq!(node_a["redacted"], true, "{node_a}");
    assert!(
        !node_a.to_string().contains("iqn.2026-11.io.csi-scsi.lab")
            && !node_a.to_string().contains(":3260"),
        "no target IQN or portal off the node: {node_a}"
    );
    let metrics = scrape(lab.nodes[0].status).await;
    assert!(calls(&metrics, "csi.agent.v1.Agent", "Attach", "OK") >= 1.0);
    assert!(
        metrics
            .value("csi_scsi_volumes", &[("state", "published")])
            .is_some_and(|n| n >= 1.0)
    );
    let (ok, out, err) = cli(&format!("http://{}", lab.nodes[0].status), &["volumes"]).await;
    assert!(
        ok && out.contains(wwid) && out.contains("/pods/*/") && !out.contains("pod-obs"),
        "{out}{err}"
    );

    // A wrong secret: node-b's session to array-a ends and has to log in again.
    std::fs::write(&secret_file, &wrong).expect("wrong secret");
    lab.logout_iscsi(1, "array-a").expect("logout");
    let rid_b = format!("obs-wrong-chap-{}", fastrand_suffix());
    let err = cl
        .controller
        .controller_publish_volume(with_rid(
            ControllerPublishVolumeRequest {
                volume_id: vol_b.volume_id.clone(),
                node_id: "node-b".into(),
                volume_capability: Some(capability(false, "xfs", Mode::SingleNodeWriter)),
                ..Default::default()
            },
            &rid_b,
        ))
        .await
        .expect_err("the login is refused");
    let mut errors = vec![format!("{err:?}"), err.message().to_owned()];
    // Discovery meets the wrong secret on node-b too.
    let node_b = eventually("node-b's agent to record the refused login", || async {
        let doc = get(lab.nodes[1].status, "/status").await.json();
        let n = doc["recent_errors"].as_array()?.len();
        (n > 0).then_some(doc)
    })
    .await;
    let proxy = eventually("the proxy to record the failed publish", || async {
        let doc = get(lab.proxy_status, "/status").await.json();
        doc["recent_errors"]
            .as_array()?
            .iter()
            .any(|e| e["request_id"] == rid_b.as_str())
            .then_some(doc)
    })
    .await;
    for doc in [&node_b, &proxy] {
        for e in doc["recent_errors"].as_array().expect("errors") {
            errors.push(e["message"].as_str().unwrap_or("").to_owned());
        }
    }
    assert!(
        errors
            .iter()
            .any(|e| e.contains("auth") || e.contains("login") || e.contains("refused")),
        "the errors say why: {errors:#?}"
    );
    std::fs::write(&secret_file, &secret).expect("secret restored");

    // Nowhere: logs, every /status and /metrics, CLI output, errors.
    let mut documents: Vec<(String, String)> = lab_logs(&dir)
        .into_iter()
        .map(|(f, t)| (f.display().to_string(), t))
        .collect();
    let mut endpoints = vec![lab.proxy_status];
    endpoints.extend(lab.nodes.iter().map(|n| n.status));
    for addr in endpoints {
        for path in ["/status", "/metrics", "/readyz"] {
            documents.push((format!("http://{addr}{path}"), get(addr, path).await.body));
        }
        for cmd in ["status", "devices", "volumes", "errors"] {
            let (_, out, err) = cli(&addr.to_string(), &[cmd]).await;
            documents.push((format!("csi-scsi {cmd} on {addr}"), format!("{out}{err}")));
        }
    }
    documents.push(("error messages".into(), errors.join("\n")));
    documents.push(("agent status (proxy view)".into(), proxy.to_string()));
    for (name, text) in &documents {
        for s in [secret.trim(), wrong.as_str()] {
            assert!(!text.contains(s), "{name} contains a CHAP secret");
        }
    }
    // Off the machine (the test reads from the lab's bridge), the proxy
    // lists the CHAP target by name without its portals, IQN or Secret's
    // name, and errors without their messages (which quote them).
    assert_eq!(proxy["redacted"], true, "{proxy}");
    let text = proxy.to_string();
    assert!(
        proxy["targets"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "array-a")),
        "{proxy}"
    );
    for hidden in ["chap-array-a", "iqn.2026-11.io.csi-scsi.lab", ":3260"] {
        assert!(!text.contains(hidden), "{hidden} off the machine: {proxy}");
    }
    assert!(
        proxy["recent_errors"]
            .as_array()
            .expect("errors")
            .iter()
            .all(|e| e["message"] == ""),
        "{proxy}"
    );
    // The secrets did travel: the target refused node-b's login with the
    // wrong one (the record that held it is deleted with the session).
    assert!(
        errors
            .iter()
            .any(|e| e.contains("failed authentication or authorization")),
        "the wrong secret reached the target: {errors:?}"
    );
}

fn fastrand_suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}
