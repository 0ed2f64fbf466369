//! SPIFFE identities carried in certificates.

use std::fmt;

use crate::CertError;

/// The SPIFFE trust domain of one cluster, e.g. `csi-scsi.local`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TrustDomain(String);

/// Who a certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The agent on one node.
    Node(String),
    /// The proxy (controller plugin).
    Proxy,
}

// === impl TrustDomain ===

impl TrustDomain {
    /// Validates a trust domain: lower-case letters, digits, `.`, `-`, `_`.
    pub fn new(name: &str) -> Result<Self, CertError> {
        let ok = !name.is_empty()
            && name.len() <= 255
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(CertError::InvalidName {
                what: "trust domain",
                value: name.to_owned(),
                reason: "use lower-case letters, digits, '.', '-' and '_'",
            })
        }
    }

    /// The trust domain's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SPIFFE URI for an identity in this domain.
    pub fn uri(&self, id: &Identity) -> String {
        match id {
            Identity::Node(node) => format!("spiffe://{}/node/{node}", self.0),
            Identity::Proxy => format!("spiffe://{}/proxy", self.0),
        }
    }

    /// Parses a SPIFFE URI of this domain; `None` for any other URI.
    pub fn parse_uri(&self, uri: &str) -> Option<Identity> {
        let rest = uri
            .strip_prefix("spiffe://")?
            .strip_prefix(self.0.as_str())?;
        match rest {
            "/proxy" => Some(Identity::Proxy),
            _ => {
                let node = rest.strip_prefix("/node/")?;
                validate_node_name(node).ok()?;
                Some(Identity::Node(node.to_owned()))
            }
        }
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === impl Identity ===

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Node(n) => write!(f, "node/{n}"),
            Self::Proxy => f.write_str("proxy"),
        }
    }
}

/// Checks that a node name is a Kubernetes node name (a DNS-1123 subdomain),
/// so it can be both a URI path segment and a DNS SAN.
pub fn validate_node_name(node: &str) -> Result<(), CertError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if node.parse::<std::net::IpAddr>().is_ok() {
        // TLS checks an IP-shaped name against IP SANs, never a DNS SAN,
        // so a certificate could not name such a node the way it names
        // every other.
        return Err(CertError::InvalidName {
            what: "node name",
            value: node.to_owned(),
            reason: "it reads as an IP address; name nodes by host name (kubelet's --hostname-override, or the agents file)",
        });
    }
    if node.len() <= 253 && node.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(CertError::InvalidName {
            what: "node name",
            value: node.to_owned(),
            reason: "a node name is a DNS-1123 subdomain: lower-case letters, digits, '-' and '.'",
        })
    }
}

/// Reads the SPIFFE identities of a DER certificate in `domain`. Returns every
/// `spiffe://` URI SAN, parsed or not, so callers can say what was presented.
pub(crate) fn identities_in(der: &[u8], domain: &TrustDomain) -> (Vec<Identity>, Vec<String>) {
    identities_from(&uris_in(der), domain)
}

/// Every URI name of a DER certificate's subjectAltName (none when it does
/// not parse): parsed once where several names are looked for.
pub(crate) fn uris_in(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}

/// [`identities_in`] over URIs already read.
pub(crate) fn identities_from(
    uris: &[String],
    domain: &TrustDomain,
) -> (Vec<Identity>, Vec<String>) {
    let raw: Vec<String> = uris
        .iter()
        .filter(|uri| uri.starts_with("spiffe://"))
        .cloned()
        .collect();
    let parsed = raw.iter().filter_map(|uri| domain.parse_uri(uri)).collect();
    (parsed, raw)
}

/// The one identity of `domain` a DER certificate names, if exactly one.
pub fn identity_of(der: &[u8], domain: &TrustDomain) -> Option<Identity> {
    let (ids, _) = identities_in(der, domain);
    match ids.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_round_trips_for_node_and_proxy() {
        let td = TrustDomain::new("csi-scsi.local").expect("valid domain");
        for id in [Identity::Node("node-a".into()), Identity::Proxy] {
            assert_eq!(td.parse_uri(&td.uri(&id)), Some(id));
        }
    }

    #[test]
    fn uri_of_another_domain_or_shape_is_not_ours() {
        let td = TrustDomain::new("csi-scsi.local").expect("valid domain");
        for uri in [
            "spiffe://other.local/proxy",
            "spiffe://csi-scsi.localx/proxy",
            "spiffe://csi-scsi.local/node/",
            "spiffe://csi-scsi.local/node/Bad_Name",
            "spiffe://csi-scsi.local/node/a/b",
            "https://csi-scsi.local/proxy",
        ] {
            assert_eq!(td.parse_uri(uri), None, "{uri}");
        }
    }

    #[test]
    fn node_names_follow_dns_1123() {
        for ok in ["node-a", "ip-10-0-0-1.ec2.internal", "n1"] {
            assert!(validate_node_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Node",
            "-a",
            "a-",
            "a..b",
            "a/b",
            "a_b",
            "10.0.0.1",
            "198.18.0.7",
        ] {
            assert!(validate_node_name(bad).is_err(), "{bad}");
        }
    }
}
