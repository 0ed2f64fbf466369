//! Raw CSI messages into typed values: capabilities, topology, capacity,
//! request IDs. A failure names the field.

use csi_scsi_proto::csi::volume_capability::AccessType;
use csi_scsi_proto::csi::volume_capability::access_mode::Mode as CsiMode;
use csi_scsi_proto::csi::{TopologyRequirement, VolumeCapability};

use crate::error::ProxyError;
use crate::lifecycle::NODE_TOPOLOGY_KEY;
use crate::lifecycle::access::{Access, Mode};
use crate::parameters;

fn invalid(field: &'static str, reason: impl Into<String>) -> ProxyError {
    ProxyError::InvalidArgument {
        field,
        reason: reason.into(),
    }
}

/// A required non-empty string field.
pub fn required<'a>(field: &'static str, value: &'a str) -> Result<&'a str, ProxyError> {
    if value.is_empty() {
        Err(invalid(field, "is required"))
    } else {
        Ok(value)
    }
}

/// One capability.
pub fn access(cap: &VolumeCapability) -> Result<Access, ProxyError> {
    let mode = match cap.access_mode.as_ref().map(|m| CsiMode::try_from(m.mode)) {
        Some(Ok(CsiMode::SingleNodeWriter)) => Mode::SingleNodeWriter,
        Some(Ok(CsiMode::SingleNodeReaderOnly)) => Mode::SingleNodeReaderOnly,
        Some(Ok(CsiMode::MultiNodeReaderOnly)) => Mode::MultiNodeReaderOnly,
        Some(Ok(CsiMode::MultiNodeSingleWriter)) => Mode::MultiNodeSingleWriter,
        Some(Ok(CsiMode::MultiNodeMultiWriter)) => Mode::MultiNodeMultiWriter,
        Some(Ok(CsiMode::SingleNodeSingleWriter)) => Mode::SingleNodeSingleWriter,
        Some(Ok(CsiMode::SingleNodeMultiWriter)) => Mode::SingleNodeMultiWriter,
        Some(Ok(CsiMode::Unknown)) | Some(Err(_)) => {
            return Err(invalid(
                "volume_capability.access_mode",
                "unknown access mode",
            ));
        }
        None => return Err(invalid("volume_capability.access_mode", "is required")),
    };
    let (block, fs_type) = match &cap.access_type {
        Some(AccessType::Block(_)) => (true, None),
        Some(AccessType::Mount(m)) => {
            let fs = if m.fs_type.is_empty() {
                None
            } else {
                Some(
                    parameters::fs_type(&m.fs_type)
                        .map_err(|e| invalid("volume_capability.mount.fs_type", e.to_string()))?,
                )
            };
            (false, fs)
        }
        None => {
            return Err(invalid(
                "volume_capability.access_type",
                "is required (block or mount)",
            ));
        }
    };
    let access = Access {
        block,
        fs_type,
        mode,
    };
    if let Some(why) = access.unsupported() {
        return Err(invalid("volume_capability", why));
    }
    Ok(access)
}

/// Every capability of a request; at least one.
pub fn accesses(caps: &[VolumeCapability]) -> Result<Vec<Access>, ProxyError> {
    if caps.is_empty() {
        return Err(invalid("volume_capabilities", "at least one is required"));
    }
    caps.iter().map(access).collect()
}

/// Nodes from accessibility requirements, preferred first, then the rest
/// of requisite; empty when there are none.
pub fn topology_nodes(req: Option<&TopologyRequirement>) -> Result<Vec<String>, ProxyError> {
    let Some(req) = req else {
        return Ok(Vec::new());
    };
    let mut nodes: Vec<String> = Vec::new();
    for t in req.preferred.iter().chain(req.requisite.iter()) {
        for key in t.segments.keys() {
            if key != NODE_TOPOLOGY_KEY {
                return Err(invalid(
                    "accessibility_requirements",
                    format!("unknown topology key {key:?} (only {NODE_TOPOLOGY_KEY})"),
                ));
            }
        }
        if let Some(node) = t.segments.get(NODE_TOPOLOGY_KEY)
            && !nodes.contains(node)
        {
            nodes.push(node.clone());
        }
    }
    Ok(nodes)
}

/// `(required, limit)` bytes; 0 means unset.
pub fn capacity(
    range: Option<&csi_scsi_proto::csi::CapacityRange>,
) -> Result<(u64, u64), ProxyError> {
    let Some(r) = range else { return Ok((0, 0)) };
    let required = u64::try_from(r.required_bytes)
        .map_err(|_| invalid("capacity_range.required_bytes", "is negative"))?;
    let limit = u64::try_from(r.limit_bytes)
        .map_err(|_| invalid("capacity_range.limit_bytes", "is negative"))?;
    if limit != 0 && limit < required {
        return Err(ProxyError::CapacityOutOfRange(format!(
            "limit_bytes {limit} is below required_bytes {required}"
        )));
    }
    Ok((required, limit))
}

/// The caller's request ID (`x-request-id`), or a new one.
pub fn request_id<T>(req: &tonic::Request<T>) -> String {
    req.metadata()
        .get(crate::agents::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}
