//! csi-scsi reliability suites: crash (processes killed mid-operation),
//! fault (nodes unreachable, certificates rotating, a full or read-only
//! store) and sweep (malformed CSI and agent API requests). Prints each
//! suite's figures; exits 1 on any violated invariant. See
//! docs/reliability.md.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use csi_scsi_tests::reliability::{self, Scale, SuiteReport, crash, fault, sweep};

const USAGE: &str = "\
usage: reliability [--quick | --full] [--seed N] [--suite LIST] [--dir DIR]

Runs the csi-scsi reliability suites against labs (needs root) and prints
operations, faults injected, invariants checked and violations per suite.
  --quick       bounded to a few minutes (what CI runs; the default)
  --full        the full run
  --seed N      seed of every random choice (default: $CSI_SCSI_SEED, or
                random); a failing run prints the seed that replays it
  --suite LIST  comma-separated: crash,fault,sweep (default: all)
  --dir DIR     where the labs live (default /tmp/csi-scsi-reliability)

Build first: cargo build --workspace --bins";

struct Args {
    scale: Scale,
    seed: u64,
    suites: Vec<String>,
    dir: PathBuf,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        scale: Scale::Quick,
        seed: reliability::seed_from_env(),
        suites: vec!["crash".into(), "fault".into(), "sweep".into()],
        dir: PathBuf::from("/tmp/csi-scsi-reliability"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => out.scale = Scale::Quick,
            "--full" => out.scale = Scale::Full,
            "--seed" => {
                out.seed = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--seed needs a number")?
            }
            "--suite" => {
                out.suites = it
                    .next()
                    .ok_or("--suite needs a list")?
                    .split(',')
                    .map(str::to_owned)
                    .collect();
                if let Some(bad) = out
                    .suites
                    .iter()
                    .find(|s| !["crash", "fault", "sweep"].contains(&s.as_str()))
                {
                    return Err(format!("unknown suite {bad:?}"));
                }
            }
            "--dir" => out.dir = it.next().ok_or("--dir needs a path")?.into(),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

// Several threads: the fault suite's load loops and checks run at once.
#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("reliability: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(64);
        }
    };
    csi_scsi_certs::install_crypto_provider();
    println!(
        "reliability: {} run, seed {} (replay: CSI_SCSI_SEED={} or --seed {})",
        if args.scale == Scale::Full {
            "full"
        } else {
            "quick"
        },
        args.seed,
        args.seed,
        args.seed
    );
    let mut reports: Vec<SuiteReport> = Vec::new();
    for suite in &args.suites {
        let dir = args.dir.join(suite);
        println!("== {suite}");
        let result = match suite.as_str() {
            "crash" => crash::run(args.scale, args.seed, &dir).await,
            "fault" => fault::run(args.scale, args.seed, &dir).await,
            _ => sweep::run(args.scale, args.seed, &dir).await,
        };
        match result {
            Ok(r) => {
                print!("{}", r.render());
                reports.push(r);
            }
            Err(e) => {
                let mut r = SuiteReport::new(suite, args.seed);
                r.violations.push(format!("the suite could not run: {e:#}"));
                print!("{}", r.render());
                reports.push(r);
            }
        }
    }
    println!("== summary");
    for r in &reports {
        print!("{}", r.render().lines().next().unwrap_or_default());
        println!();
    }
    if reports.iter().all(SuiteReport::passed) {
        println!("reliability: zero violations");
        ExitCode::SUCCESS
    } else {
        println!("reliability: VIOLATIONS (seed {})", args.seed);
        ExitCode::FAILURE
    }
}
