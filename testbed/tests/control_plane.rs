//! The real control plane starts, authenticates and authorises: an admin
//! client may do anything, a fresh service account may do nothing until
//! RBAC grants it.

use csi_scsi_testbed::kube::{ControlPlane, ControlPlaneConfig, GoTools, KubeMinor};

#[tokio::test(flavor = "multi_thread")]
async fn api_server_enforces_rbac_for_service_account_tokens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let minor = KubeMinor::from_env().expect("CSI_SCSI_KUBERNETES_MINOR");
    let tools = GoTools::build_at(minor, &["etcd", "kube-apiserver", "kubectl"]).expect("Go tools");
    let plane = ControlPlane::start(ControlPlaneConfig::api_only(dir.path()), tools)
        .await
        .expect("control plane");
    let admin = &plane.admin;
    let version = plane.git_version().expect("version");
    assert!(plane.tools.kubernetes().matches(&version), "{version}");
    admin.run(&["create", "namespace", "t"]).expect("namespace");
    admin
        .run(&["create", "serviceaccount", "robot", "-n", "t"])
        .expect("service account");
    let robot = plane
        .service_account_kubeconfig("t", "robot", &dir.path().join("robot.kubeconfig"))
        .expect("token");
    let robot = admin.with_kubeconfig(&robot);
    let denied = robot
        .run(&["get", "pods", "-n", "t"])
        .expect_err("no RBAC yet");
    assert!(format!("{denied:#}").contains("forbidden"), "{denied:#}");
    admin
        .run(&[
            "create",
            "role",
            "read-pods",
            "-n",
            "t",
            "--verb=list",
            "--resource=pods",
        ])
        .expect("role");
    admin
        .run(&[
            "create",
            "rolebinding",
            "robot",
            "-n",
            "t",
            "--role=read-pods",
            "--serviceaccount=t:robot",
        ])
        .expect("binding");
    robot.run(&["get", "pods", "-n", "t"]).expect("allowed now");
}
