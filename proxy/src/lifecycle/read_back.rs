//! What a read-back through an agent's `Verify` reads: the ranges a wipe's
//! witness and a new LUN's probe ask for. One place, so "reads blank"
//! means the same thing wherever the proxy asks for it.

use csi_scsi_proto::agent::VerifyRequest;

/// Ranges spread at random over the LUN, besides both ends.
const SPREAD_RANGES: usize = 8;
/// The length of each spread range (the agent reads at most 1 MiB).
const SPREAD_LEN: u64 = 64 << 10;
/// What a probe reads at each end: the signatures a filesystem, a volume
/// manager or a partition table leaves sit there (btrfs's at 64 KiB,
/// the backup GPT and md's 1.0 superblock at the end, ZFS's labels in
/// the first and last 512 KiB).
const END_LEN: u64 = 1 << 20;

/// Both ends and [`SPREAD_RANGES`] ranges chosen at random, 64 KiB each,
/// of a LUN recorded at `size` bytes: a wipe's witness reads these.
pub(crate) fn spread(wwid: &str, size: u64, rng: &mut fastrand::Rng) -> VerifyRequest {
    let len = SPREAD_LEN.min(size);
    let mut offsets = vec![0, size - len];
    offsets.extend((0..SPREAD_RANGES).map(|_| rng.u64(0..=(size - len) / 4096) * 4096));
    request(wwid, size, offsets, len)
}

/// The first and the last MiB of a LUN recorded at `size` bytes: where a
/// probe looks for signatures.
pub(crate) fn ends(wwid: &str, size: u64) -> VerifyRequest {
    let len = END_LEN.min(size);
    request(wwid, size, vec![0, size - len], len)
}

fn request(wwid: &str, size: u64, offsets: Vec<u64>, len: u64) -> VerifyRequest {
    VerifyRequest {
        wwid: wwid.to_owned(),
        expected_size_bytes: size,
        offsets,
        // At most END_LEN (1 MiB), so it fits.
        length: len as u32,
    }
}
