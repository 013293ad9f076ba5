//! Restoring a backup's stream past damage, as one wants from a damaged
//! repository: every intact byte is written at its own offset, each
//! damaged range as zeros (so what follows stays where it belongs: a disk
//! image still has its file systems at their offsets) and named with its
//! offset, length and why. The strict `Repository::restore` stops at the
//! first damage instead.

use std::io::Write;

use crate::error::repo::RepoResult;
use crate::repo::Repository;
use crate::restore::{writing, Piece};

/// What a restore past damage wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Salvage {
    /// Bytes written: the stream's length, damaged ranges included.
    pub bytes: u64,
    /// The ranges that could not be restored (written as zeros), in
    /// stream order.
    pub damaged: Vec<DamagedRange>,
}

/// A range of a stream or a file that could not be restored, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DamagedRange {
    pub offset: u64,
    pub len: u64,
    pub error: String,
}

/// Zeros to write in place of damaged bytes.
pub(crate) static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

impl Repository {
    /// Write backup `name`'s stream to `out`, going on past damage: a
    /// damaged range is written as zeros and listed. A backup object or
    /// recipe object that cannot be read is still refused (nothing of the
    /// stream can then be found), as is an error writing `out`.
    pub fn restore_salvage(&self, name: &str, mut out: impl Write) -> RepoResult<Salvage> {
        let (_, parts) = self.recipe_parts(name)?;
        let mut s = Salvage::default();
        self.restore_pieces(name, parts, None, &mut |piece| {
            let len = match piece {
                Piece::Data(data) => {
                    out.write_all(data).map_err(|e| writing(name, e))?;
                    data.len() as u64
                }
                Piece::Damaged(len, e) => {
                    write_zeros(&mut out, len).map_err(|e| writing(name, e))?;
                    note(&mut s.damaged, s.bytes, len, e.to_string());
                    len
                }
                // Nothing is skipped when every byte is wanted.
                Piece::Skipped(_) => 0,
            };
            s.bytes += len;
            Ok(())
        })?;
        out.flush().map_err(|e| writing(name, e))?;
        Ok(s)
    }
}

/// Write `len` zeros, in place of damaged bytes, to `out`.
pub(crate) fn write_zeros(out: &mut impl Write, len: u64) -> std::io::Result<()> {
    let mut left = len;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Add `len` damaged bytes at `offset` to `list`, as one range with the
/// last when they follow it for the same reason (the segments of one
/// damaged frame).
pub(crate) fn note(list: &mut Vec<DamagedRange>, offset: u64, len: u64, error: String) {
    match list.last_mut() {
        Some(last) if last.offset + last.len == offset && last.error == error => last.len += len,
        _ => list.push(DamagedRange { offset, len, error }),
    }
}
