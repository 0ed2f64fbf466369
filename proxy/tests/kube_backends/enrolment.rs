//! Enrolment's token check against the real API server's TokenReview: a
//! projected token of an agent DaemonSet Pod proves its node; a token from
//! another node's Pod, of another ServiceAccount, for another audience,
//! bound to no Pod, or to a Pod that is not the DaemonSet's is refused.
//! The tokens are made by the real kubectl (`create token`), as kubelet
//! makes projected ones.

use csi_scsi_proto::agent::CredentialKind;
use csi_scsi_proxy::config::TokenRules;
use csi_scsi_proxy::enrolment::{CredentialCheck, Refusal, TokenReviewCheck};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::devices::node;
use crate::real_kube::{self, NAMESPACE};

const AUDIENCE: &str = "csi-scsi-enrolment";
const DAEMONSET: &str = "enrol-test-agents";
const SERVICE_ACCOUNT: &str = "enrol-test-agent";

async fn create<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("object");
    match api.create(&PostParams::default(), &object).await {
        Ok(o) => o,
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = object.meta().name.clone().expect("name");
            api.get(&name).await.expect("existing object")
        }
        Err(e) => panic!("create: {e}"),
    }
}

/// A Pod on `node` running as `sa`, controlled by DaemonSet `owner` (uid).
async fn pod(name: &str, node: &str, sa: &str, owner: Option<(&str, &str)>) -> Pod {
    let admin = real_kube::admin().await;
    let owners = owner.map(|(ds, uid)| {
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds, "uid": uid, "controller": true}])
    });
    create(
        &Api::<Pod>::namespaced(admin, NAMESPACE),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"test": "enrolment"},
                         "ownerReferences": owners},
            "spec": {"nodeName": node, "serviceAccountName": sa,
                     "containers": [{"name": "c", "image": "local/none:1"}]},
        }),
    )
    .await
}

/// `kubectl create token`, bound to `pod` when given.
async fn token(sa: &str, audience: &str, pod: Option<&Pod>) -> String {
    let plane = real_kube::plane().await;
    let mut args = vec![
        "create".to_owned(),
        "token".into(),
        sa.into(),
        "-n".into(),
        NAMESPACE.into(),
        "--audience".into(),
        audience.into(),
    ];
    if let Some(p) = pod {
        args.extend([
            "--bound-object-kind".into(),
            "Pod".into(),
            "--bound-object-name".into(),
            p.metadata.name.clone().expect("name"),
            "--bound-object-uid".into(),
            p.metadata.uid.clone().expect("uid"),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    plane
        .admin
        .run(&args)
        .expect("kubectl create token")
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_projected_token_proves_only_its_own_agent_pods_node() {
    let admin = real_kube::admin().await;
    let nodes = Api::<Node>::all(admin.clone());
    let mut uids = Vec::new();
    for n in ["enrol-node-a", "enrol-node-b"] {
        let node = create(
            &nodes,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
        .await;
        uids.push(node.metadata.uid.expect("uid"));
    }
    let sas = Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE);
    for sa in [SERVICE_ACCOUNT, "enrol-test-other"] {
        create(
            &sas,
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        )
        .await;
    }
    let ds = create(
        &Api::<DaemonSet>::namespaced(admin.clone(), NAMESPACE),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": DAEMONSET},
            "spec": {"selector": {"matchLabels": {"app": DAEMONSET}},
                     "template": {"metadata": {"labels": {"app": DAEMONSET}},
                                  "spec": {"containers": [{"name": "c", "image": "local/none:1"}]}}},
        }),
    )
    .await;
    let ds_uid = ds.metadata.uid.clone().expect("uid");
    let agent_a = pod(
        "enrol-agent-a",
        "enrol-node-a",
        SERVICE_ACCOUNT,
        Some((DAEMONSET, &ds_uid)),
    )
    .await;
    let bare = pod("enrol-bare-a", "enrol-node-a", SERVICE_ACCOUNT, None).await;
    let other_sa = pod(
        "enrol-other-a",
        "enrol-node-a",
        "enrol-test-other",
        Some((DAEMONSET, &ds_uid)),
    )
    .await;

    let check = TokenReviewCheck::new(
        admin.clone(),
        TokenRules {
            audience: AUDIENCE.into(),
            namespace: NAMESPACE.into(),
            daemonset: DAEMONSET.into(),
            service_account: SERVICE_ACCOUNT.into(),
        },
    );
    let sa_token = CredentialKind::ServiceAccountToken;
    let good = token(SERVICE_ACCOUNT, AUDIENCE, Some(&agent_a)).await;

    // The agent Pod's token proves its node, and the Node's UID comes along.
    let proven = check
        .check(&node("enrol-node-a"), sa_token, &good)
        .await
        .expect("proven");
    assert_eq!(proven.node_uid.as_deref(), Some(uids[0].as_str()));

    // Another node's agent asking with node-a's Pod's token.
    let e = check
        .check(&node("enrol-node-b"), sa_token, &good)
        .await
        .expect_err("other node");
    assert!(
        matches!(&e, Refusal::WrongNode { token_node, asked } if token_node == "enrol-node-a" && asked == "enrol-node-b"),
        "{e}"
    );

    // A token of another ServiceAccount (its Pod even is the DaemonSet's).
    let t = token("enrol-test-other", AUDIENCE, Some(&other_sa)).await;
    let e = check
        .check(&node("enrol-node-a"), sa_token, &t)
        .await
        .expect_err("other SA");
    assert!(matches!(e, Refusal::WrongServiceAccount { .. }), "{e}");

    // The agent's ServiceAccount, but a bare Pod, not the DaemonSet's.
    let t = token(SERVICE_ACCOUNT, AUDIENCE, Some(&bare)).await;
    let e = check
        .check(&node("enrol-node-a"), sa_token, &t)
        .await
        .expect_err("bare pod");
    assert!(matches!(e, Refusal::NotAnAgentPod { .. }), "{e}");

    // Bound to no Pod at all.
    let t = token(SERVICE_ACCOUNT, AUDIENCE, None).await;
    let e = check
        .check(&node("enrol-node-a"), sa_token, &t)
        .await
        .expect_err("unbound");
    assert!(matches!(e, Refusal::NotPodBound(_)), "{e}");

    // For another audience (the API server's own, say).
    let t = token(
        SERVICE_ACCOUNT,
        "https://kubernetes.default.svc",
        Some(&agent_a),
    )
    .await;
    let e = check
        .check(&node("enrol-node-a"), sa_token, &t)
        .await
        .expect_err("audience");
    assert!(
        matches!(e, Refusal::NotAuthenticated(_) | Refusal::WrongAudience(_)),
        "{e}"
    );

    // A join token where a cluster wants a ServiceAccount token.
    let e = check
        .check(&node("enrol-node-a"), CredentialKind::JoinToken, &good)
        .await
        .expect_err("kind");
    assert!(matches!(e, Refusal::WrongKind(..)), "{e}");

    // The Pod deleted: its token no longer authenticates.
    Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .delete(
            "enrol-agent-a",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("delete pod");
    crate::real_api::until("the deleted Pod's token refused", 30, || {
        let (check, good) = (&check, &good);
        async move {
            check
                .check(&node("enrol-node-a"), sa_token, good)
                .await
                .is_err()
        }
    })
    .await;
    let e = check
        .check(&node("enrol-node-a"), sa_token, &good)
        .await
        .expect_err("deleted pod");
    assert!(
        matches!(
            e,
            Refusal::NotAuthenticated(_) | Refusal::NotAnAgentPod { .. }
        ),
        "{e}"
    );
}
