//! Changed-block tracking (issue 39): which regions of the LBN map
//! changed since a *mark*, so the next backup by fingerprint of a stopped
//! device walks only those. ZFS sends the blocks born after a snapshot's
//! transaction group; here a region of 64 chunks (256 KiB of 4 KiB
//! chunks) is flagged when any LBN in it is mapped or unmapped, and a
//! backup records the mark it started the tracking from.
//!
//! Regions are small because a backup walks a flagged region whole, and
//! walking a block costs a read of its chunk record (its fingerprint),
//! most of it cold: on an 8 GiB ext4 image with 1 % of its files
//! rewritten, regions of 1,024 chunks walked 118,784 blocks, regions of 64
//! walk 32,896 (9,934 changed). The flags are paged, 4,096 regions
//! (1 GiB of 4 KiB chunks) to a page of 512 bytes, a page made when a
//! region on it is first flagged: the tracking's RAM follows the data
//! written since the mark (8 bytes a GiB of device, 512 more a GiB
//! written), never the device's size alone.
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
//! - a damaged or missing file, or one an older build wrote (another
//!   format): untracked.
//!
//! A writable open deletes the file once read, so no later state of the
//! device can be paired with it by mistake.

use std::io::Write;
use std::path::Path;

use tracing::{debug, warn};

use crate::codec::{is_sealed, seal, Decoder, Encoder};
use crate::config::Lbn;
use crate::error::{Error, Result};

pub use crate::change_flags::REGION_SHIFT;
use crate::change_flags::{pages_for, Flags, PAGE_BYTES};

/// The file's name in a device directory.
pub const CHANGES_NAME: &str = "changes";
/// Version 2: regions of 64 chunks, paged (version 1 kept a bit per 1,024
/// chunks for the whole device; its files are refused, and untracked).
const MAGIC: &[u8; 8] = b"DDUPCHG2";
/// Magic, UUID, generation, logical size, region shift, mark, page count.
const HEADER_LEN: usize = 8 + 16 + 8 + 8 + 4 + 8 + 8;

/// The regions changed since a mark, in RAM.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChangeMap {
    /// What the flags are relative to; `None`: untracked.
    mark: Option<u64>,
    flags: Flags,
}

/// What a device says changed since its mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changes {
    pub mark: u64,
    flags: Flags,
}

impl Changes {
    /// Chunks in a region.
    pub const REGION_CHUNKS: u64 = 1 << REGION_SHIFT;
    /// The flags' format on the snapshot socket (`page_bytes`): 2, as the
    /// tracking file's `DDUPCHG2`.
    pub const FORMAT: u32 = 2;

    /// Whether any chunk of `first..first + count` may have changed since
    /// the mark (a region past the map counts as changed).
    pub fn changed(&self, first: Lbn, count: u64) -> bool {
        if count == 0 {
            return false;
        }
        let last = first.saturating_add(count - 1);
        self.flags.any(first >> REGION_SHIFT, last >> REGION_SHIFT)
    }

    /// Regions flagged.
    pub fn regions_changed(&self) -> u64 {
        self.flags.count()
    }

    /// The flags as bytes, to send them over a socket: each page made,
    /// as its index and words (`PAGE_BYTES` a page).
    pub fn page_bytes(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(self.flags.pages_made() as usize * PAGE_BYTES);
        self.flags.page_bytes(&mut e);
        e.buf
    }

    /// What `page_bytes` gave, back, for a device of `logical_chunks`;
    /// why not, if the bytes are not pages of such a device.
    pub fn from_page_bytes(
        mark: u64,
        bytes: &[u8],
        logical_chunks: u64,
    ) -> std::result::Result<Changes, String> {
        Ok(Changes {
            mark,
            flags: Flags::from_page_bytes(bytes, logical_chunks)?,
        })
    }

    /// The most bytes `page_bytes` gives for a device of `logical_chunks`.
    pub fn most_bytes(logical_chunks: u64) -> u64 {
        pages_for(logical_chunks).saturating_mul(PAGE_BYTES as u64)
    }
}

impl ChangeMap {
    /// Note that `lbn`'s mapping changed.
    pub fn note(&mut self, lbn: Lbn) {
        if self.mark.is_none() {
            return;
        }
        self.flags.set(lbn >> REGION_SHIFT);
    }

    /// Stop tracking: the next backup walks everything.
    pub fn forget(&mut self) {
        self.mark = None;
        self.flags = Flags::default();
    }

    /// Track anew from `mark`, nothing changed yet.
    pub fn start(&mut self, mark: u64, logical_chunks: u64) {
        self.mark = Some(mark);
        self.flags = Flags::for_chunks(logical_chunks);
    }

    /// Go on from `mark` with the flags as they are: a snapshot's
    /// tracking, started when it froze the map, once its backup names it.
    pub fn remark(&mut self, mark: u64) {
        self.mark = Some(mark);
    }

    /// The mark and the regions flagged since, if tracked (for `stats`,
    /// under the metadata mutex).
    pub fn figures(&self) -> Option<(u64, u64)> {
        Some((self.mark?, self.flags.count()))
    }

    /// What changed since the mark, if tracked.
    pub fn changes(&self) -> Option<Changes> {
        Some(Changes {
            mark: self.mark?,
            flags: self.flags.clone(),
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
    let pages = map.flags.pages_made();
    let len = HEADER_LEN + pages as usize * PAGE_BYTES + 4;
    let mut e = Encoder::with_capacity(len);
    e.bytes(MAGIC)
        .bytes(&owner.uuid)
        .u64(owner.generation)
        .u64(owner.logical_size)
        .u32(REGION_SHIFT)
        .u64(mark)
        .u64(pages);
    map.flags.page_bytes(&mut e);
    e.pad_to(len);
    let mut out = e.buf;
    seal(&mut out);
    out
}

fn decode(bytes: &[u8], owner: Owner, logical_chunks: u64) -> Result<ChangeMap> {
    const S: &str = "the changed-block tracking file";
    if !is_sealed(bytes) {
        return Err(Error::corrupt(S, "its checksum does not match"));
    }
    let mut d = Decoder::new(&bytes[..bytes.len() - 4], S);
    if d.bytes(8)? != MAGIC {
        return Err(Error::corrupt(
            S,
            "its magic is not DDUPCHG2 (an older build's file, or not one)",
        ));
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
    let pages = d.u64()?;
    if Some(bytes.len() as u64)
        != pages
            .checked_mul(PAGE_BYTES as u64)
            .and_then(|p| p.checked_add(HEADER_LEN as u64 + 4))
    {
        return Err(Error::corrupt(
            S,
            format!("{} bytes for {pages} pages of flags", bytes.len()),
        ));
    }
    let body = &bytes[HEADER_LEN..bytes.len() - 4];
    let flags =
        Flags::from_page_bytes(body, logical_chunks).map_err(|why| Error::corrupt(S, why))?;
    Ok(ChangeMap {
        mark: Some(mark),
        flags,
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
    match decode(&bytes, owner, logical_chunks) {
        Ok(map) => map,
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
