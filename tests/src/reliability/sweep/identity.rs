//! Identity, on the proxy and every agent: control calls, and requests
//! carrying unknown fields, which proto3 skips.

use csi_scsi_proto::csi::identity_client::IdentityClient;
use csi_scsi_proto::csi::{GetPluginCapabilitiesRequest, GetPluginInfoRequest, ProbeRequest};

use super::codes::OK;
use super::wire::{raw, unknown_fields};
use super::{IDENTITY, Sweep};
use crate::csi_client::csi_channel;
use crate::lab::Lab;

/// Sends every Identity RPC to every socket of the lab.
pub(super) async fn sweep(
    sw: &mut Sweep,
    lab: &Lab,
    rng: &mut fastrand::Rng,
) -> anyhow::Result<()> {
    let mut sockets = vec![("proxy".to_owned(), lab.proxy_csi.clone())];
    sockets.extend(lab.nodes.iter().map(|n| (n.name.clone(), n.csi.clone())));
    for (who, socket) in sockets {
        let channel = csi_channel(&socket).await?;
        let mut c = IdentityClient::new(channel.clone());
        let control = format!("{who}: control");
        if let Some(info) = sw.send(&mut c, &control, GetPluginInfoRequest {}, OK).await {
            // GetPluginInfo: name and vendor_version are REQUIRED.
            sw.holds(
                !info.name.is_empty() && !info.vendor_version.is_empty(),
                || format!("{who}: GetPluginInfo without name or version: {info:?}"),
            );
        }
        sw.send(&mut c, &control, GetPluginCapabilitiesRequest {}, OK)
            .await;
        sw.send(&mut c, &control, ProbeRequest {}, OK).await;
        for rpc in ["GetPluginInfo", "GetPluginCapabilities", "Probe"] {
            let path = format!("/csi.v1.Identity/{rpc}");
            let r = raw(channel.clone(), &path, unknown_fields(rng), false).await;
            sw.check(IDENTITY, rpc, &format!("{who}: unknown fields"), &r, OK);
        }
    }
    Ok(())
}
