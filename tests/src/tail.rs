//! The last lines of a log or an output, for error messages and reports:
//! one rule for every suite and lab.

use std::path::Path;

/// The last `n` of `lines`, joined by newlines.
pub fn last_lines<'a>(lines: impl IntoIterator<Item = &'a str>, n: usize) -> String {
    let lines: Vec<&str> = lines.into_iter().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    last_lines(text.lines(), n)
}

/// The last `n` lines of the file at `path` (empty when it cannot be read:
/// this only decorates an error that is already on its way).
pub fn tail_file(path: &Path, n: usize) -> String {
    tail(&std::fs::read_to_string(path).unwrap_or_default(), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines_or_all_of_fewer() {
        let cases = [
            ("a\nb\nc\n", 2, "b\nc"),
            ("a\nb\nc", 5, "a\nb\nc"),
            ("a\nb", 0, ""),
            ("", 3, ""),
        ];
        for (text, n, want) in cases {
            assert_eq!(tail(text, n), want, "tail({text:?}, {n})");
        }
    }

    #[test]
    fn an_unreadable_file_has_an_empty_tail() {
        assert_eq!(tail_file(Path::new("/nonexistent/csi-scsi-log"), 3), "");
    }
}
