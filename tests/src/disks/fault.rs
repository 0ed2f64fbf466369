//! The faults a lab disk can be given, and which I/O each one hits.

use std::ops::Range;

/// One fault of one disk, until healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Reads touching this byte range fail with EIO (a medium error).
    ReadError(Range<u64>),
    /// Writes touching this byte range fail with EIO.
    WriteError(Range<u64>),
    /// Every I/O waits until the disk is healed (a path in transition:
    /// ALUA state change, a controller failover).
    Stall,
    /// Every I/O fails with EIO (the LUN was unmapped from this host).
    Unmapped,
    /// The disk reports this size (0: a path in transition; the old size
    /// after the array grew the LUN: a rescan that did not take), picked
    /// up at the next rescan. I/O is not affected.
    Size(u64),
}

/// What an I/O is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// A read.
    Read,
    /// A write.
    Write,
}

/// What happens to one I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It reaches the data unchanged.
    Pass,
    /// It fails with EIO.
    Fail,
    /// It waits for a heal, then is judged again.
    Wait,
}

/// The verdict of `faults` on an I/O of `len` bytes at `offset`: a stall
/// wins over an error (nothing is answered during a stall), an error over
/// a pass.
pub fn judge(faults: &[Fault], io: Io, offset: u64, len: u64) -> Verdict {
    let touched = offset..offset.saturating_add(len.max(1));
    let overlaps = |r: &Range<u64>| r.start < touched.end && touched.start < r.end;
    let mut verdict = Verdict::Pass;
    for f in faults {
        let hit = match (f, io) {
            (Fault::Stall, _) => return Verdict::Wait,
            (Fault::Unmapped, _) => true,
            (Fault::ReadError(r), Io::Read) | (Fault::WriteError(r), Io::Write) => overlaps(r),
            (Fault::ReadError(_), Io::Write)
            | (Fault::WriteError(_), Io::Read)
            | (Fault::Size(_), _) => false,
        };
        if hit {
            verdict = Verdict::Fail;
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_hits_what_it_names() {
        use Fault::*;
        use Io::*;
        use Verdict::*;
        let cases: &[(&[Fault], Io, u64, u64, Verdict)] = &[
            (&[], Read, 0, 4096, Pass),
            (&[ReadError(0..1 << 20)], Read, 4096, 4096, Fail),
            (&[ReadError(0..1 << 20)], Write, 4096, 4096, Pass),
            (&[ReadError(0..1 << 20)], Read, 1 << 20, 4096, Pass),
            (&[ReadError(4096..8192)], Read, 0, 4097, Fail),
            (&[ReadError(4096..8192)], Read, 0, 4096, Pass),
            (&[WriteError(0..10)], Write, 5, 1, Fail),
            (&[WriteError(0..10)], Read, 5, 1, Pass),
            (&[Unmapped], Read, 123, 1, Fail),
            (&[Unmapped, Stall], Write, 123, 1, Wait),
            (&[Stall], Read, 0, 0, Wait),
            (&[Size(0)], Read, 0, 4096, Pass),
            (&[Size(0), WriteError(0..10)], Write, 0, 4096, Fail),
        ];
        for (faults, io, offset, len, want) in cases {
            assert_eq!(
                judge(faults, *io, *offset, *len),
                *want,
                "{faults:?} {io:?} at {offset}+{len}"
            );
        }
    }
}
