//! Changed-block tracking (issue 39): which regions of the LBN map
//! changed since a *mark*, so the next backup by fingerprint of a stopped
//! device walks only those. ZFS sends the blocks born after a snapshot's
//! transaction group; here a region of 1,024 chunks (4 MiB of 4 KiB
//! chunks; 480 KiB of bits at 15 TiB) is flagged when any LBN in it is
//! mapped or unmapped, and a backup records the mark it started the
//! tracking from.
//!
//! The tracking is a hint, never needed for correctness: whenever it
//! cannot be trusted it is *untracked*, and the next backup walks
//! everything. It lives in RAM while the device runs and is saved to the
//! file `changes` in the device's directory only at a clean stop, bound to
//! the superblock generation that stop wrote (and to the device's UUID
//! and logical size). At open it is taken back only if the superblock is
//! that generation and marked clean, so:
//! - a crash (the superblock says open, and a writable open moved the
//!   generation), an inram roll-back, a thin replay: untracked;
//! - a metadata copy put back (an older generation), a repair (it writes
//!   the superblock, and forgets the tracking), a grow (another logical
//!   size, or, growing only the data space, a superblock written again):
//!   untracked;
//! - a damaged or missing file: untracked.
//!
//! A writable open deletes the file once read, so no later state of the
//! device can be paired with it by mistake.

use std::io::Write;
use std::path::Path;

use tracing::{debug, warn};

use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::config::Lbn;
use crate::error::{Error, Result};

/// log2 of the chunks in a region.
pub const REGION_SHIFT: u32 = 10;
/// The file's name in a device directory.
pub const CHANGES_NAME: &str = "changes";
const MAGIC: &[u8; 8] = b"DDUPCHG1";
/// Magic, UUID, generation, logical size, region shift, mark, word count.
const HEADER_LEN: usize = 8 + 16 + 8 + 8 + 4 + 8 + 8;

/// The regions changed since a mark, in RAM.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChangeMap {
    /// What the bits are relative to; `None`: untracked.
    mark: Option<u64>,
    bits: Vec<u64>,
}

/// What a device says changed since its mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changes {
    pub mark: u64,
    bits: Vec<u64>,
}

impl Changes {
    /// Chunks in a region.
    pub const REGION_CHUNKS: u64 = 1 << REGION_SHIFT;

    /// Whether any chunk of `first..first + count` may have changed since
    /// the mark (a region past the map counts as changed).
    pub fn changed(&self, first: Lbn, count: u64) -> bool {
        if count == 0 {
            return false;
        }
        let last = first.saturating_add(count - 1);
        (first >> REGION_SHIFT..=last >> REGION_SHIFT).any(|r| bit(&self.bits, r).unwrap_or(true))
    }

    /// Regions flagged.
    pub fn regions_changed(&self) -> u64 {
        count_ones(&self.bits)
    }

    /// The flags, 64 regions to a word (to send them over a socket).
    pub fn words(&self) -> &[u64] {
        &self.bits
    }

    /// What `words` gave, back (a region past them counts as changed).
    pub fn from_words(mark: u64, bits: Vec<u64>) -> Changes {
        Changes { mark, bits }
    }
}

fn count_ones(bits: &[u64]) -> u64 {
    bits.iter().map(|w| u64::from(w.count_ones())).sum()
}

fn bit(bits: &[u64], region: u64) -> Option<bool> {
    let w = bits.get((region / 64) as usize)?;
    Some(w & (1 << (region % 64)) != 0)
}

fn words_for(logical_chunks: u64) -> usize {
    logical_chunks.div_ceil(1 << REGION_SHIFT).div_ceil(64) as usize
}

impl ChangeMap {
    /// Note that `lbn`'s mapping changed.
    pub fn note(&mut self, lbn: Lbn) {
        if self.mark.is_none() {
            return;
        }
        let r = lbn >> REGION_SHIFT;
        if let Some(w) = self.bits.get_mut((r / 64) as usize) {
            *w |= 1 << (r % 64);
        }
    }

    /// Stop tracking: the next backup walks everything.
    pub fn forget(&mut self) {
        self.mark = None;
        self.bits = Vec::new();
    }

    /// Track anew from `mark`, nothing changed yet.
    pub fn start(&mut self, mark: u64, logical_chunks: u64) {
        self.mark = Some(mark);
        self.bits = vec![0; words_for(logical_chunks)];
    }

    /// Go on from `mark` with the flags as they are: a snapshot's
    /// tracking, started when it froze the map, once its backup names it.
    pub fn remark(&mut self, mark: u64) {
        self.mark = Some(mark);
    }

    /// The mark and the regions flagged since, if tracked, without a copy
    /// of the bits (for `stats`, under the metadata mutex).
    pub fn figures(&self) -> Option<(u64, u64)> {
        Some((self.mark?, count_ones(&self.bits)))
    }

    /// What changed since the mark, if tracked.
    pub fn changes(&self) -> Option<Changes> {
        Some(Changes {
            mark: self.mark?,
            bits: self.bits.clone(),
        })
    }
}

/// Who the tracking belongs to: the device, and the superblock generation
/// and size it describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    pub uuid: [u8; 16],
    pub generation: u64,
    pub logical_size: u64,
}

fn encode(owner: Owner, map: &ChangeMap, mark: u64) -> Vec<u8> {
    let mut e = Encoder::with_capacity(HEADER_LEN + map.bits.len() * 8 + 4);
    e.bytes(MAGIC)
        .bytes(&owner.uuid)
        .u64(owner.generation)
        .u64(owner.logical_size)
        .u32(REGION_SHIFT)
        .u64(mark)
        .u64(map.bits.len() as u64);
    for w in &map.bits {
        e.u64(*w);
    }
    e.pad_to(HEADER_LEN + map.bits.len() * 8 + 4);
    let mut out = e.buf;
    seal(&mut out);
    out
}

fn decode(bytes: &[u8], owner: Owner) -> Result<ChangeMap> {
    const S: &str = "the changed-block tracking file";
    if !is_sealed(bytes) {
        return Err(Error::corrupt(S, "its checksum does not match"));
    }
    let mut d = Decoder::new(&bytes[..bytes.len() - 4], S);
    if d.bytes(8)? != MAGIC {
        return Err(Error::corrupt(S, "its magic is not DDUPCHG1"));
    }
    let found = Owner {
        uuid: d.array()?,
        generation: d.u64()?,
        logical_size: d.u64()?,
    };
    if found != owner {
        return Err(Error::corrupt(
            S,
            format!("it describes {found:?}, the device is {owner:?}"),
        ));
    }
    if d.u32()? != REGION_SHIFT {
        return Err(Error::corrupt(S, "another region size"));
    }
    let mark = d.u64()?;
    let words = d.u64()?;
    if Some(bytes.len() as u64)
        != words
            .checked_mul(8)
            .and_then(|w| w.checked_add(HEADER_LEN as u64 + 4))
    {
        return Err(Error::corrupt(
            S,
            format!("{} bytes for {words} words of bits", bytes.len()),
        ));
    }
    let mut bits = Vec::with_capacity(words.min(1 << 20) as usize);
    for _ in 0..words {
        bits.push(d.u64()?);
    }
    Ok(ChangeMap {
        mark: Some(mark),
        bits,
    })
}

/// The tracking saved for `owner` at `path`, if it is there and belongs
/// to exactly that device state; untracked otherwise (said in the log).
pub(crate) fn load(path: &Path, owner: Owner, logical_chunks: u64) -> ChangeMap {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return ChangeMap::default(),
        Err(e) => {
            warn!(
                "{}: {e}; the next backup by fingerprint walks every block",
                path.display()
            );
            return ChangeMap::default();
        }
    };
    match decode(&bytes, owner) {
        Ok(map) if map.bits.len() == words_for(logical_chunks) => map,
        Ok(map) => {
            debug!(
                "{}: {} words of bits for {logical_chunks} chunks; untracked",
                path.display(),
                map.bits.len()
            );
            ChangeMap::default()
        }
        Err(e) => {
            debug!("{}: {e}; untracked", path.display());
            ChangeMap::default()
        }
    }
}

/// Save `map` for `owner` at `path` (a new file renamed into place, owner
/// only), or remove the file when untracked.
pub(crate) fn save(path: &Path, owner: Owner, map: &ChangeMap) -> Result<()> {
    let Some(mark) = map.mark else {
        return remove(path);
    };
    let io = |e| Error::io(format!("saving {}", path.display()), e);
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut f = dedup_common::perms::file_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(&encode(owner, map, mark))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Remove the file, if it is there.
pub(crate) fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", path.display()), e))
        }
        _ => Ok(()),
    }
}
