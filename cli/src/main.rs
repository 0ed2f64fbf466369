//! csi-scsi: inspection CLI (work in progress).
fn main() {}
