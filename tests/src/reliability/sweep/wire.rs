//! Raw bytes on the wire: every RPC's path sent unknown fields (skipped:
//! the answer is the empty request's), undecodable bytes and a message
//! over the size limit, and sockets sent services they do not serve.

use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::codes::*;
use super::fixture::agent_channel;
use super::{CALL_LIMIT, Sweep, WIRE};
use crate::csi_client::csi_channel;
use crate::lab::Lab;

/// A message over the servers' 4 MiB gRPC receive limit.
const OVERSIZED: usize = 5 << 20;

/// An RPC's path, the code an empty request gets, and whether it streams
/// its answer.
pub(super) struct WireRpc {
    path: &'static str,
    empty: &'static [Code],
    streaming: bool,
}

const fn rpc(path: &'static str, empty: &'static [Code]) -> WireRpc {
    WireRpc {
        path,
        empty,
        streaming: false,
    }
}

/// Controller RPCs: an empty request misses a required field (3), asks
/// for a page or the capacity (0), or is not implemented (12).
const CONTROLLER_RPCS: &[WireRpc] = &[
    rpc("/csi.v1.Controller/CreateVolume", INVALID),
    rpc("/csi.v1.Controller/DeleteVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerPublishVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerUnpublishVolume", INVALID),
    rpc("/csi.v1.Controller/ValidateVolumeCapabilities", INVALID),
    rpc("/csi.v1.Controller/ListVolumes", OK),
    rpc("/csi.v1.Controller/GetCapacity", OK),
    rpc("/csi.v1.Controller/ControllerGetCapabilities", OK),
    rpc("/csi.v1.Controller/CreateSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/DeleteSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/ListSnapshots", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/GetSnapshot", UNIMPLEMENTED),
    rpc("/csi.v1.Controller/ControllerExpandVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerGetVolume", INVALID),
    rpc("/csi.v1.Controller/ControllerModifyVolume", UNIMPLEMENTED),
];

/// Node RPCs.
const NODE_RPCS: &[WireRpc] = &[
    rpc("/csi.v1.Node/NodeStageVolume", INVALID),
    rpc("/csi.v1.Node/NodeUnstageVolume", INVALID),
    rpc("/csi.v1.Node/NodePublishVolume", INVALID),
    rpc("/csi.v1.Node/NodeUnpublishVolume", INVALID),
    rpc("/csi.v1.Node/NodeGetVolumeStats", INVALID),
    rpc("/csi.v1.Node/NodeExpandVolume", INVALID),
    rpc("/csi.v1.Node/NodeGetCapabilities", OK),
    rpc("/csi.v1.Node/NodeGetInfo", OK),
];

/// Agent API RPCs: agent.proto, INVALID_ARGUMENT for a malformed WWID or
/// target (an empty one included).
const AGENT_RPCS: &[WireRpc] = &[
    rpc("/csi.agent.v1.Agent/Discover", INVALID),
    rpc("/csi.agent.v1.Agent/Attach", INVALID),
    rpc("/csi.agent.v1.Agent/Detach", INVALID),
    WireRpc {
        path: "/csi.agent.v1.Agent/Wipe",
        empty: INVALID,
        streaming: true,
    },
    rpc("/csi.agent.v1.Agent/Rescan", INVALID),
    rpc("/csi.agent.v1.Agent/Status", OK),
];

/// Services a socket does not serve: "Call not implemented" (12).
const UNSERVED: &[(&str, &[&str])] = &[
    (
        "proxy",
        &[
            "/csi.v1.Node/NodeStageVolume",
            "/csi.v1.Node/NodeGetInfo",
            "/csi.v1.GroupController/GroupControllerGetCapabilities",
            "/csi.v1.GroupController/CreateVolumeGroupSnapshot",
            "/csi.v1.GroupController/DeleteVolumeGroupSnapshot",
            "/csi.v1.GroupController/GetVolumeGroupSnapshot",
        ],
    ),
    (
        "node",
        &[
            "/csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/DeleteVolume",
            "/csi.v1.Controller/ControllerPublishVolume",
        ],
    ),
];

/// A channel to each service with its RPCs: the proxy's Controller,
/// node-a's Node, node-a's agent API.
pub(super) async fn channels(lab: &Lab) -> anyhow::Result<[(Channel, &'static [WireRpc]); 3]> {
    Ok([
        (csi_channel(&lab.proxy_csi).await?, CONTROLLER_RPCS),
        (csi_channel(&lab.nodes[0].csi).await?, NODE_RPCS),
        (agent_channel(lab)?, AGENT_RPCS),
    ])
}

/// Raw bytes to every RPC of every service in `wires` (as [`channels`]
/// orders them), one message over the size limit per service, and
/// services a socket does not serve.
pub(super) async fn sweep(
    sw: &mut Sweep,
    wires: &[(Channel, &[WireRpc])],
    rng: &mut fastrand::Rng,
) {
    let proxy = &wires[0].0;
    let node = &wires[1].0;
    for (channel, rpcs) in wires {
        every_rpc(sw, channel, rpcs, rng).await;
        // One message over the receive limit per service.
        let big = oversized(rng);
        let res = raw(channel.clone(), rpcs[0].path, big, rpcs[0].streaming).await;
        sw.check(WIRE, rpcs[0].path, "a 5 MiB message", &res, TOO_LARGE);
    }
    for (who, paths) in UNSERVED {
        let channel = if *who == "proxy" { proxy } else { node };
        for path in *paths {
            let res = raw(channel.clone(), path, Vec::new(), false).await;
            sw.check(
                WIRE,
                path,
                &format!("sent to the {who} socket"),
                &res,
                UNIMPLEMENTED,
            );
        }
    }
}

/// Sends each of `rpcs` one request of unknown fields and one of
/// undecodable bytes.
pub(super) async fn every_rpc(
    sw: &mut Sweep,
    channel: &Channel,
    rpcs: &[WireRpc],
    rng: &mut fastrand::Rng,
) {
    for rpc in rpcs {
        let body = unknown_fields(rng);
        let res = raw(channel.clone(), rpc.path, body, rpc.streaming).await;
        sw.check(WIRE, rpc.path, "only unknown fields", &res, rpc.empty);
        let body = undecodable(rng);
        let res = raw(channel.clone(), rpc.path, body, rpc.streaming).await;
        sw.check(WIRE, rpc.path, "undecodable bytes", &res, UNDECODABLE);
    }
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Fields no message of either API defines (numbers from 10000), in every
/// valid wire type: a decoder must skip them.
pub(super) fn unknown_fields(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.usize(1..6) {
        let field = rng.u64(10_000..500_000);
        match rng.u8(..4) {
            0 => {
                varint(field << 3, &mut out);
                varint(rng.u64(..), &mut out);
            }
            1 => {
                varint((field << 3) | 1, &mut out);
                out.extend(rng.u64(..).to_le_bytes());
            }
            2 => {
                let n = rng.usize(..64);
                varint((field << 3) | 2, &mut out);
                varint(n as u64, &mut out);
                out.extend((0..n).map(|_| rng.u8(..)));
            }
            _ => {
                varint((field << 3) | 5, &mut out);
                out.extend(rng.u32(..).to_le_bytes());
            }
        }
    }
    out
}

/// Bytes no protobuf decoder accepts: a tag for field 0, an invalid wire
/// type, or a length running past the end.
fn undecodable(rng: &mut fastrand::Rng) -> Vec<u8> {
    let tail: Vec<u8> = (0..rng.usize(..64)).map(|_| rng.u8(..)).collect();
    let mut out = Vec::new();
    match rng.u8(..3) {
        0 => out.push(0),
        1 => out.push((1 << 3) | 7),
        _ => {
            out.push((1 << 3) | 2);
            varint(tail.len() as u64 + 1 + rng.u64(..1000), &mut out);
        }
    }
    out.extend(tail);
    out
}

/// A message of unknown fields over the 4 MiB receive limit.
fn oversized(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(OVERSIZED + 16);
    varint((12_345 << 3) | 2, &mut out);
    varint(OVERSIZED as u64, &mut out);
    out.extend((0..OVERSIZED).map(|_| rng.u8(..)));
    out
}

/// Bytes in, bytes out: a codec that sends whatever it is given.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut v = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

/// Calls `path` with `body` as the request message.
pub(super) async fn raw(
    channel: Channel,
    path: &str,
    body: Vec<u8>,
    streaming: bool,
) -> Result<(), Status> {
    let path = PathAndQuery::try_from(path.to_owned())
        .map_err(|e| Status::internal(format!("sweep: bad path: {e}")))?;
    let fut = async {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("sweep: channel not ready: {e}")))?;
        if streaming {
            let mut s = grpc
                .server_streaming(tonic::Request::new(body), path, RawCodec)
                .await?
                .into_inner();
            while s.message().await?.is_some() {}
        } else {
            grpc.unary(tonic::Request::new(body), path, RawCodec)
                .await?;
        }
        Ok(())
    };
    match tokio::time::timeout(CALL_LIMIT, fut).await {
        Ok(r) => r,
        Err(_) => Err(Status::deadline_exceeded("sweep: no answer")),
    }
}
