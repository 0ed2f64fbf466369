//! The lab's network: a bridge in the root namespace and one network
//! namespace per node, joined by veth pairs, all in 198.18.0.0/15 (the
//! range reserved for test networks). Nothing routes outside it.

use std::process::Command;

use anyhow::{Context, bail};

/// Runs a command, failing with its stderr.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command whose failure does not matter (cleanup).
pub fn sh_quiet(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).output();
}

/// Names and addresses of one lab's network.
#[derive(Clone, Debug)]
pub struct Network {
    /// Bridge name (root namespace).
    pub bridge: String,
    /// Third octet of 198.18.<subnet>.0/24.
    pub subnet: u8,
    /// Prefix of namespace and interface names.
    pub prefix: String,
}

impl Network {
    /// The network of lab `prefix` (≤ 6 characters) in 198.18.`subnet`.0/24.
    pub fn new(prefix: &str, subnet: u8) -> Self {
        Self {
            bridge: format!("{prefix}br"),
            subnet,
            prefix: prefix.to_owned(),
        }
    }

    /// The bridge's address: where tgtd and the proxy live.
    pub fn host_ip(&self) -> String {
        format!("198.18.{}.1", self.subnet)
    }

    /// The bridge's second address: tgtd's second portal for VM nodes.
    pub fn second_host_ip(&self) -> String {
        format!("198.18.{}.2", self.subnet)
    }

    /// Adds [`Self::second_host_ip`] to the bridge; returns it.
    pub fn add_second_host_address(&self) -> anyhow::Result<String> {
        let ip = self.second_host_ip();
        sh(
            "ip",
            &["addr", "add", &format!("{ip}/24"), "dev", &self.bridge],
        )?;
        Ok(ip)
    }

    /// Node `i`'s address.
    pub fn node_ip(&self, i: usize) -> String {
        format!("198.18.{}.{}", self.subnet, 11 + i)
    }

    /// The address of VM node `i` on the cluster network (its Node's
    /// InternalIP, `lab up --kubernetes --vm`): on the bridge's subnet,
    /// answered for by the node's namespace.
    pub fn guest_ip(&self, i: usize) -> String {
        format!("198.18.{}.{}", self.subnet, 21 + i)
    }

    /// Node `i`'s namespace name.
    pub fn netns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    /// Creates the bridge.
    pub fn create_bridge(&self) -> anyhow::Result<()> {
        sh("ip", &["link", "add", &self.bridge, "type", "bridge"])?;
        sh(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", self.host_ip()),
                "dev",
                &self.bridge,
            ],
        )?;
        sh("ip", &["link", "set", &self.bridge, "up"])?;
        Ok(())
    }

    /// Creates node `i`'s namespace, veth pair and address.
    pub fn add_node(&self, i: usize) -> anyhow::Result<()> {
        let ns = self.netns(i);
        let host_end = format!("{}h{i}", self.prefix);
        let node_end = format!("{}c{i}", self.prefix);
        sh("ip", &["netns", "add", &ns])?;
        sh(
            "ip",
            &[
                "link", "add", &host_end, "type", "veth", "peer", "name", &node_end,
            ],
        )?;
        sh("ip", &["link", "set", &host_end, "master", &self.bridge])?;
        sh("ip", &["link", "set", &host_end, "up"])?;
        sh("ip", &["link", "set", &node_end, "netns", &ns])?;
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        sh(
            "ip",
            &[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", self.node_ip(i)),
                "dev",
                &node_end,
            ],
        )?;
        sh("ip", &["-n", &ns, "link", "set", &node_end, "up"])?;
        Ok(())
    }

    /// Cuts (`up` false) or restores node `i`'s link to the bridge: its
    /// host end of the veth pair goes down or up, and every packet between
    /// the node and the rest of the lab is dropped meanwhile.
    pub fn set_node_link(&self, i: usize, up: bool) -> anyhow::Result<()> {
        let host_end = format!("{}h{i}", self.prefix);
        sh(
            "ip",
            &["link", "set", &host_end, if up { "up" } else { "down" }],
        )?;
        Ok(())
    }

    /// Removes every namespace, veth and the bridge (missing ones are fine).
    pub fn destroy(&self, nodes: usize) {
        for i in 0..nodes.max(8) {
            sh_quiet("ip", &["netns", "del", &self.netns(i)]);
            sh_quiet("ip", &["link", "del", &format!("{}h{i}", self.prefix)]);
        }
        sh_quiet("ip", &["link", "del", &self.bridge]);
    }
}
