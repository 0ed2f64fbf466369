//! The last look before a write to a LUN: whether the sizes its paths
//! report, just rescanned, leave its size in doubt.

/// Why the sizes the paths of one LUN report leave its size in doubt: one
/// reports none, or they disagree. `None`: one size, not zero.
pub(crate) fn sizes_in_doubt(sizes: &[(&str, u64)]) -> Option<String> {
    let shown = || {
        sizes
            .iter()
            .map(|(n, b)| format!("{n} {b} bytes"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some((name, _)) = sizes.iter().find(|(_, b)| *b == 0) {
        return Some(format!(
            "its path {name} reports a size of 0 bytes after a rescan ({}): the LUN's size is in doubt",
            shown()
        ));
    }
    let first = sizes.first().map(|(_, b)| *b);
    if sizes.iter().any(|(_, b)| Some(*b) != first) {
        return Some(format!(
            "its paths disagree on its size after a rescan ({}): the LUN's size is in doubt",
            shown()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_report_no_size_or_disagree_leave_the_size_in_doubt() {
        const M: u64 = 64 << 20;
        // (path sizes, in doubt)
        let cases: [(&[(&str, u64)], bool); 6] = [
            (&[("sdb", M)], false),
            (&[("sdb", M), ("sdc", M)], false),
            (&[("sdb", 0)], true),
            (&[("sdb", M), ("sdc", 0)], true),
            (&[("sdb", M), ("sdc", 2 * M)], true),
            (&[], false),
        ];
        for (sizes, doubt) in cases {
            assert_eq!(sizes_in_doubt(sizes).is_some(), doubt, "{sizes:?}");
        }
    }
}
