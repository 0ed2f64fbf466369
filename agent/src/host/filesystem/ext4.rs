//! The size an ext4 filesystem claims, from its superblock: what NodeStage
//! compares with the device's to grow an unmounted filesystem whose LUN
//! grew while it was not staged.

use std::path::Path;

/// Where the primary superblock starts.
const SUPERBLOCK: u64 = 1024;
/// The superblock's fields read here end before this.
const READ: usize = 0x160;
const MAGIC: u16 = 0xEF53;
/// `INCOMPAT_64BIT`: the block count has a high half.
const INCOMPAT_64BIT: u32 = 0x80;

/// The filesystem's size in bytes (block count × block size) from the
/// superblock bytes at [`SUPERBLOCK`]; `None` when they are not an ext4
/// superblock one can trust (bad magic, an impossible block size).
pub(crate) fn size_from_superblock(sb: &[u8]) -> Option<u64> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(sb.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(sb.get(o..o + 4)?.try_into().ok()?));
    if u16_at(0x38)? != MAGIC {
        return None;
    }
    // s_log_block_size: 1 KiB << n; ext4 allows 1 KiB to 64 KiB.
    let log = u32_at(0x18)?;
    if log > 6 {
        return None;
    }
    let block = 1024u64 << log;
    let low = u64::from(u32_at(0x04)?);
    let high = if u32_at(0x60)? & INCOMPAT_64BIT != 0 {
        u64::from(u32_at(0x150)?)
    } else {
        0
    };
    ((high << 32) | low).checked_mul(block)
}

/// Reads the size the ext4 filesystem on `device` claims. A read error or
/// a superblock that does not parse is an error (the caller refuses to
/// act on a filesystem it cannot read), never a size.
pub(crate) fn size(device: &Path) -> Result<u64, String> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(device).map_err(|e| format!("it cannot be opened: {e}"))?;
    let mut sb = [0u8; READ];
    file.read_exact_at(&mut sb, SUPERBLOCK)
        .map_err(|e| format!("reading its ext4 superblock failed: {e}"))?;
    size_from_superblock(&sb).ok_or_else(|| "its ext4 superblock does not parse".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock(blocks: u64, log_block: u32, bit64: bool, magic: u16) -> Vec<u8> {
        let mut sb = vec![0u8; READ];
        sb[0x04..0x08].copy_from_slice(&(blocks as u32).to_le_bytes());
        sb[0x18..0x1c].copy_from_slice(&log_block.to_le_bytes());
        sb[0x38..0x3a].copy_from_slice(&magic.to_le_bytes());
        if bit64 {
            sb[0x60..0x64].copy_from_slice(&INCOMPAT_64BIT.to_le_bytes());
            sb[0x150..0x154].copy_from_slice(&((blocks >> 32) as u32).to_le_bytes());
        }
        sb
    }

    #[test]
    fn the_size_is_the_block_count_times_the_block_size() {
        // (blocks, log block size, 64bit, magic, size)
        let cases = [
            (16384, 2, true, MAGIC, Some(64 << 20)),
            (65536, 0, false, MAGIC, Some(64 << 20)),
            // The high half counts only with the 64bit feature.
            (
                (1u64 << 32) + 1,
                2,
                true,
                MAGIC,
                Some(((1u64 << 32) + 1) * 4096),
            ),
            ((1u64 << 32) + 1, 2, false, MAGIC, Some(4096)),
            (16384, 2, true, 0x1234, None),
            (16384, 7, true, MAGIC, None),
        ];
        for (blocks, log, bit64, magic, want) in cases {
            assert_eq!(
                size_from_superblock(&superblock(blocks, log, bit64, magic)),
                want,
                "{blocks} blocks, log {log}, 64bit {bit64}, magic {magic:#x}"
            );
        }
        assert_eq!(size_from_superblock(&[0u8; 16]), None, "too short");
    }
}
