//! Prints the csi-scsi CustomResourceDefinitions as YAML, or writes one file
//! per CRD: `crdgen --write deploy/crds`. The files are checked in, and a
//! test fails when they differ from what the Rust types generate.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let target = match (args.next().as_deref(), args.next(), args.next()) {
        (None, None, None) => None,
        (Some("--write"), Some(dir), None) => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: crdgen [--write <dir>]");
            return ExitCode::from(64);
        }
    };
    let files = match csi_scsi_proxy::resources::crd_files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: cannot render the CRDs: {e}");
            return ExitCode::FAILURE;
        }
    };
    match target {
        None => {
            let all: Vec<&str> = files.iter().map(|(_, yaml)| yaml.as_str()).collect();
            print!("{}", all.join("---\n"));
        }
        Some(dir) => {
            for (name, yaml) in &files {
                let path = dir.join(name);
                if let Err(e) = std::fs::write(&path, yaml) {
                    eprintln!("crdgen: {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
                eprintln!("wrote {}", path.display());
            }
        }
    }
    ExitCode::SUCCESS
}
