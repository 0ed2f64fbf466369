//! The lab's stand-in for one node's kernel SCSI layer and iSCSI initiator
//! (see `csi_scsi_tests::kernel`). Two roles:
//!
//! `csi-scsi-lab-kernel --node N --root DIR --fabric FILE --initiator IQN iscsiadm <args>`
//! `csi-scsi-lab-kernel --node N --root DIR --fabric FILE --initiator IQN watch [--iscsid-socket S --argv-log F]`
//!
//! Invoked as `iscsiadm` (a copy named so, in the agent's container), it
//! is the client of the node's `watch --iscsid-socket`: `../iscsid.sock`
//! beside its own directory (see `csi_scsi_tests::kernel::iscsid`).

use std::path::PathBuf;
use std::process::ExitCode;

use csi_scsi_tests::kernel::{NodeContext, iscsiadm, iscsid, watch};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(socket) = as_iscsiadm() {
        let (code, out, err) = iscsid::client(&socket, &args);
        print!("{out}");
        eprint!("{err}");
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let mut iscsid_socket = None;
    let mut argv_log = None;
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
            "--iscsid-socket" => iscsid_socket = Some(PathBuf::from(v)),
            "--argv-log" => argv_log = Some(PathBuf::from(v)),
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
        Some("watch") => match rt.block_on(async {
            if let Some(socket) = iscsid_socket {
                let log = argv_log.unwrap_or_else(|| PathBuf::from("/dev/null"));
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let command = vec![
                    exe.display().to_string(),
                    "--node".into(),
                    ctx.node.clone(),
                    "--root".into(),
                    ctx.root.display().to_string(),
                    "--fabric".into(),
                    ctx.fabric.display().to_string(),
                    "--initiator".into(),
                    ctx.initiator.clone(),
                    "iscsiadm".into(),
                ];
                tokio::spawn(iscsid::serve(command, socket, log));
            }
            watch::run(ctx).await.map_err(|e| e.to_string())
        }) {
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

/// The socket to ask when this binary runs as `iscsiadm`.
fn as_iscsiadm() -> Option<PathBuf> {
    let argv0 = std::env::args().next()?;
    if std::path::Path::new(&argv0).file_name()? != "iscsiadm" {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join(iscsid::SOCKET))
}
