//! The codes each kind of bad request may be answered with, and where the
//! CSI spec (or agent.proto, or gRPC) says so. Where the spec allows more
//! than one code, every one it allows is accepted.

use tonic::Code;

pub(super) const OK: &[Code] = &[Code::Ok];
pub(super) const INVALID: &[Code] = &[Code::InvalidArgument];
pub(super) const NOT_FOUND: &[Code] = &[Code::NotFound];
pub(super) const PRECONDITION: &[Code] = &[Code::FailedPrecondition];
pub(super) const UNIMPLEMENTED: &[Code] = &[Code::Unimplemented];
/// Error Scheme, "Invalid or unsupported field" (3) vs. the per-RPC table's
/// "Volume does not exist" (5): a malformed or oversized ID is both, and
/// the spec does not rank them.
pub(super) const INVALID_OR_NOT_FOUND: &[Code] = &[Code::InvalidArgument, Code::NotFound];
/// DeleteVolume: "If a volume corresponding to the specified volume_id does
/// not exist ... the Plugin MUST reply 0 OK"; a field over the spec's
/// 128-byte size limit may also be refused as invalid.
pub(super) const DELETE_OVERSIZED: &[Code] = &[Code::Ok, Code::InvalidArgument];
/// ControllerUnpublishVolume: a volume or node that "cannot be found ...
/// and the volume can be safely regarded as ControllerUnpublished" SHOULD
/// be 0 OK; the table's NOT_FOUND rows are the alternative.
pub(super) const UNPUBLISH_UNKNOWN: &[Code] = &[Code::Ok, Code::NotFound];
/// The same, for an ID that is also malformed.
pub(super) const UNPUBLISH_GARBAGE: &[Code] = &[Code::Ok, Code::NotFound, Code::InvalidArgument];
/// NodeUnstage/NodeUnpublish of a volume that is not there: the table's
/// "Volume does not exist" (5), or 0 OK by the idempotency rule ("not staged
/// to the staging_target_path ... MUST reply 0 OK").
pub(super) const NODE_UNDO_UNKNOWN: &[Code] = &[Code::Ok, Code::NotFound];
/// NodeUnstage/NodeUnpublish of a volume that does not exist at a path
/// that holds another: "Volume does not exist" (5); a driver that cannot
/// tell may refuse to touch a path that holds another volume (9); never
/// 0 OK after unmounting someone else's volume.
pub(super) const NOT_THIS_VOLUME: &[Code] = &[Code::NotFound, Code::FailedPrecondition];
/// Bytes that do not decode as the request: tonic answers INTERNAL (as
/// grpc-go does for a request it cannot unmarshal); INVALID_ARGUMENT would
/// be as right. The spec says nothing about the wire.
pub(super) const UNDECODABLE: &[Code] = &[Code::Internal, Code::InvalidArgument];
/// A message over the receive limit: gRPC's status-code doc names
/// RESOURCE_EXHAUSTED; tonic answers OUT_OF_RANGE.
pub(super) const TOO_LARGE: &[Code] = &[Code::ResourceExhausted, Code::OutOfRange];
/// "Unsupported capacity_range" (11 OUT_OF_RANGE); a limit below the
/// requirement is also simply an invalid field (3).
pub(super) const BAD_RANGE: &[Code] = &[Code::OutOfRange, Code::InvalidArgument];
/// NodeExpandVolume "Unsupported capacity_range" (11): more than the LUN
/// has.
pub(super) const OUT_OF_RANGE: &[Code] = &[Code::OutOfRange];
/// NodeStage/NodePublish "Exceeds capabilities" (9), or an unsupported
/// field (3).
pub(super) const EXCEEDS: &[Code] = &[Code::FailedPrecondition, Code::InvalidArgument];
/// ControllerPublish at the node the volume is already published on with
/// another capability: the table's "Volume published but is incompatible"
/// (6), or the Error Scheme's unsupported field (3).
pub(super) const INCOMPATIBLE: &[Code] = &[Code::AlreadyExists, Code::InvalidArgument];
/// CreateVolume "Volume already exists but is incompatible" (6);
/// NodeStage/NodePublish "Volume published but is incompatible" (6).
pub(super) const ALREADY_EXISTS: &[Code] = &[Code::AlreadyExists];
/// CreateVolume "Unable to provision in accessible_topology" (8).
pub(super) const NO_TOPOLOGY: &[Code] = &[Code::ResourceExhausted];
/// ValidateVolumeCapabilities of unsupported capabilities or parameters:
/// 0 OK with nothing confirmed ("confirmed ... MUST be empty if the
/// capabilities are not supported"), or the Error Scheme's
/// INVALID_ARGUMENT.
pub(super) const UNSUPPORTED: &[Code] = &[Code::Ok, Code::InvalidArgument];
/// ListVolumes "Invalid starting_token" (10).
pub(super) const BAD_TOKEN: &[Code] = &[Code::Aborted];
/// The same for a token over the size limit, which is also an invalid
/// field (3).
pub(super) const BAD_TOKEN_OVERSIZED: &[Code] = &[Code::Aborted, Code::InvalidArgument];
/// Agent Discover: agent.proto, UNAVAILABLE when no portal answered.
pub(super) const UNAVAILABLE: &[Code] = &[Code::Unavailable];
/// Agent Attach of a WWID that never appears: agent.proto, "waits (bounded
/// by the deadline) for a device with the WWID" and answers
/// DEADLINE_EXCEEDED; NOT_FOUND ("no such device on this node") and
/// FAILED_PRECONDITION ("WWID mismatch") say it sooner.
pub(super) const ATTACH_NEVER: &[Code] = &[
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::FailedPrecondition,
];
