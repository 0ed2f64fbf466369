//! Where CreateVolume may bind a LUN: CSI's accessibility requirements in
//! node terms, the order a bind tries the nodes in, and which nodes the
//! new volume is then reported accessible from.
//!
//! The rule (docs/parameters.md, "Topology"): the preferred nodes are tried
//! in their order, then the rest of the requisite ones; the LUN must be
//! visible from one of them; the volume is accessible from the nodes that
//! see its LUN and are requisite. So a StorageClass's `allowedTopologies`
//! (immediate binding) bounds the PV's node affinity, and a LUN seen by
//! several allowed nodes still lets its Pod move among them.

use csi_scsi_contract::NodeName;

/// Where a volume may live, and in which order a bind looks. The default
/// is anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The only nodes allowed (no duplicates), in the order a bind tries
    /// them: the preferred ones first, then the rest of requisite. Empty:
    /// the request carried no requirement, so any node, and the volume is
    /// accessible from every node that sees its LUN.
    order: Vec<NodeName>,
}

/// Why requirements make no placement.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The spec: "If requisite is specified, all topologies in preferred
    /// list MUST also be present in the list of requisite topologies."
    #[error("preferred node {0} is not among the requisite ones")]
    PreferredNotRequisite(NodeName),
}

impl Placement {
    /// The placement for `preferred` and `requisite` nodes, each in the
    /// order the request gave them. No requisite node: the preferred ones
    /// bound the volume all the same (the spec lets a plugin choose any
    /// node then; staying where the caller pointed refuses nothing it
    /// asked for). Neither: anywhere.
    pub fn new(preferred: &[NodeName], requisite: &[NodeName]) -> Result<Self, PlacementError> {
        if let Some(stray) = preferred
            .iter()
            .find(|p| !requisite.is_empty() && !requisite.contains(p))
        {
            return Err(PlacementError::PreferredNotRequisite(stray.clone()));
        }
        let mut order: Vec<NodeName> = Vec::new();
        for node in preferred.iter().chain(requisite) {
            if !order.contains(node) {
                order.push(node.clone());
            }
        }
        Ok(Self { order })
    }

    /// No requirement: any node.
    pub fn anywhere() -> Self {
        Self::default()
    }

    /// Whether any node will do.
    pub fn is_anywhere(&self) -> bool {
        self.order.is_empty()
    }

    /// The nodes a bind tries, in turn (none: anywhere).
    pub fn order(&self) -> &[NodeName] {
        &self.order
    }

    /// Whether a LUN seen by `lun_nodes` may serve the volume: one of them
    /// is a node the placement allows, or any node will do (a LUN no node
    /// sees at the moment still serves a volume asked for anywhere).
    pub fn admits(&self, lun_nodes: &[NodeName]) -> bool {
        self.is_anywhere() || !self.accessible(lun_nodes).is_empty()
    }

    /// The nodes a volume on a LUN seen by `lun_nodes` is accessible from,
    /// in `lun_nodes`' order: those the placement allows.
    pub fn accessible(&self, lun_nodes: &[NodeName]) -> Vec<NodeName> {
        lun_nodes
            .iter()
            .filter(|n| self.is_anywhere() || self.order.contains(n))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node names as a table writes them.
    type Names = &'static [&'static str];

    fn nodes(names: &[&str]) -> Vec<NodeName> {
        names
            .iter()
            .map(|n| NodeName::parse(n).expect("node"))
            .collect()
    }

    fn order(p: &Placement) -> Vec<String> {
        p.order().iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn preferred_nodes_come_first_then_the_rest_of_requisite() {
        // (preferred, requisite, the order a bind tries)
        let cases: [(Names, Names, Names); 7] = [
            (&[], &[], &[]),
            (&["c"], &["a", "b", "c"], &["c", "a", "b"]),
            (&["b", "a"], &["a", "b"], &["b", "a"]),
            (&[], &["b", "a"], &["b", "a"]),
            (&["a"], &[], &["a"]),
            (&["a", "a"], &["a", "b", "b"], &["a", "b"]),
            // external-provisioner's immediate binding: requisite rotated.
            (&["b", "c", "a"], &["a", "b", "c"], &["b", "c", "a"]),
        ];
        for (preferred, requisite, want) in cases {
            let p = Placement::new(&nodes(preferred), &nodes(requisite)).expect("placement");
            assert_eq!(order(&p), want, "{preferred:?} / {requisite:?}");
        }
    }

    #[test]
    fn a_preferred_node_outside_requisite_is_refused() {
        assert_eq!(
            Placement::new(&nodes(&["c"]), &nodes(&["a", "b"])),
            Err(PlacementError::PreferredNotRequisite(
                nodes(&["c"])[0].clone()
            ))
        );
    }

    #[test]
    fn a_volume_is_accessible_from_the_nodes_that_see_it_and_are_allowed() {
        // (preferred, requisite, nodes that see the LUN, accessible from)
        let cases: [(Names, Names, Names, Names); 7] = [
            // No requirement: wherever the LUN is seen.
            (&[], &[], &["a", "b", "c"], &["a", "b", "c"]),
            // allowedTopologies {a, b}: c sees the LUN but is not allowed.
            (&["a"], &["a", "b"], &["a", "b", "c"], &["a", "b"]),
            (&[], &["a", "b"], &["a", "b", "c"], &["a", "b"]),
            // Delayed binding: every node requisite, the selected first;
            // the Pod may still move to any node that sees the LUN.
            (
                &["b"],
                &["a", "b", "c", "d"],
                &["a", "b", "c"],
                &["a", "b", "c"],
            ),
            (&["a"], &["a"], &["a", "b"], &["a"]),
            (&["a"], &[], &["a", "b"], &["a"]),
            // Not admitted: no allowed node sees it.
            (&["a"], &["a"], &["b", "c"], &[]),
        ];
        for (preferred, requisite, seen, want) in cases {
            let p = Placement::new(&nodes(preferred), &nodes(requisite)).expect("placement");
            assert_eq!(
                p.accessible(&nodes(seen)),
                nodes(want),
                "{preferred:?} / {requisite:?} / {seen:?}"
            );
            assert_eq!(p.admits(&nodes(seen)), !want.is_empty());
        }
        // Asked for anywhere, a LUN no node sees now is still admitted.
        assert!(Placement::anywhere().admits(&[]));
        assert!(!Placement::new(&[], &nodes(&["a"])).expect("a").admits(&[]));
    }
}
