//! Single-node exclusivity, the binding and the phase are checked on the
//! state a publish's compare-and-swap writes. The fault: another writer
//! (a second proxy replica, a stale leader) lands its write on the device
//! between the publish's read and its write, so the write loses the
//! compare-and-swap and is retried on the other writer's state.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use csi_scsi_proxy::device::policy;
use csi_scsi_proxy::device::{Access, AccessMode, Device, FsType, Phase, Publication};
use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory, InventoryError, Store, Write};
use csi_scsi_proxy::lifecycle::Lifecycle;
use tonic::{Code, Status};

use crate::agent_stub::{self, StubAgent, WipeBehaviour};
use crate::devices::{WRITER, bind_req, binding, lun, node, publication, round, uid, wwid};
use crate::hooked_store::{Hooked, Hooks};
use crate::lifecycle_support;

/// A write another proxy makes to the device.
type Competing = Box<dyn FnOnce(&mut Device) + Send>;

/// Once armed, the first compare-and-swap write of the device lets
/// `Competing` land first (read, change, written as another writer
/// would), so that write then loses the race.
#[derive(Default)]
struct Racing {
    armed: Mutex<Option<Competing>>,
}

impl Racing {
    fn arm(&self, competing: Competing) {
        *self.armed.lock().unwrap() = Some(competing);
    }

    /// Whether the competing write has landed.
    fn landed(&self) -> bool {
        self.armed.lock().unwrap().is_none()
    }
}

#[async_trait]
impl Hooks for Racing {
    async fn before_put(
        &self,
        inner: &EmbeddedInventory,
        writes: &[Write],
    ) -> Result<(), InventoryError> {
        let replaces_it = writes
            .iter()
            .any(|w| matches!(w, Write::Replace(d) if d.wwid == wwid(1)));
        let competing = if replaces_it {
            self.armed.lock().unwrap().take()
        } else {
            None
        };
        if let Some(change) = competing {
            let mut theirs = inner.device(&wwid(1)).await?.expect("the device");
            change(&mut theirs);
            let landed = inner.put(vec![Write::Replace(theirs)]).await?;
            landed.into_iter().next().expect("one result")?;
        }
        Ok(())
    }
}

/// LUN 1 (1 GiB), seen by node-a and node-b, each served by a stub agent,
/// bound to volume pv-1 (single-node writer, ext4).
struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<Hooked<Racing>>,
    inv: Arc<Inventory>,
    life: Lifecycle,
    node_b: StubAgent,
    _node_a: StubAgent,
    volume: String,
}

impl Fixture {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Hooked::open(
            &dir.path().join("inventory.db"),
            Racing::default(),
        ));
        let inv = Arc::new(Inventory::new(store.clone()));
        inv.apply_discovery(round(
            "t1",
            &[
                ("node-a", vec![lun(1, 1 << 30)]),
                ("node-b", vec![lun(1, 1 << 30)]),
            ],
            &[],
        ))
        .await
        .unwrap();
        let dev = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
        let ca = lifecycle_support::test_ca();
        let stub = |node: &'static str| {
            let behaviour = WipeBehaviour::new(Duration::ZERO, 0);
            let seen = wwid(1);
            let (ca, scratch) = (&ca, dir.path().to_owned());
            async move { agent_stub::start(ca, node, &[seen.as_str()], behaviour, &scratch).await }
        };
        let node_a = stub("node-a").await;
        let node_b = stub("node-b").await;
        let agents_file = dir.path().join("agents");
        std::fs::write(
            &agents_file,
            format!("node-a {}\nnode-b {}\n", node_a.address, node_b.address),
        )
        .unwrap();
        let agents = FileDirectory::load(&agents_file).unwrap();
        let life = lifecycle_support::lifecycle_trusting(&ca, inv.clone(), agents, dir.path());
        Self {
            _dir: dir,
            store,
            inv,
            life,
            node_b,
            _node_a: node_a,
            volume: format!("{}:{}", dev.wwid, uid("pv-1")),
        }
    }

    /// ControllerPublish of pv-1 on node-b, single-node writer on ext4.
    async fn publish_on_b(&self) -> Result<(), Status> {
        let access = Access {
            block: false,
            fs_type: Some(FsType::Ext4),
            mode: AccessMode::SingleNodeWriter,
        };
        self.life
            .publish(&self.volume, &node("node-b"), &access, "t")
            .await
            .map(drop)
            .map_err(Status::from)
    }

    async fn device(&self) -> Device {
        self.inv.device(&wwid(1)).await.unwrap().unwrap()
    }
}

/// The LUN released by another proxy and bound to volume pv-2.
fn bound_again(d: &mut Device) {
    policy::start_release(d);
    policy::released(d);
    policy::bind(d, binding("pv-2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_that_loses_its_write_to_another_is_judged_again_on_what_it_lost_to() {
    let read_only_on_b = Publication {
        readonly: true,
        ..publication("node-b")
    };
    // (what lands first, code, publications after, binding uid after)
    type Case = (
        &'static str,
        Option<Competing>,
        Code,
        Vec<Publication>,
        &'static str,
    );
    let cases: [Case; 5] = [
        (
            "nothing (control)",
            None,
            Code::Ok,
            vec![publication("node-b")],
            "uid-pv-1",
        ),
        (
            "node-a's publication (single-node writer)",
            Some(Box::new(|d: &mut Device| {
                d.published.push(publication("node-a"))
            })),
            Code::FailedPrecondition,
            vec![publication("node-a")],
            "uid-pv-1",
        ),
        (
            "node-b's own publication, read-only",
            Some(Box::new({
                let p = read_only_on_b.clone();
                move |d: &mut Device| d.published.push(p)
            })),
            Code::AlreadyExists,
            vec![read_only_on_b],
            "uid-pv-1",
        ),
        (
            "the volume's deletion (Releasing)",
            Some(Box::new(|d: &mut Device| {
                policy::start_release(d);
            })),
            Code::NotFound,
            vec![],
            "uid-pv-1",
        ),
        (
            "the LUN released and bound to pv-2",
            Some(Box::new(bound_again)),
            Code::NotFound,
            vec![],
            "uid-pv-2",
        ),
    ];
    for (what, competing, code, published, binding_uid) in cases {
        let f = Fixture::new().await;
        let races = competing.is_some();
        if let Some(c) = competing {
            f.store.hooks.arm(c);
        }
        let got = f.publish_on_b().await;
        assert_eq!(
            got.as_ref().err().map_or(Code::Ok, Status::code),
            code,
            "{what}: {got:?}"
        );
        assert!(
            f.store.hooks.landed(),
            "{what}: the competing write never landed"
        );
        let dev = f.device().await;
        assert_eq!(dev.published, published, "{what}");
        assert_eq!(
            dev.binding.as_ref().map(|b| b.uid.as_str()),
            Some(binding_uid),
            "{what}"
        );
        let attaches = f.node_b.log.attached(&wwid(1));
        assert_eq!(attaches, u32::from(!races), "{what}: attaches on node-b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpublish_never_edits_the_record_of_a_volume_bound_after_it_read() {
    let f = Fixture::new().await;
    f.publish_on_b().await.unwrap();
    // Another proxy deletes pv-1, binds the LUN to pv-2 and publishes
    // pv-2 on node-b, between this unpublish's read and its write.
    f.store.hooks.arm(Box::new(|d: &mut Device| {
        bound_again(d);
        d.published.push(publication("node-b"));
    }));
    f.life
        .unpublish(&f.volume, Some(&node("node-b")), "t")
        .await
        .unwrap();
    assert!(f.store.hooks.landed());
    assert_eq!(f.node_b.log.detached(&wwid(1)), 1);
    let dev = f.device().await;
    assert_eq!(dev.binding.as_ref().unwrap().uid, uid("pv-2"));
    assert_eq!(dev.phase, Phase::Bound);
    assert_eq!(
        dev.published,
        [publication("node-b")],
        "pv-2's publication on node-b is kept"
    );
    assert_eq!(dev.published[0].access, Some(WRITER));
}
