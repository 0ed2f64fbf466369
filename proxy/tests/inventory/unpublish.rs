//! ControllerUnpublish over the embedded store with the agents file as the
//! list of nodes: a listed node that does not answer keeps its record; a
//! node missing from a half-written file keeps it too; a node removed from
//! the file is gone once it stayed out for the grace period.

use std::sync::Arc;
use std::time::Duration;

use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use tonic::{Code, Status};

use crate::devices::{bind_req, lun, node, publication, round, uid};
use crate::lifecycle_support;

#[tokio::test]
async fn unpublish_waits_for_a_listed_agent_that_does_not_answer_and_forgets_a_node_removed_from_the_file_after_the_grace_period()
 {
    let dir = tempfile::tempdir().unwrap();
    let inv = Arc::new(Inventory::new(Arc::new(
        EmbeddedInventory::open(&dir.path().join("inventory.db")).unwrap(),
    )));
    inv.apply_discovery(round("t1", &[("node-a", vec![lun(1, 1 << 30)])], &[]))
        .await
        .unwrap();
    let mut dev = inv.bind(bind_req("pv-1", &[], "")).await.unwrap();
    dev.published = vec![publication("node-a")];
    inv.update(dev.clone()).await.unwrap();
    let id = format!("{}:{}", dev.wwid, uid("pv-1"));
    // node-a is listed, at an address where nothing listens any more.
    let silent = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let agents_file = dir.path().join("agents");
    std::fs::write(&agents_file, format!("node-a {silent}\n")).unwrap();
    // Long enough that a loaded machine cannot sleep through it.
    let grace = Duration::from_secs(2);
    let agents = FileDirectory::load_with_grace(&agents_file, grace).unwrap();
    let life = lifecycle_support::lifecycle(inv.clone(), agents.clone(), dir.path());
    let published_to = || async {
        inv.device(&dev.wwid)
            .await
            .unwrap()
            .unwrap()
            .published_nodes()
    };

    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-a")), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("node-a"), "{refused:?}");
    assert_eq!(published_to().await, ["node-a"], "the record is kept");
    let delete = Status::from(life.delete(&id, "t").await.unwrap_err());
    assert_eq!(delete.code(), Code::FailedPrecondition, "{delete:?}");

    // The file is truncated (a writer cut short): the last good map stays.
    std::fs::write(&agents_file, "").unwrap();
    agents.reload().unwrap_err();
    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-a")), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(published_to().await, ["node-a"], "the record is kept");

    // Removed from the file: unknown at first, as a half-written file
    // would leave it; the record stays.
    std::fs::write(&agents_file, "# node-a decommissioned\n").unwrap();
    assert!(agents.reload().unwrap());
    let refused = Status::from(
        life.unpublish(&id, Some(&node("node-a")), "t")
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(published_to().await, ["node-a"], "the record is kept");
    // A node the file never listed, and no record names: nothing was
    // attached there, so it is unpublished at once (CSI: OK).
    life.unpublish(&id, Some(&node("node-zz")), "t")
        .await
        .unwrap();
    assert_eq!(published_to().await, ["node-a"], "node-a's record is kept");

    // Out of the file for the grace period: the node is gone, nothing is
    // attached there.
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    agents.reload().unwrap();
    life.unpublish(&id, Some(&node("node-a")), "t")
        .await
        .unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
}
