//! A LUN too small for the volume's filesystem is never bound to it:
//! Debian's mkfs.xfs refuses anything under 300 MiB, so such a volume
//! could never be staged.

use std::collections::HashMap;
use std::sync::Arc;

use csi_scsi_proxy::device::{Access, AccessMode, Capability, Device, FsType, Phase, Placement};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use csi_scsi_proxy::lifecycle::{CreateRequest, Lifecycle};
use csi_scsi_proxy::parameters::ClassParameters;
use csi_scsi_proxy::selector::Selector;
use tonic::{Code, Status};

use crate::devices::{lun, round, wwid};
use crate::lifecycle_support;

const MIB: u64 = 1024 * 1024;

/// A controller over an embedded store holding LUNs of `sizes` (LUN 1,
/// 2, ...), seen by node-a; nothing else is needed to bind.
async fn controller(dir: &tempfile::TempDir, sizes: &[u64]) -> Lifecycle {
    let inv = Arc::new(Inventory::new(Arc::new(
        EmbeddedInventory::open(&dir.path().join("inventory.db")).unwrap(),
    )));
    let luns = (1..).zip(sizes).map(|(i, s)| lun(i, *s)).collect();
    inv.apply_discovery(round("t1", &[("node-a", luns)], &[]))
        .await
        .unwrap();
    let agents_file = dir.path().join("agents");
    std::fs::write(&agents_file, "").unwrap();
    let agents = FileDirectory::load(&agents_file).unwrap();
    lifecycle_support::lifecycle(inv, agents, dir.path())
}

/// A mount (of `fs`; `None`: the class's) or a block volume.
fn access(block: bool, fs: Option<FsType>) -> Access {
    Access {
        block,
        fs_type: fs,
        mode: AccessMode::SingleNodeWriter,
    }
}

async fn create(
    life: &Lifecycle,
    name: &str,
    access: Access,
    class: &[(&str, &str)],
    required_bytes: u64,
    limit_bytes: u64,
) -> Result<Device, Status> {
    let class: HashMap<String, String> = class
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    life.create(CreateRequest {
        name: name.into(),
        required_bytes,
        limit_bytes,
        access: vec![access],
        parameters: ClassParameters::parse(&class).unwrap(),
        placement: Placement::anywhere(),
    })
    .await
    .map_err(Status::from)
}

async fn device(life: &Lifecycle, i: u32) -> Device {
    life.inventory().device(&wwid(i)).await.unwrap().unwrap()
}

#[tokio::test]
async fn an_xfs_volume_is_never_bound_to_a_lun_mkfs_xfs_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let life = controller(&dir, &[64 * MIB]).await;
    let xfs = access(false, Some(FsType::Xfs));
    for (name, access, class, required) in [
        ("pv-xfs-any", xfs.clone(), &[][..], 0),
        ("pv-xfs-1m", xfs.clone(), &[][..], MIB),
        // The class names xfs and the capability leaves it to the class.
        (
            "pv-class-xfs",
            access(false, None),
            &[("fsType", "xfs")][..],
            0,
        ),
    ] {
        let refused = create(&life, name, access, class, required, 0)
            .await
            .expect_err(name);
        assert_eq!(
            refused.code(),
            Code::ResourceExhausted,
            "{name}: {refused:?}"
        );
        assert!(
            refused.message().contains("xfs needs at least 300 MiB"),
            "{name}: {refused:?}"
        );
        let dev = device(&life, 1).await;
        assert_eq!((dev.phase, dev.binding), (Phase::Available, None), "{name}");
    }
    // A limit under xfs's minimum: no LUN in range could ever take it.
    let out_of_range = create(&life, "pv-xfs-small", xfs, &[], 0, 100 * MIB)
        .await
        .expect_err("limit");
    assert_eq!(out_of_range.code(), Code::OutOfRange, "{out_of_range:?}");
    assert!(
        out_of_range.message().contains("300 MiB"),
        "{out_of_range:?}"
    );
    // ext4 makes do with 64 MiB.
    let ext4 = create(
        &life,
        "pv-ext4",
        access(false, Some(FsType::Ext4)),
        &[],
        MIB,
        0,
    )
    .await
    .unwrap();
    assert_eq!((ext4.wwid, ext4.size_bytes), (wwid(1), 64 * MIB));
    assert_eq!(device(&life, 1).await.phase, Phase::Bound);
}

#[tokio::test]
async fn xfs_takes_the_lun_large_enough_and_a_block_volume_the_smallest() {
    let dir = tempfile::tempdir().unwrap();
    let life = controller(&dir, &[64 * MIB, 512 * MIB, 64 * MIB]).await;
    let all = Selector::default();
    let nodes: &[csi_scsi_contract::NodeName] = &[];
    let xfs = Capability::Mount(FsType::Xfs, AccessMode::SingleNodeWriter);
    let block = Capability::Block(AccessMode::SingleNodeWriter);
    // GetCapacity for an xfs volume counts only what xfs could be bound to.
    assert_eq!(
        life.capacity(nodes, &all, &[xfs]).await.unwrap(),
        (512 * MIB, 512 * MIB)
    );
    assert_eq!(
        life.capacity(nodes, &all, &[block]).await.unwrap(),
        (640 * MIB, 512 * MIB)
    );
    assert_eq!(
        life.capacity(nodes, &all, &[]).await.unwrap(),
        (640 * MIB, 512 * MIB)
    );
    let xfs_volume = create(&life, "pv-xfs", access(false, Some(FsType::Xfs)), &[], 0, 0)
        .await
        .unwrap();
    assert_eq!(xfs_volume.wwid, wwid(2), "the 512 MiB LUN");
    let block_volume = create(&life, "pv-block", access(true, None), &[], 0, 0)
        .await
        .unwrap();
    assert_eq!(block_volume.size_bytes, 64 * MIB, "the smallest first");
    // Nothing left for xfs: the 64 MiB LUN left is not offered.
    let refused = create(
        &life,
        "pv-xfs-2",
        access(false, Some(FsType::Xfs)),
        &[],
        0,
        0,
    )
    .await
    .expect_err("no LUN for xfs");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        life.capacity(nodes, &all, &[xfs]).await.unwrap(),
        (0, 0),
        "no capacity for xfs"
    );
}
