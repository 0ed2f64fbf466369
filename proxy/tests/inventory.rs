//! The inventory. `contract` is what every store must do, written once
//! and run over both: the embedded store on a real SQLite file, and the
//! Kubernetes store against the fake API server (`kube_backends/fake_api.rs`).
//! `sqlite` is what only the embedded store does (the file, migrations);
//! the Kubernetes store's own tests (requests, caches, 409s, Events) are in
//! `kube_backends/inventory.rs`. And ControllerUnpublish with the agents
//! file as the list of nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "inventory/contract.rs"]
mod contract;
#[path = "support/devices.rs"]
mod devices;
// The contract's Kubernetes runs use only part of it.
#[allow(dead_code)]
#[path = "kube_backends/fake_api.rs"]
mod fake_api;
#[path = "support/lifecycle.rs"]
mod lifecycle_support;
#[path = "inventory/sqlite.rs"]
mod sqlite;
#[path = "inventory/unpublish.rs"]
mod unpublish;
