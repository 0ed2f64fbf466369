//! End-to-end tests: real binaries, real Unix sockets, real TLS handshakes.
//! One test binary with submodules, to keep link time down.
#![allow(clippy::unwrap_used)]
#![warn(clippy::assertions_on_result_states)]

#[path = "e2e/agent_api.rs"]
mod agent_api;
#[path = "e2e/controller.rs"]
mod controller;
#[path = "e2e/crash.rs"]
mod crash;
#[path = "e2e/disks.rs"]
mod disks;
#[path = "e2e/enrolment.rs"]
mod enrolment;
#[path = "e2e/fault.rs"]
mod fault;
#[path = "e2e/identity.rs"]
mod identity;
#[path = "e2e/lab.rs"]
mod lab;
#[path = "e2e/mtls.rs"]
mod mtls;
#[path = "e2e/node.rs"]
mod node;
#[path = "e2e/observability.rs"]
mod observability;
#[path = "e2e/rotation.rs"]
mod rotation;
#[path = "e2e/support.rs"]
mod support;
#[path = "e2e/sweep.rs"]
mod sweep;
