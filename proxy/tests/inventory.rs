//! The inventory. `contract` is what every store must do, written once
//! and run over both: the embedded store on a real SQLite file, and the
//! Kubernetes store against a real kube-apiserver (`support/real_kube.rs`).
//! `sqlite` is what only the embedded store does (the file, migrations);
//! `discovery`, that one failing device or target stops no other;
//! the Kubernetes store's own tests (requests, caches, 409s, Events) are in
//! `kube_backends/inventory.rs`. And ControllerUnpublish with the agents
//! file as the list of nodes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "inventory/contract.rs"]
mod contract;
#[path = "support/devices.rs"]
mod devices;
#[path = "inventory/discovery.rs"]
mod discovery;
#[path = "support/hooked_store.rs"]
mod hooked_store;
#[path = "support/lifecycle.rs"]
mod lifecycle_support;
#[path = "support/real_kube.rs"]
mod real_kube;
#[path = "inventory/sqlite.rs"]
mod sqlite;
#[path = "inventory/unpublish.rs"]
mod unpublish;
