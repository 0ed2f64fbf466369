//! csi-scsi benchmarks: prints one table of figures, each next to a
//! baseline measured in the same run, with its target; a missed target is
//! marked MISS, never left out. See BENCHMARKS.md.
//!
//! ```sh
//! cargo build --profile bench-fast --workspace --bins && target/bench-fast/bench [--quick] [--json FILE] [--rows 1,2]
//! ```
//!
//! Rows 1, 4 (agent) and 5 need root (loop devices, device nodes, mounts).
//! All traffic stays on 127.0.0.1.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use csi_scsi_tests::bench::proc::Machine;
use csi_scsi_tests::bench::table::{Row, Verdict, ids, render};
use csi_scsi_tests::bench::{
    Options, fanout, forwarding, helpers, inventory, kube, memory, node_path, storm,
};

const USAGE: &str = "\
usage: bench [--quick] [--json FILE] [--rows LIST] [--keep]

Runs the csi-scsi benchmarks and prints the table (see BENCHMARKS.md).
  --quick       tiny sizes, every row: checks the bench still works (CI);
                its figures mean nothing
  --json FILE   also write the table, with the machine, as JSON to FILE
                (`-` for stdout, after the table)
  --rows LIST   only these row groups, e.g. 1,3 (default: 1,2,3,4,5,6,7;
                6 starts the Kubernetes lab: root and the Go tools;
                7 starts the embedded lab with 101 pool LUNs)
  --keep        keep the scratch directory (logs of every process)

Build first, in the profile you run: the bench starts the csi-scsi-agent
and csi-scsi-proxy binaries next to it:
  cargo build --profile bench-fast --workspace --bins && target/bench-fast/bench";

struct Args {
    opts: Options,
    json: Option<String>,
    rows: Vec<u8>,
    keep: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut out = Args {
        opts: Options { quick: false },
        json: None,
        rows: vec![1, 2, 3, 4, 5, 6, 7],
        keep: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => out.opts.quick = true,
            "--keep" => out.keep = true,
            "--json" => out.json = Some(it.next().ok_or("--json needs a file")?.clone()),
            "--rows" => {
                out.rows = it
                    .next()
                    .ok_or("--rows needs a list")?
                    .split(',')
                    .map(|r| match r.trim().parse::<u8>() {
                        Ok(n @ 1..=7) => Ok(n),
                        _ => Err(format!("--rows: {r:?} is not a row group 1-7")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a.starts_with("__")) {
        return match helpers::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench {}: {e:#}", args[0]);
                ExitCode::FAILURE
            }
        };
    }
    let args = match parse(&args) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("bench: {e}\n\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    let exe = std::env::current_exe().unwrap_or_default();
    let bin_dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    for b in ["csi-scsi-agent", "csi-scsi-proxy", "csi-scsi-certs"] {
        if !bin_dir.join(b).exists() {
            eprintln!(
                "bench: {} is missing: build every binary in this profile first:\n  cargo build --profile {} --workspace --bins",
                bin_dir.join(b).display(),
                profile_name(&bin_dir)
            );
            return ExitCode::from(2);
        }
    }
    csi_scsi_certs::install_crypto_provider();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args, &bin_dir)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn profile_name(bin_dir: &std::path::Path) -> String {
    bin_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "?".into())
}

async fn run(args: Args, bin_dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let machine = Machine::probe();
    let profile = profile_name(bin_dir);
    let scratch = tempfile::Builder::new()
        .prefix("csi-scsi-bench-")
        .tempdir()?;
    let header = format!(
        "csi-scsi bench{}: profile {profile}; {} CPUs ({}), {} MiB memory, kernel {}",
        if args.opts.quick {
            " --quick (figures not meaningful)"
        } else {
            ""
        },
        machine.cpus,
        machine.cpu_model,
        machine.memory_mib,
        machine.kernel
    );
    eprintln!("{header}");
    let mut rows: Vec<Row> = Vec::new();
    for group in &args.rows {
        let dir = scratch.path().join(format!("row{group}"));
        std::fs::create_dir_all(&dir)?;
        let (name, task) = match group {
            1 => (
                "forwarding overhead",
                tokio::spawn(forwarding::run(args.opts, dir)),
            ),
            2 => ("fan-out", tokio::spawn(fanout::run(args.opts, dir))),
            3 => (
                "inventory scale (and proxy memory)",
                tokio::spawn(inventory::run(args.opts, dir)),
            ),
            4 => ("agent memory", tokio::spawn(memory::run(args.opts, dir))),
            6 => (
                "Kubernetes: PVCs and Pods",
                tokio::task::spawn_blocking(move || kube::run(args.opts, dir)),
            ),
            7 => (
                "attach storm on one node",
                tokio::task::spawn_blocking(move || storm::run(args.opts, dir)),
            ),
            _ => ("node path", tokio::spawn(node_path::run(args.opts, dir))),
        };
        eprintln!("== {group}: {name} ...");
        let t = Instant::now();
        let got = match task.await {
            Ok(r) => r,
            Err(e) => vec![Row::error(*group, name, format!("the row panicked: {e}"))],
        };
        eprintln!("== {group}: {name}: {:.1} s", t.elapsed().as_secs_f64());
        rows.extend(got);
    }
    rows.sort_by_key(|r| r.section);
    let elapsed = started.elapsed().as_secs_f64();
    println!("{header}; {elapsed:.0} s\n");
    print!("{}", render(&rows));
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "bench": "csi-scsi",
            "profile": profile,
            "quick": args.opts.quick,
            "machine": machine,
            "elapsed_seconds": elapsed,
            "rows": ids(&rows).into_iter().zip(&rows).map(|(id, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["id"] = serde_json::Value::String(id);
                v
            }).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&json)?;
        if path == "-" {
            println!("{text}");
        } else {
            std::fs::write(path, text + "\n")?;
            eprintln!("bench: JSON written to {path}");
        }
    }
    if args.keep {
        eprintln!("bench: scratch kept in {}", scratch.keep().display());
    }
    let failed = rows.iter().filter(|r| r.verdict == Verdict::Error).count();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
