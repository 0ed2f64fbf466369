//! The controller's life cycle over the embedded store (a real SQLite
//! file), the real agent pool over mutual TLS and stub agents:
//! `publish_race` injects a competing write between a publish's read and
//! its compare-and-swap; `fs_minimum` offers LUNs too small for a
//! filesystem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/agent_stub.rs"]
mod agent_stub;
#[path = "support/devices.rs"]
mod devices;
#[path = "support/hooked_store.rs"]
mod hooked_store;
#[path = "support/lifecycle.rs"]
mod lifecycle_support;

#[path = "controller/fs_minimum.rs"]
mod fs_minimum;
#[path = "controller/publish_race.rs"]
mod publish_race;
