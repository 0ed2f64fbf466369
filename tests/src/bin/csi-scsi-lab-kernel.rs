//! The lab's stand-in for one node's kernel SCSI layer and iSCSI initiator
//! (see `csi_scsi_tests::kernel`). Two roles:
//!
//! `csi-scsi-lab-kernel --node N --root DIR --fabric FILE --initiator IQN iscsiadm <args>`
//! `csi-scsi-lab-kernel --node N --root DIR --fabric FILE --initiator IQN watch`

use std::path::PathBuf;
use std::process::ExitCode;

use csi_scsi_tests::kernel::{NodeContext, iscsiadm, watch};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut ctx = NodeContext {
        node: String::new(),
        root: PathBuf::new(),
        fabric: PathBuf::new(),
        initiator: String::new(),
        scan_delay: std::time::Duration::ZERO,
    };
    let mut i = 0;
    while i + 1 < args.len() && args[i].starts_with("--") {
        let v = args[i + 1].clone();
        match args[i].as_str() {
            "--node" => ctx.node = v,
            "--root" => ctx.root = PathBuf::from(v),
            "--fabric" => ctx.fabric = PathBuf::from(v),
            "--initiator" => ctx.initiator = v,
            "--scan-delay-ms" => {
                ctx.scan_delay = std::time::Duration::from_millis(v.parse().unwrap_or(0))
            }
            other => {
                eprintln!("csi-scsi-lab-kernel: unknown option {other}");
                return ExitCode::from(64);
            }
        }
        i += 2;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    match args.get(i).map(String::as_str) {
        Some("iscsiadm") => {
            let (code, out, err) = rt.block_on(iscsiadm::run(&ctx, &args[i + 1..]));
            print!("{out}");
            eprint!("{err}");
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Some("watch") => match rt.block_on(watch::run(ctx)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("csi-scsi-lab-kernel: {e}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: csi-scsi-lab-kernel --node N --root DIR --fabric FILE --initiator IQN (iscsiadm ARGS | watch)"
            );
            ExitCode::from(64)
        }
    }
}
