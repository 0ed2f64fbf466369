//! Row 3, inventory scale: CreateVolume + DeleteVolume (cleanup `none`)
//! through the real proxy binary over its CSI socket, on an embedded store
//! pre-filled the way discovery fills it with 500, 5,000 and 50,000
//! devices; then CreateVolume throughput with 16 concurrent clients (each
//! its own connection) against one client, on the largest store. Also
//! row 4's proxy memory: the proxy's resident memory holding each store,
//! after the workload, a GetCapacity and a full ListVolumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use csi_scsi_proto::csi::controller_client::ControllerClient;
use csi_scsi_proto::csi::{DeleteVolumeRequest, GetCapacityRequest, ListVolumesRequest};
use csi_scsi_proxy::device::{DiscoveryRound, LunReport, NewLuns};
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use tonic::transport::Channel;

use super::Options;
use super::fixture::{create_request, start_proxy};
use super::proc::rss_mib;
use super::stats::{Samples, us};
use super::table::{Row, Target, Unit};
use crate::csi_client::csi_channel;
use crate::pki::Pki;

/// Concurrent clients of the throughput row.
const CLIENTS: usize = 16;

/// Runs row 3 (and the proxy half of row 4).
pub async fn run(opts: Options, dir: PathBuf) -> Vec<Row> {
    measure(opts, &dir).await.unwrap_or_else(|e| {
        vec![Row::error(
            3,
            "CreateVolume + DeleteVolume",
            format!("{e:#}"),
        )]
    })
}

/// Fills the store at `path` with `n` 1 GiB devices seen from node-a,
/// labelled tier=fast, in one discovery round (as one target reporting
/// them would).
pub async fn fill(path: &Path, n: u32) -> anyhow::Result<()> {
    let inv = Inventory::new(std::sync::Arc::new(EmbeddedInventory::open(path)?));
    let luns = (0..n)
        .map(|i| -> anyhow::Result<LunReport> {
            Ok(LunReport {
                wwid: csi_scsi_contract::Wwid::parse(&format!("naa.6001405{i:025x}"))?,
                lun: i,
                size_bytes: 1 << 30,
                vendor: "LIO-ORG".into(),
                model: "disk".into(),
                serial: format!("sn{i}"),
                paths: vec![format!(
                    "ip-198.18.0.1:3260-iscsi-iqn.2026-11.io.csi-scsi.bench:t-lun-{i}"
                )],
            })
        })
        .collect::<anyhow::Result<_>>()?;
    inv.apply_discovery(DiscoveryRound {
        target: "t".into(),
        device_labels: BTreeMap::from([("tier".into(), "fast".into())]),
        answered: BTreeMap::from([(csi_scsi_contract::NodeName::parse("node-a")?, luns)]),
        unanswered: Vec::new(),
        same_array: Default::default(),
        // The row measures binds, not probes: the LUNs are offered at once.
        new_luns: NewLuns::Trust,
    })
    .await?;
    Ok(())
}

struct Size {
    devices: u32,
    pairs: Samples,
    creates: Samples,
    deletes: Samples,
    rss: f64,
    peak: f64,
    fill: Duration,
}

async fn create_delete(
    c: &mut ControllerClient<Channel>,
    name: &str,
) -> anyhow::Result<(Duration, Duration)> {
    let t = Instant::now();
    let vol = c
        .create_volume(create_request(name, "node-a"))
        .await
        .with_context(|| format!("CreateVolume {name}"))?
        .into_inner()
        .volume
        .context("no volume")?;
    let created = t.elapsed();
    c.delete_volume(DeleteVolumeRequest {
        volume_id: vol.volume_id,
        secrets: Default::default(),
    })
    .await
    .with_context(|| format!("DeleteVolume {name}"))?;
    Ok((created, t.elapsed() - created))
}

async fn measure(opts: Options, dir: &Path) -> anyhow::Result<Vec<Row>> {
    let sizes: Vec<u32> = opts.pick(vec![500, 5_000, 50_000], vec![500, 2_000]);
    let pairs = opts.pick(300, 40);
    let pki = Pki::init(dir);
    let tls = pki.issue_proxy("proxy-tls");
    let mut results: Vec<Size> = Vec::new();
    let mut throughput = None;
    for (k, &devices) in sizes.iter().enumerate() {
        let sdir = dir.join(format!("store-{devices}"));
        std::fs::create_dir_all(&sdir)?;
        let t = Instant::now();
        fill(&sdir.join("inventory.db"), devices).await?;
        let fill_time = t.elapsed();
        // An agent nobody listens for: nothing here calls agents.
        std::fs::write(sdir.join("agents.txt"), "node-a 127.0.0.1:9\n")?;
        let mut proxy = start_proxy(&sdir, &tls, None).await?;
        let mut c = proxy.controller.clone();
        for i in 0..20 {
            create_delete(&mut c, &format!("pv-warm-{i}")).await?;
        }
        let (mut pair, mut creates, mut deletes) = (
            Samples::with_capacity(pairs),
            Samples::with_capacity(pairs),
            Samples::with_capacity(pairs),
        );
        for i in 0..pairs {
            let (cr, de) = create_delete(&mut c, &format!("pv-{i}")).await?;
            pair.push(cr + de);
            creates.push(cr);
            deletes.push(de);
        }
        if k + 1 == sizes.len() {
            throughput = Some(create_throughput(opts, &mut c, &proxy.csi).await?);
        }
        // What the proxy holds with this store, after a GetCapacity and a
        // full ListVolumes (the sidecars' periodic reads).
        c.get_capacity(GetCapacityRequest::default()).await?;
        let mut token = String::new();
        loop {
            let page = c
                .list_volumes(ListVolumesRequest {
                    max_entries: 500,
                    starting_token: token,
                })
                .await?
                .into_inner();
            if page.next_token.is_empty() {
                break;
            }
            token = page.next_token;
        }
        proxy.proc.check_alive()?;
        let (rss, peak) = rss_mib(proxy.proc.pid())?;
        results.push(Size {
            devices,
            pairs: pair,
            creates,
            deletes,
            rss,
            peak,
            fill: fill_time,
        });
    }
    let first = results.first().context("no sizes")?;
    let last = results.last().context("no sizes")?;
    let mut rows = Vec::new();
    for s in &results {
        let mut row = Row::new(
            3,
            if s.devices == first.devices {
                format!(
                    "CreateVolume + DeleteVolume p99, {} devices (the baseline)",
                    s.devices
                )
            } else {
                format!(
                    "CreateVolume + DeleteVolume p99, {} devices (vs {})",
                    s.devices, first.devices
                )
            },
            Unit::Micros,
            us(s.pairs.p99()),
        );
        if s.devices != first.devices {
            row = row.baseline(us(first.pairs.p99()));
        }
        if s.devices == last.devices && results.len() > 1 {
            row = row.target(Target::RatioAtMost(2.0));
        }
        rows.push(row.note(format!(
            "{} sequential pairs after 20 warm-up pairs; pair p50 {:.0} µs; create p50/p99 {:.0}/{:.0} µs, \
             delete p50/p99 {:.0}/{:.0} µs; filling the store took {:.2} s",
            s.pairs.len(),
            us(s.pairs.p50()),
            us(s.creates.p50()),
            us(s.creates.p99()),
            us(s.deletes.p50()),
            us(s.deletes.p99()),
            s.fill.as_secs_f64()
        )));
    }
    if let Some((one, many, total)) = throughput {
        rows.push(
            Row::new(3, format!("CreateVolume throughput, {CLIENTS} clients, {} devices (vs 1 client)", last.devices), Unit::OpsPerSec, many)
                .baseline(one)
                .note(format!(
                    "{total} creates from {CLIENTS} clients, each on its own connection, in a fixed time box, against \
                     sequential creates from one client; binds are compare-and-swap writes to one SQLite file (WAL, full sync)"
                )),
        );
    }
    rows.push(
        Row::new(4, format!("proxy RSS holding {} devices (vs {} devices)", last.devices, first.devices), Unit::Mebibytes, last.rss)
            .baseline(first.rss)
            .target(Target::AtMost(256.0))
            .note(format!(
                "VmRSS after the row-3 workload, a GetCapacity and a full ListVolumes; peak (VmHWM) {:.1} MiB",
                last.peak
            )),
    );
    Ok(rows)
}

/// Creates per second: one client for a while, then [`CLIENTS`] at once
/// for a while (time-boxed, so a slow store cannot stretch the run).
async fn create_throughput(
    opts: Options,
    c: &mut ControllerClient<Channel>,
    csi: &Path,
) -> anyhow::Result<(f64, f64, usize)> {
    let (alone, together) = opts.pick(
        (Duration::from_secs(4), Duration::from_secs(6)),
        (Duration::from_millis(500), Duration::from_secs(1)),
    );
    let t = Instant::now();
    let mut single = 0usize;
    // A store that runs out of devices ends the time box early (fast binds
    // on a small --quick store): the rate is over the time actually used.
    while t.elapsed() < alone {
        match c
            .create_volume(create_request(&format!("pv-one-{single}"), "node-a"))
            .await
        {
            Ok(_) => single += 1,
            Err(s) if s.code() == tonic::Code::ResourceExhausted => break,
            Err(s) => return Err(s.into()),
        }
    }
    let one = single as f64 / t.elapsed().as_secs_f64();
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(ControllerClient::new(csi_channel(csi).await?));
    }
    let t = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(k, mut c)| {
            tokio::spawn(async move {
                let mut done = 0usize;
                while t.elapsed() < together {
                    match c
                        .create_volume(create_request(&format!("pv-many-{k}-{done}"), "node-a"))
                        .await
                    {
                        Ok(_) => done += 1,
                        Err(s) if s.code() == tonic::Code::ResourceExhausted => break,
                        Err(s) => return Err(s),
                    }
                }
                Ok::<_, tonic::Status>(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    let many = total as f64 / t.elapsed().as_secs_f64();
    Ok((one, many, total))
}
