//! `conformance`: the real csi-sanity against a fresh lab (see
//! `docs/conformance.md`). Prints csi-sanity's tally, every failure and
//! every skip with its reason; exits 1 on a failed spec or a skip that
//! `docs/conformance.md` does not list.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use csi_scsi_tests::conformance::{self, Options};
use csi_scsi_tests::storage_e2e;

const USAGE: &str = "\
usage: conformance --csi-sanity PATH [--dir DIR] [--pool N] [--focus REGEX]
                   [--docs FILE] [--keep]
       conformance --kubernetes --e2e PATH [--lab-json FILE] [--driver FILE]...
                   [--focus REGEX] [--skip REGEX] [--out DIR]
                   [--ginkgo PATH] [--procs N] [--disruptive]

Runs csi-sanity (build it with `tools/build csi-sanity`) against a fresh
lab (needs root): Identity and Controller on the proxy, Node on node-a's
agent, through a router socket.
  --csi-sanity PATH  the csi-sanity binary (default: $CSI_SANITY)
  --dir DIR          where the lab lives (default /tmp/csi-scsi-conformance)
  --pool N           pool LUNs of 64 MiB for the suite's volumes (default 16)
  --focus REGEX      only the specs that match (ginkgo focus), in the
                     half-LUN pass only
  --docs FILE        the skip list every skip must appear in
                     (default docs/conformance.md; `-` for none)
  --keep             leave the lab running afterwards

--kubernetes runs Kubernetes' own storage e2e suite (build it with
`tools/build e2e.test`) against a kept Kubernetes lab (`lab up
--kubernetes --keep`), one pass per driver definition:
  --e2e PATH         the e2e.test binary (default: $E2E_TEST)
  --lab-json FILE    the kept lab's lab.json (default ./lab.json, where lab up writes it)
  --driver FILE      a definition, one pass each (default: ext4, xfs and
                     topology, tests/storage-e2e/csi-scsi-*.yaml, each with the
                     specs it is for)
  --focus REGEX      only the External Storage specs that match (in every pass)
  --skip REGEX       never these (default: the specs docs/conformance.md lists
                     under \"Not run\", with why)
  --out DIR          images, reports, logs (default /tmp/csi-scsi-storage-e2e)
  --ginkgo PATH      the ginkgo CLI (`tools/build ginkgo`; default: $GINKGO),
                     which runs the specs in parallel processes
  --procs N          parallel processes with --ginkgo (default 4; 1 runs
                     e2e.test alone)
  --disruptive       the disruptive pass instead: the ext4 definition's
                     [Disruptive] specs (kubelet stopped and started over SSH
                     to the nodes' shells, volumes mounted), one at a time";

/// `--kubernetes`: the kept lab's `lab.json` and the suite's options.
fn parse_kubernetes(args: &[String]) -> Result<(PathBuf, storage_e2e::Options), String> {
    let mut lab_json = PathBuf::from("lab.json");
    let mut opts = storage_e2e::Options {
        e2e: std::env::var_os("E2E_TEST")
            .map(PathBuf::from)
            .unwrap_or_default(),
        drivers: Vec::new(),
        focus: None,
        skip: None,
        // `conformance --kubernetes` runs against the fast Kubernetes lab.
        kernel: storage_e2e::Kernel::StandIn,
        disruptive: false,
        out: PathBuf::from("/tmp/csi-scsi-storage-e2e"),
        ginkgo: std::env::var_os("GINKGO").map(PathBuf::from),
        procs: 4,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--kubernetes" => {}
            "--e2e" => opts.e2e = value()?.into(),
            "--lab-json" => lab_json = value()?.into(),
            "--driver" => opts.drivers.push(value()?.into()),
            "--focus" => opts.focus = Some(value()?),
            "--skip" => opts.skip = Some(value()?),
            "--disruptive" => opts.disruptive = true,
            "--out" => opts.out = value()?.into(),
            "--ginkgo" => opts.ginkgo = Some(value()?.into()),
            "--procs" => {
                opts.procs = value()?
                    .parse()
                    .ok()
                    .filter(|n| (1..=16).contains(n))
                    .ok_or("--procs takes 1 to 16")?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if opts.e2e.as_os_str().is_empty() {
        return Err("--e2e PATH (or $E2E_TEST) is required".into());
    }
    Ok((lab_json, opts))
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        sanity: std::env::var_os("CSI_SANITY")
            .map(PathBuf::from)
            .unwrap_or_default(),
        dir: PathBuf::from("/tmp/csi-scsi-conformance"),
        pool: 16,
        focus: None,
        documented: Some(PathBuf::from("docs/conformance.md")),
        keep: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--csi-sanity" => opts.sanity = value()?.into(),
            "--dir" => opts.dir = value()?.into(),
            "--pool" => {
                opts.pool = value()?
                    .parse()
                    .ok()
                    .filter(|n| (4..=64).contains(n))
                    .ok_or("--pool takes 4 to 64")?
            }
            "--focus" => opts.focus = Some(value()?),
            "--docs" => {
                let v = value()?;
                opts.documented = (v != "-").then(|| PathBuf::from(v));
            }
            "--keep" => opts.keep = true,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if opts.sanity.as_os_str().is_empty() {
        return Err("--csi-sanity PATH (or $CSI_SANITY) is required".into());
    }
    Ok(opts)
}

/// The parsed options, or the exit code after saying why and the usage.
fn or_usage<T>(parsed: Result<T, String>) -> Result<T, ExitCode> {
    parsed.map_err(|e| {
        if !e.is_empty() {
            eprintln!("conformance: {e}");
        }
        eprintln!("{USAGE}");
        ExitCode::from(64)
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--kubernetes") {
        return kubernetes(&argv);
    }
    let opts = match or_usage(parse(&argv)) {
        Ok(o) => o,
        Err(code) => return code,
    };
    csi_scsi_certs::install_crypto_provider();
    match conformance::run(&opts, &mut |s: &str| println!("  - {s}")).await {
        Ok(report) => {
            print!("{}", report.render());
            if report.passed() {
                println!("conformance: PASSED");
                ExitCode::SUCCESS
            } else {
                println!(
                    "conformance: FAILED (log: {}/csi-sanity.log)",
                    opts.dir.display()
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conformance: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--kubernetes`: the storage e2e suite against a kept lab.
fn kubernetes(argv: &[String]) -> ExitCode {
    let (lab_json, opts) = match or_usage(parse_kubernetes(argv)) {
        Ok(o) => o,
        Err(code) => return code,
    };
    match storage_e2e::run(&lab_json, &opts, &mut |s: &str| println!("  - {s}")) {
        Ok(passes) => {
            print!("{}", storage_e2e::render(&passes));
            if passes.iter().all(storage_e2e::Pass::passed) {
                println!("conformance: storage e2e PASSED");
                ExitCode::SUCCESS
            } else {
                println!(
                    "conformance: storage e2e FAILED (logs: {})",
                    opts.out.display()
                );
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conformance: {e:#}");
            ExitCode::FAILURE
        }
    }
}
