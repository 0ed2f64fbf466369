//! Kubernetes-style label selectors over device labels, for the
//! `deviceSelector` StorageClass parameter: `tier=fast,array in (a1,a2)`.
//! Supported: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.

use std::collections::BTreeMap;

/// A parsed selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// One requirement on one label key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Why a selector does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {input:?}: {reason}")]
pub struct InvalidSelector {
    /// The selector text (an [`excerpt`] of a long one).
    pub input: String,
    /// What is wrong.
    pub reason: String,
}

impl Selector {
    /// Parses a selector; the empty string selects everything.
    pub fn parse(input: &str) -> Result<Self, InvalidSelector> {
        let bad = |reason: String| InvalidSelector {
            input: excerpt(input),
            reason,
        };
        let mut reqs = Vec::new();
        for term in split_terms(input).map_err(|r| bad(r.into()))? {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            reqs.push(parse_term(term).map_err(bad)?);
        }
        Ok(Self(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Splits at commas outside parentheses.
fn split_terms(input: &str) -> Result<Vec<&str>, &'static str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')'");
                }
            }
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('");
    }
    out.push(&input[start..]);
    Ok(out)
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_of(key)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Requirement::NotEquals(key_of(k)?, value_of(v)?));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Requirement::Equals(key_of(k)?, value_of(v)?));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((k, rest)) = term.split_once(op) {
            let list = rest
                .trim()
                .strip_prefix('(')
                .and_then(|r| r.strip_suffix(')'))
                .ok_or_else(|| format!("{:?}: values must be in parentheses", excerpt(term)))?;
            let values = list
                .split(',')
                .map(value_of)
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(if notin {
                Requirement::NotIn(key_of(k)?, values)
            } else {
                Requirement::In(key_of(k)?, values)
            });
        }
    }
    Ok(Requirement::Exists(key_of(term)?))
}

fn key_of(k: &str) -> Result<String, String> {
    let k = k.trim();
    let ok = !k.is_empty()
        && k.len() <= 253
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b));
    if ok {
        Ok(k.to_owned())
    } else {
        Err(format!("invalid label key {:?}", excerpt(k)))
    }
}

fn value_of(v: &str) -> Result<String, String> {
    let v = v.trim();
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(format!("invalid label value {:?}", excerpt(v)))
    }
}

pub(crate) use csi_scsi_textfs::excerpt;

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_matches_like_kubernetes() {
        let l = labels(&[("tier", "fast"), ("array", "a1")]);
        for (sel, want) in [
            ("", true),
            ("tier=fast", true),
            ("tier==fast", true),
            ("tier=slow", false),
            ("tier!=slow", true),
            ("array in (a1,a2)", true),
            ("array notin (a1,a2)", false),
            ("tier=fast,array in (a2, a3)", false),
            ("tier", true),
            ("!tier", false),
            ("!zone", true),
            ("zone notin (x)", true),
        ] {
            assert_eq!(Selector::parse(sel).expect(sel).matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn errors_quote_an_excerpt_of_a_long_selector() {
        let long = format!("{}=x y", "k".repeat(10_000));
        let e = Selector::parse(&long).expect_err("blank in value");
        assert!(e.to_string().len() < 400, "{e}");
        assert!(e.input.contains("10004 bytes"), "{e}");
    }

    #[test]
    fn malformed_selectors_are_refused() {
        for sel in [
            "array in a1",
            "array in (a1",
            "a)",
            "ti er=fast",
            "k=v v",
            "=x",
        ] {
            assert!(Selector::parse(sel).is_err(), "{sel}");
        }
    }
}
