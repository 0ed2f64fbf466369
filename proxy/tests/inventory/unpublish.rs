//! ControllerUnpublish over the embedded store with the agents file as the
//! list of nodes: a listed node that does not answer keeps its record; a
//! node removed from the file is gone.

use std::sync::Arc;

use csi_scsi_proxy::directory::FileDirectory;
use csi_scsi_proxy::inventory::{EmbeddedInventory, Inventory};
use tonic::{Code, Status};

use crate::devices::{bind_req, lun, publication, round, uid};
use crate::lifecycle_support;

#[tokio::test]
async fn unpublish_waits_for_a_listed_agent_that_does_not_answer_and_forgets_a_node_removed_from_the_file()
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
    let agents = FileDirectory::load(&agents_file).unwrap();
    let life = lifecycle_support::lifecycle(inv.clone(), agents.clone(), dir.path());
    let published_to = || async {
        inv.device(&dev.wwid)
            .await
            .unwrap()
            .unwrap()
            .published_nodes()
    };

    let refused = Status::from(life.unpublish(&id, "node-a", "t").await.unwrap_err());
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("node-a"), "{refused:?}");
    assert_eq!(published_to().await, ["node-a"], "the record is kept");
    let delete = Status::from(life.delete(&id, "t").await.unwrap_err());
    assert_eq!(delete.code(), Code::FailedPrecondition, "{delete:?}");

    // Removed from the file: the node is gone, nothing is attached there.
    std::fs::write(&agents_file, "# node-a decommissioned\n").unwrap();
    assert!(agents.reload().unwrap());
    life.unpublish(&id, "node-a", "t").await.unwrap();
    assert!(published_to().await.is_empty(), "the record is dropped");
}
