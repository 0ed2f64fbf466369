//! CreateVolume: bind an Available LUN to a new volume, idempotently by name.

use std::collections::BTreeMap;

use super::Lifecycle;
use super::LockKey;
use crate::device::{Access, BindRequest, Binding, Capability, Device, FsType, Placement, policy};
use crate::error::ProxyError;
use crate::inventory::InventoryError;
use crate::parameters::ClassParameters;

/// A parsed CreateVolume request.
#[derive(Clone, Debug)]
pub struct CreateRequest {
    /// The request name (the PV name).
    pub name: String,
    /// `required_bytes` (0: any size).
    pub required_bytes: u64,
    /// `limit_bytes` (0: no limit).
    pub limit_bytes: u64,
    /// Requested capabilities.
    pub access: Vec<Access>,
    /// StorageClass parameters.
    pub parameters: ClassParameters,
    /// Where the LUN may be seen from, and in which order to look.
    pub placement: Placement,
}

impl Lifecycle {
    /// Binds a LUN (or returns the one already bound to this name).
    pub async fn create(&self, req: CreateRequest) -> Result<Device, ProxyError> {
        let _guard = self.lock(LockKey::Name(req.name.clone())).await?;
        let default_fs = req.parameters.fs_type.unwrap_or(FsType::DEFAULT);
        let capabilities: Vec<Capability> =
            req.access.iter().map(|a| a.resolve(default_fs)).collect();
        // "If a volume corresponding to the specified volume name already
        // exists, is accessible from accessibility_requirements, and is
        // compatible with the specified capacity_range, volume_capabilities,
        // parameters and mutable_parameters ... the Plugin MUST reply 0 OK."
        if let Some(existing) = self.inventory.bound_to_name(&req.name).await? {
            return compatible(&existing, &req, &capabilities).map(|()| existing);
        }
        // "Unsupported capacity_range: OUT_OF_RANGE ... Caller MUST fix the
        // capacity range": no LUN under the limit could take the filesystem.
        if let Some(fs) = policy::limit_below_floor(&capabilities, req.limit_bytes) {
            return Err(ProxyError::CapacityOutOfRange(format!(
                "limit_bytes {} is below {fs}'s minimum of {} ({} bytes)",
                req.limit_bytes,
                fs.min_size_text(),
                fs.min_bytes()
            )));
        }
        let binding = Binding {
            uid: uuid::Uuid::new_v4().to_string(),
            volume_name: req.name.clone(),
            required_bytes: req.required_bytes,
            limit_bytes: req.limit_bytes,
            capabilities: capabilities.clone(),
            parameters: req.parameters.identity.clone(),
            cleanup: req.parameters.cleanup,
        };
        let bind = BindRequest {
            binding,
            placement: req.placement.clone(),
            selector: req.parameters.selector.clone(),
            // The filesystem's minimum is applied by `policy::smallest`.
            min_bytes: req.required_bytes,
            max_bytes: if req.limit_bytes == 0 {
                u64::MAX
            } else {
                req.limit_bytes
            },
        };
        match self.inventory.bind(bind).await {
            Ok(dev) => {
                // bind() returns an existing binding when it raced with itself.
                compatible(&dev, &req, &capabilities)?;
                tracing::info!(volume = %req.name, wwid = %dev.wwid, size = dev.size_bytes, "bound LUN");
                Ok(dev)
            }
            Err(InventoryError::NoFit(why)) => {
                let largest = self.inventory.largest_size().await?;
                let err = if largest < req.required_bytes {
                    ProxyError::CapacityOutOfRange(format!(
                        "{} bytes requested, the largest LUN has {largest}",
                        req.required_bytes
                    ))
                } else {
                    ProxyError::NoDeviceFits(why)
                };
                if let (Some(events), Some(claim)) = (&self.events, &req.parameters.claim) {
                    // Best effort, off the call's path: the provisioner
                    // retries at once and must not wait for the API.
                    let (events, claim, detail) = (events.clone(), claim.clone(), err.to_string());
                    tokio::spawn(async move { events.no_device_fits(&claim, &detail).await });
                }
                Err(err)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether `dev`, already bound to `req.name`, satisfies `req` (and is
/// not a deleted volume's LUN).
fn compatible(
    dev: &Device,
    req: &CreateRequest,
    capabilities: &[Capability],
) -> Result<(), ProxyError> {
    let conflict = |difference: String| {
        Err(ProxyError::NameConflict {
            name: req.name.clone(),
            difference,
        })
    };
    // The volume of this name was deleted and its LUN is still being
    // wiped: never hand that out. The name is free once it is released.
    if policy::releasing(dev) {
        return Err(ProxyError::Busy(format!(
            "volume name {} (its deleted volume's LUN {} is still being released)",
            req.name, dev.wwid
        )));
    }
    let Some(b) = &dev.binding else {
        return conflict("the bound device lost its binding".into());
    };
    if dev.size_bytes < req.required_bytes
        || (req.limit_bytes != 0 && dev.size_bytes > req.limit_bytes)
    {
        return conflict(format!("existing volume has {} bytes", dev.size_bytes));
    }
    let mut want = capabilities.to_vec();
    let mut have = b.capabilities.clone();
    want.sort();
    have.sort();
    if want != have {
        let text = |caps: &[Capability]| {
            caps.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return conflict(format!(
            "capabilities [{}] vs [{}]",
            text(&have),
            text(&want)
        ));
    }
    let params: BTreeMap<_, _> = req.parameters.identity.clone();
    if params != b.parameters {
        return conflict("StorageClass parameters differ".into());
    }
    if !req.placement.admits(&dev.node_names()) {
        return conflict("existing volume is not accessible from the requested topology".into());
    }
    Ok(())
}
