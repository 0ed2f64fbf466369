//! The lab's helper on VM nodes (`csi_scsi_tests::vm::guest`):
//!   csi-scsi-lab-guest serve --listen ADDR --csi PATH   in the guest
//!   csi-scsi-lab-guest relay --listen PATH --to ADDR    on the host: the
//!       node's CSI socket where kubelet's would be, carried to the guest

use std::path::PathBuf;

use anyhow::{Context, bail};
use csi_scsi_tests::vm::guest;

fn flag(args: &[String], name: &str) -> anyhow::Result<String> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].clone())
        .with_context(|| format!("{name} is required"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let listen = flag(&args, "--listen")?.parse()?;
            guest::serve(listen, PathBuf::from(flag(&args, "--csi")?)).await
        }
        Some("relay") => {
            let to = flag(&args, "--to")?.parse()?;
            guest::relay(PathBuf::from(flag(&args, "--listen")?), to).await
        }
        _ => bail!(
            "usage: csi-scsi-lab-guest serve --listen ADDR --csi PATH | relay --listen PATH --to ADDR"
        ),
    }
}
