//! CSI Node on the agent, end to end: the real agent binary over its real
//! CSI socket, on real loop devices seen through a NodeTree, with real
//! mkfs, mounts and bind mounts (run as root, as CI does).

#[path = "node/bad_input.rs"]
mod bad_input;
#[path = "node/concurrency.rs"]
mod concurrency;
#[path = "node/expand.rs"]
mod expand;
#[path = "node/info.rs"]
mod info;
#[path = "node/lab.rs"]
mod lab;
#[path = "node/lifecycle.rs"]
mod lifecycle;
#[path = "node/refusals.rs"]
mod refusals;
#[path = "node/stats.rs"]
mod stats;
