//! After the sweep: nothing it sent touched a device, a path outside the
//! kubelet directory, or a published volume; nothing leaked a secret; and
//! every service still answers.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use csi_scsi_proto::agent::{self as api, agent_client::AgentClient};
use csi_scsi_proto::csi::ProbeRequest;
use csi_scsi_proto::csi::identity_client::IdentityClient;
use tonic::Status;
use tonic::transport::Channel;

use super::codes::OK;
use super::fixture::{Fixture, HEAD, head_digest};
use super::requests::get_volume;
use super::rpc::Rpc;
use super::{IDENTITY, NODE, Sweep};
use crate::csi_client::csi_channel;
use crate::lab::Lab;
use crate::lab::scenario::{Clients, lun_file};

/// Checks the invariants; `heads` are the LUN digests from before.
pub(super) async fn check(
    sw: &mut Sweep,
    lab: &Lab,
    cl: &mut Clients,
    fx: &Fixture,
    heads: &BTreeMap<String, [u8; 16]>,
    mut a: AgentClient<Channel>,
) -> anyhow::Result<()> {
    for (name, before) in heads {
        let after = head_digest(&lab.luns[name])?;
        sw.holds(after == *before, || {
            format!("LUN {name}: its first MiB changed during the sweep")
        });
    }
    let back = std::fs::read(fx.fs_target.join("sweep.bin")).unwrap_or_default();
    sw.holds(back == fx.payload, || {
        "the fs fixture's file no longer reads back".into()
    });
    let mut head = vec![0u8; HEAD];
    let read = std::fs::File::open(&fx.raw_target).and_then(|mut f| {
        f.seek(SeekFrom::Start(0))
            .and_then(|_| f.read_exact(&mut head))
    });
    sw.holds(read.is_ok() && head == fx.pattern, || {
        format!("the raw fixture no longer reads back through its target: {read:?}")
    });
    let empty = std::fs::read_dir(&fx.outside).map(|mut d| d.next().is_none());
    sw.holds(matches!(empty, Ok(true)), || {
        format!("{} is no longer empty", fx.outside.display())
    });
    for s in &fx.strays {
        sw.holds(!s.exists(), || format!("{} was created", s.display()));
    }
    for v in [&fx.fs, &fx.raw] {
        let case = "control: a fixture after the sweep";
        if let Some(g) = sw
            .send(&mut cl.controller, case, get_volume(&v.volume_id), OK)
            .await
        {
            let nodes = g
                .status
                .as_ref()
                .map(|s| s.published_node_ids.clone())
                .unwrap_or_default();
            sw.holds(nodes == [NODE], || {
                format!("{} is published on {nodes:?} after the sweep", v.volume_id)
            });
        }
    }
    // Every LUN node-a saw is still there (a wrong-WWID attach at a LUN's
    // address removes a stale path, then the rescan must bring it back).
    let want: Vec<String> = lab
        .luns
        .keys()
        .filter(|n| ["a1", "a2", "mp", "b1"].contains(&n.as_str()))
        .cloned()
        .collect();
    let start = Instant::now();
    let missing = loop {
        let seen: Vec<String> = api::StatusRequest {}
            .send(&mut a)
            .await
            .map(|s| {
                s.devices
                    .iter()
                    .filter_map(|d| lun_file(lab, &d.wwid).map(|(n, _)| n))
                    .collect()
            })
            .unwrap_or_default();
        let missing: Vec<String> = want.iter().filter(|n| !seen.contains(n)).cloned().collect();
        if missing.is_empty() || start.elapsed() > Duration::from_secs(10) {
            break missing;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sw.holds(missing.is_empty(), || {
        format!("node-a no longer sees LUNs {missing:?}")
    });
    // Secrets never reach a log (proto: "never logged").
    for log in std::iter::once(lab.config.dir.join("proxy.log")).chain(
        lab.nodes
            .iter()
            .map(|n| lab.config.dir.join(format!("{}.agent.log", n.name))),
    ) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for s in &sw.secrets.clone() {
            sw.holds(!text.contains(s.as_str()), || {
                format!("{} holds a secret", log.display())
            });
        }
    }
    // Still serving: Probe answers everywhere.
    let mut sockets = vec![lab.proxy_csi.clone()];
    sockets.extend(lab.nodes.iter().map(|n| n.csi.clone()));
    for s in sockets {
        let r = match csi_channel(&s).await {
            Ok(ch) => ProbeRequest {}.send(&mut IdentityClient::new(ch)).await,
            Err(e) => Err(Status::unavailable(e.to_string())),
        };
        sw.check(
            IDENTITY,
            "Probe",
            &format!("{} after the sweep", s.display()),
            &r,
            OK,
        );
    }
    Ok(())
}
