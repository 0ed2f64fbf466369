//! `Debug` for messages whose derived `Debug` build.rs removed because they
//! carry secrets: every field prints as usual except the secret ones, whose
//! keys are shown and whose values are replaced by [`crate::REDACTED`].

use std::collections::HashMap;
use std::fmt;

use crate::REDACTED;
use crate::agent::{BeginEnrolmentResponse, ChapCredentials};
use crate::csi::*;

/// Prints a secrets map as its keys with redacted values.
struct SecretMap<'a>(&'a HashMap<String, String>);

impl fmt::Debug for SecretMap<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        f.debug_map()
            .entries(keys.into_iter().map(|k| (k, REDACTED)))
            .finish()
    }
}

macro_rules! redacting_debug {
    ($($msg:ident { $($field:ident),*; secrets: $secret:ident }),+ $(,)?) => {
        $(
            impl fmt::Debug for $msg {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.debug_struct(stringify!($msg))
                        $(.field(stringify!($field), &self.$field))*
                        .field(stringify!($secret), &SecretMap(&self.$secret))
                        .finish()
                }
            }
        )+
    };
}

redacting_debug! {
    ControllerExpandVolumeRequest { volume_id, capacity_range, volume_capability; secrets: secrets },
    ControllerModifyVolumeRequest { volume_id, mutable_parameters; secrets: secrets },
    ControllerPublishVolumeRequest { volume_id, node_id, volume_capability, readonly, volume_context; secrets: secrets },
    ControllerUnpublishVolumeRequest { volume_id, node_id; secrets: secrets },
    CreateSnapshotRequest { source_volume_id, name, parameters; secrets: secrets },
    CreateVolumeGroupSnapshotRequest { name, source_volume_ids, parameters; secrets: secrets },
    CreateVolumeRequest { name, capacity_range, volume_capabilities, parameters, volume_content_source, accessibility_requirements, mutable_parameters; secrets: secrets },
    DeleteSnapshotRequest { snapshot_id; secrets: secrets },
    DeleteVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids; secrets: secrets },
    DeleteVolumeRequest { volume_id; secrets: secrets },
    GetMetadataAllocatedRequest { snapshot_id, starting_offset, max_results; secrets: secrets },
    GetMetadataDeltaRequest { base_snapshot_id, target_snapshot_id, starting_offset, max_results; secrets: secrets },
    GetSnapshotRequest { snapshot_id; secrets: secrets },
    GetVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids; secrets: secrets },
    ListSnapshotsRequest { max_entries, starting_token, source_volume_id, snapshot_id; secrets: secrets },
    NodeExpandVolumeRequest { volume_id, volume_path, capacity_range, staging_target_path, volume_capability; secrets: secrets },
    NodePublishVolumeRequest { volume_id, publish_context, staging_target_path, target_path, volume_capability, readonly, volume_context; secrets: secrets },
    NodeStageVolumeRequest { volume_id, publish_context, staging_target_path, volume_capability, volume_context; secrets: secrets },
    ValidateVolumeCapabilitiesRequest { volume_id, volume_context, volume_capabilities, parameters, mutable_parameters; secrets: secrets },
}

impl fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("username", &self.username)
            .field("password", &REDACTED)
            .field("mutual_username", &self.mutual_username)
            .field("mutual_password", &REDACTED)
            .finish()
    }
}

impl fmt::Debug for BeginEnrolmentResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BeginEnrolmentResponse")
            .field("node", &self.node)
            .field("credential_kind", &self.credential_kind())
            .field("credential", &REDACTED)
            .field("csr_pem", &self.csr_pem)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_request_debug_hides_secret_values_but_keeps_keys() {
        let req = NodeStageVolumeRequest {
            volume_id: "naa.6001:1".into(),
            secrets: HashMap::from([("chap-password".into(), "hunter2-s3cret".into())]),
            ..Default::default()
        };
        let text = format!("{req:?}");
        assert!(text.contains("naa.6001:1"), "{text}");
        assert!(text.contains("chap-password"), "{text}");
        assert!(!text.contains("hunter2-s3cret"), "{text}");
    }

    #[test]
    fn enrolment_debug_hides_the_credential() {
        let begin = BeginEnrolmentResponse {
            node: "node-a".into(),
            credential: "eyJhbGciOiJSUzI1NiJ9.t0ken".into(),
            ..Default::default()
        };
        let text = format!("{begin:?}");
        assert!(text.contains("node-a"), "{text}");
        assert!(!text.contains("t0ken"), "{text}");
    }

    #[test]
    fn chap_debug_hides_both_passwords() {
        let chap = ChapCredentials {
            username: "user".into(),
            password: "p4ss-one".into(),
            mutual_username: "target".into(),
            mutual_password: "p4ss-two".into(),
        };
        let text = format!("{chap:?}");
        assert!(text.contains("user") && text.contains("target"), "{text}");
        assert!(
            !text.contains("p4ss-one") && !text.contains("p4ss-two"),
            "{text}"
        );
    }
}
