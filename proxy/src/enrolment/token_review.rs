//! ServiceAccount tokens (kubernetes backend): the API server's TokenReview
//! says whose token it is, for which audience, and (a Pod-bound token) on
//! which Pod and node; the Pod must be the agent DaemonSet's on that node.

use csi_scsi_contract::NodeName;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::{Api, Client};

use super::credentials::{CredentialCheck, Proven, Refusal};
use crate::config::TokenRules;
use csi_scsi_proto::agent::CredentialKind;

/// What a Pod-bound token's review carries (every supported Kubernetes minor).
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";
const NODE_UID: &str = "authentication.kubernetes.io/node-uid";

/// Checks agents' projected tokens with TokenReview.
pub struct TokenReviewCheck {
    client: Client,
    rules: TokenRules,
}

impl TokenReviewCheck {
    /// Checks against `rules` through `client`.
    pub fn new(client: Client, rules: TokenRules) -> Self {
        Self { client, rules }
    }
}

#[async_trait::async_trait]
impl CredentialCheck for TokenReviewCheck {
    async fn check(
        &self,
        node: &NodeName,
        kind: CredentialKind,
        token: &str,
    ) -> Result<Proven, Refusal> {
        if kind != CredentialKind::ServiceAccountToken {
            return Err(Refusal::WrongKind(
                kind,
                "in a cluster, agents enrol with their projected ServiceAccount token",
            ));
        }
        let rules = &self.rules;
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![rules.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refusal::Unavailable(format!("TokenReview: {e}")))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(Refusal::NotAuthenticated(
                status.error.unwrap_or_else(|| "not authenticated".into()),
            ));
        }
        if !status
            .audiences
            .unwrap_or_default()
            .contains(&rules.audience)
        {
            return Err(Refusal::WrongAudience(rules.audience.clone()));
        }
        let user = status.user.unwrap_or_default();
        let expected = format!(
            "system:serviceaccount:{}:{}",
            rules.namespace, rules.service_account
        );
        let presented = user.username.unwrap_or_default();
        if presented != expected {
            return Err(Refusal::WrongServiceAccount {
                expected,
                presented,
            });
        }
        let extra = user.extra.unwrap_or_default();
        let one = |key: &'static str| {
            extra
                .get(key)
                .and_then(|v| v.first())
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or(Refusal::NotPodBound(key))
        };
        let (pod_name, pod_uid, token_node) = (one(POD_NAME)?, one(POD_UID)?, one(NODE_NAME)?);
        if node.as_str() != token_node {
            return Err(Refusal::WrongNode {
                token_node,
                asked: node.clone(),
            });
        }
        let not_agent = |why: String| Refusal::NotAnAgentPod {
            pod: format!("{}/{pod_name}", rules.namespace),
            daemonset: rules.daemonset.clone(),
            node: node.clone(),
            why,
        };
        let pod = Api::<Pod>::namespaced(self.client.clone(), &rules.namespace)
            .get_opt(&pod_name)
            .await
            .map_err(|e| Refusal::Unavailable(format!("reading Pod {pod_name}: {e}")))?
            .ok_or_else(|| not_agent("no such Pod (deleted since the token was issued)".into()))?;
        if pod.metadata.uid.as_deref() != Some(pod_uid.as_str()) {
            return Err(not_agent(
                "the Pod of that name is another one than the token's".into(),
            ));
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(not_agent("the Pod is terminating".into()));
        }
        let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true) && o.kind == "DaemonSet" && o.name == rules.daemonset
        });
        if !owned {
            return Err(not_agent("its controller is not that DaemonSet".into()));
        }
        let runs_on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if runs_on.as_deref() != Some(node.as_str()) {
            return Err(not_agent(format!(
                "it runs on {}",
                runs_on.as_deref().unwrap_or("no node")
            )));
        }
        let node_uid = match one(NODE_UID) {
            Ok(uid) => uid,
            Err(_) => Api::<Node>::all(self.client.clone())
                .get_opt(node.as_str())
                .await
                .map_err(|e| Refusal::Unavailable(format!("reading Node {node}: {e}")))?
                .and_then(|n| n.metadata.uid)
                .ok_or_else(|| not_agent("its Node no longer exists".into()))?,
        };
        Ok(Proven {
            node_uid: Some(node_uid),
        })
    }
}
