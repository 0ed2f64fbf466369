//! `csi-scsi-certs`: create the cluster CA and issue agent and proxy
//! certificates, as PEM files or Kubernetes Secret manifests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use csi_scsi_certs::{
    CA_CERT_FILE, CA_KEY_FILE, CertError, CertificateAuthority, Identity, JoinTokens, TrustDomain,
    Validity, secret_manifest, write_issued,
};

/// Trust material for csi-scsi's mutual TLS between the proxy and agents.
///
/// One CA per cluster. Each agent gets a server certificate naming its node
/// (spiffe://<trust-domain>/node/<node> and DNS <node>); the proxy gets a
/// client certificate naming spiffe://<trust-domain>/proxy. Keys are ECDSA
/// P-256 and written with mode 0600.
#[derive(Parser, Debug)]
#[command(name = "csi-scsi-certs", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new cluster CA: writes ca.crt and ca.key (0600) into --out.
    InitCa {
        /// Directory for ca.crt and ca.key.
        #[arg(long)]
        out: PathBuf,
        /// SPIFFE trust domain, recorded in the CA certificate.
        #[arg(long, default_value = "csi-scsi.local")]
        trust_domain: String,
        /// Validity in days. A year: short enough that rotating it is a
        /// practised routine (docs/certificates.md, "CA rotation"), not a
        /// decade-old secret.
        #[arg(long, default_value_t = 365)]
        days: u32,
        /// Replace an existing CA (every certificate it issued stops being trusted
        /// once agents and the proxy load the new ca.crt).
        #[arg(long)]
        force: bool,
    },
    /// Issue the server certificate of the agent on one node.
    IssueAgent {
        /// Kubernetes node name the agent runs on.
        #[arg(long)]
        node: String,
        #[command(flatten)]
        issue: IssueArgs,
    },
    /// Issue the proxy's client certificate.
    IssueProxy {
        #[command(flatten)]
        issue: IssueArgs,
    },
    /// Print the CA as the Secret the proxy signs with (ca.crt, ca.key)
    /// and the ConfigMap the agents trust (ca.crt), for `kubectl apply -f -`.
    CaManifests {
        /// Directory holding the CA's ca.crt and ca.key.
        #[arg(long)]
        ca: PathBuf,
        /// Name of both objects.
        #[arg(long, default_value = "csi-scsi-ca")]
        name: String,
        /// Their namespace (the driver's).
        #[arg(long, default_value = "csi-scsi")]
        namespace: String,
        /// Also trust the CA certificate(s) in this file (a CA rotation:
        /// the other CA's ca.crt). Repeatable.
        #[arg(long, value_name = "CA_CRT")]
        also_trust: Vec<PathBuf>,
    },
    /// Make a one-time join token for the agent of one node (embedded
    /// mode): its digest goes into the proxy's --join-tokens-dir, the token
    /// to stdout, for that agent's --join-token-file.
    JoinToken {
        /// The node whose agent may use it.
        #[arg(long)]
        node: String,
        /// The proxy's --join-tokens-dir.
        #[arg(long)]
        dir: PathBuf,
        /// Minutes it stays valid (unused).
        #[arg(long, default_value_t = 60)]
        ttl_minutes: u64,
    },
}

#[derive(Args, Debug)]
struct IssueArgs {
    /// Directory holding the CA's ca.crt and ca.key.
    #[arg(long)]
    ca: PathBuf,
    /// pem: a directory with tls.crt, tls.key, ca.crt. secret: a YAML file
    /// (or stdout when --out is "-") with a kubernetes.io/tls Secret.
    #[arg(long, value_enum, default_value_t = Format::Pem)]
    format: Format,
    /// Output directory (pem) or file (secret; "-" for stdout).
    #[arg(long)]
    out: PathBuf,
    /// Validity in days. 90 for the proxy's (rotate it with cert-manager,
    /// or reissue it before the alert fires); agents in a cluster enrol
    /// and are renewed by the proxy instead.
    #[arg(long, default_value_t = 90)]
    days: u32,
    /// Also trust the CA certificate(s) in this file, in the issued ca.crt
    /// (a CA rotation: the other CA's ca.crt). Repeatable.
    #[arg(long, value_name = "CA_CRT")]
    also_trust: Vec<PathBuf>,
    /// Secret name (secret format); defaults to csi-scsi-agent-<node> or csi-scsi-proxy.
    #[arg(long)]
    secret_name: Option<String>,
    /// Secret namespace (secret format).
    #[arg(long, default_value = "csi-scsi")]
    namespace: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Pem,
    Secret,
}

fn main() -> ExitCode {
    csi_scsi_certs::install_crypto_provider();
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(msg) => {
            eprintln!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("csi-scsi-certs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<String, CertError> {
    match command {
        Command::InitCa {
            out,
            trust_domain,
            days,
            force,
        } => {
            let key_path = out.join(CA_KEY_FILE);
            if key_path.exists() && !force {
                return Err(CertError::Io {
                    path: key_path,
                    source: std::io::Error::new(
                        std::io::ErrorKind::AlreadyExists,
                        "a CA already exists here; pass --force to replace it",
                    ),
                });
            }
            let domain = TrustDomain::new(&trust_domain)?;
            let ca = CertificateAuthority::create(&domain, Validity::days(days))?;
            csi_scsi_certs::write_ca(&out, &ca)?;
            Ok(format!(
                "created CA for trust domain {domain} in {}",
                out.display()
            ))
        }
        Command::IssueAgent { node, issue } => {
            let name = issue
                .secret_name
                .clone()
                .unwrap_or_else(|| format!("csi-scsi-agent-{node}"));
            issue_to(&issue, &Identity::Node(node), &name)
        }
        Command::CaManifests {
            ca,
            name,
            namespace,
            also_trust,
        } => {
            let ca = load_ca(&ca, &also_trust)?;
            print!("{}", csi_scsi_certs::ca_manifests(&ca, &name, &namespace));
            Ok(format!(
                "printed Secret and ConfigMap {namespace}/{name} (the Secret holds the CA key)"
            ))
        }
        Command::JoinToken {
            node,
            dir,
            ttl_minutes,
        } => {
            let token = JoinTokens::new(&dir)
                .create(&node, std::time::Duration::from_secs(ttl_minutes * 60))?;
            println!("{token}");
            Ok(format!(
                "join token for node {node} recorded in {} (valid {ttl_minutes} min, once)",
                dir.display()
            ))
        }
        Command::IssueProxy { issue } => {
            let name = issue
                .secret_name
                .clone()
                .unwrap_or_else(|| "csi-scsi-proxy".into());
            issue_to(&issue, &Identity::Proxy, &name)
        }
    }
}

fn issue_to(args: &IssueArgs, identity: &Identity, secret_name: &str) -> Result<String, CertError> {
    let ca = load_ca(&args.ca, &args.also_trust)?;
    let issued = ca.issue(identity, Validity::days(args.days))?;
    let uri = ca.trust_domain().uri(identity);
    match args.format {
        Format::Pem => {
            write_issued(&args.out, &issued)?;
            Ok(format!("issued {uri} into {}", args.out.display()))
        }
        Format::Secret => {
            let yaml = secret_manifest(&issued, secret_name, &args.namespace);
            if args.out == Path::new("-") {
                print!("{yaml}");
            } else {
                csi_scsi_certs::write_private_file(&args.out, &yaml)?;
            }
            Ok(format!(
                "issued {uri} as Secret {}/{secret_name}",
                args.namespace
            ))
        }
    }
}

/// The CA in `dir`, its trust bundle extended by the CA certificates in
/// `also_trust`.
fn load_ca(dir: &Path, also_trust: &[PathBuf]) -> Result<CertificateAuthority, CertError> {
    let mut ca = CertificateAuthority::load(&dir.join(CA_CERT_FILE), &dir.join(CA_KEY_FILE))?;
    for path in also_trust {
        let pem = std::fs::read_to_string(path).map_err(|source| CertError::Io {
            path: path.clone(),
            source,
        })?;
        ca = ca.also_trusting(&pem, path)?;
    }
    Ok(ca)
}
