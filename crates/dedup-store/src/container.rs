//! Reading containers: the whole of one (`Container`), or only its catalog
//! (`Catalog`, two ranged reads: the trailer, then catalog and trailer),
//! which is what the paper's catalog prefetch needs (§3.2: a hit on a
//! sampled fingerprint loads its container's catalog into the cache).
//!
//! Every check names the container and what is wrong; nothing panics,
//! whatever the bytes.

use dedup_common::compress::Compression;

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::catalog_bytes;
use crate::format::{
    crc, entry_len, Entry, Header, Location, Trailer, FORMAT_VERSION, HEADER_LEN, MAX_FRAME_LEN,
    MAX_SEGMENT_LEN, OLDEST_VERSION, TRAILER_LEN,
};
use crate::objects::ObjectStore;
use crate::read_windows::Windows;
use crate::segment_hash::SegmentHash;

/// The object name of container `id`.
pub fn container_name(id: u64) -> String {
    format!("containers/{id:016x}")
}

/// Where a compacted version of container `id` waits while its
/// `containers/` object is replaced (see `gc/compact.rs`).
pub fn compacted_name(id: u64) -> String {
    format!("{COMPACTED_PREFIX}{id:016x}")
}

pub const COMPACTED_PREFIX: &str = "compacted/";

/// Run `read` on container `id`'s object, or, if there is none, on its
/// compacted version (a compaction that is replacing it).
fn with_fallback<T>(id: u64, mut read: impl FnMut(&str) -> Result<T>) -> Result<T> {
    match read(&container_name(id)) {
        Err(Error::NotFound { .. }) => match read(&compacted_name(id)) {
            Err(Error::NotFound { .. }) => Err(Error::NotFound {
                name: container_name(id),
            }),
            other => other,
        },
        other => other,
    }
}

/// Bytes read from a container's end to find its catalog in a store where
/// requests are dear: the trailer and the catalog before it in one request
/// when the catalog is at most this less the trailer (a full 16 MiB container of 4 KiB segments has a
/// catalog of some 150 KiB, compressed). Past it, a second read.
const CATALOG_READ: u64 = 256 << 10;

/// A container's catalog: each segment's fingerprint and location.
#[derive(Clone, Debug)]
pub struct Catalog {
    name: String,
    container_id: u64,
    /// The format version it was read in (entry sizes differ).
    version: u32,
    /// The catalog's stored bytes.
    catalog_len: u64,
    entries: Vec<Entry>,
}

impl Catalog {
    /// Read container `id`'s catalog without reading its segments.
    pub fn read(store: &dyn ObjectStore, id: u64) -> Result<Catalog> {
        with_fallback(id, |name| Catalog::read_object(store, id, name))
    }

    fn read_object(store: &dyn ObjectStore, id: u64, name: &str) -> Result<Catalog> {
        let name = name.to_string();
        let corrupt = |detail: String| Error::corrupt(&name, detail);
        // Where a request is dear (`read_granule`), one read of the
        // object's last bytes holds the trailer and, most often, the whole
        // catalog before it; only a larger catalog costs a second, ranged
        // read. A directory reads the trailer, then exactly the catalog.
        let guess = match store.read_granule() {
            0 => TRAILER_LEN as u64,
            _ => CATALOG_READ,
        };
        let (tail, size) = store.get_tail_sized(&name, guess)?;
        let short = || {
            corrupt(format!(
                "it is {size} bytes, shorter than a {TRAILER_LEN}-byte trailer"
            ))
        };
        let at = tail.len().checked_sub(TRAILER_LEN).ok_or_else(short)?;
        let trailer_bytes: &[u8; TRAILER_LEN] = tail[at..].try_into().map_err(|_| short())?;
        let trailer = decode_trailer(&name, trailer_bytes)?;
        let catalog_len = checked_catalog_len(&name, &trailer)?;
        // The catalog ends where the trailer begins, which ends the object.
        let catalog_end = trailer.catalog_offset.checked_add(catalog_len);
        if catalog_end.and_then(|e| e.checked_add(TRAILER_LEN as u64)) != Some(size) {
            return Err(corrupt(if trailer.catalog_offset >= size {
                format!(
                    "the trailer puts a {catalog_len}-byte catalog at offset {}, past the end of the {size}-byte object",
                    trailer.catalog_offset
                )
            } else {
                format!(
                    "the catalog offset {} and length {catalog_len} do not end at the trailer of the {size}-byte object",
                    trailer.catalog_offset
                )
            }));
        }
        let catalog = match at.checked_sub(catalog_len as usize) {
            Some(start) => Catalog::parse(&name, &trailer, &tail[start..at])?,
            None => {
                let bytes = store.get_range(&name, trailer.catalog_offset, catalog_len)?;
                Catalog::parse(&name, &trailer, &bytes)?
            }
        };
        catalog.check_id(id)?;
        Ok(catalog)
    }

    /// Decode and check the catalog bytes the trailer describes.
    fn parse(name: &str, trailer: &Trailer, bytes: &[u8]) -> Result<Catalog> {
        let corrupt = |detail: String| Error::corrupt(name, detail);
        let sum = crc(bytes);
        if sum != trailer.catalog_crc {
            return Err(corrupt(format!(
                "catalog checksum {:#010x} does not match its bytes ({sum:#010x})",
                trailer.catalog_crc
            )));
        }
        // Frames lie back to back from the header to the catalog, in
        // catalog order, and each frame's segments back to back in its
        // decompressed bytes: no gaps, no overlaps, nothing outside.
        let mut next = HEADER_LEN as u64;
        let mut open: Option<Location> = None;
        let mut filled = 0u64;
        let len = entry_len(trailer.version);
        let rows = catalog_bytes::unpack(trailer.version, trailer.segment_count, bytes)
            .map_err(corrupt)?;
        let mut entries = Vec::with_capacity(trailer.segment_count as usize);
        for (i, raw) in rows.chunks_exact(len).enumerate() {
            let entry = Entry::decode(raw, trailer.version)
                .map_err(|e| corrupt(format!("segment {i}: {e}")))?;
            let l = &entry.location;
            if l.raw_len as usize > MAX_SEGMENT_LEN {
                return Err(corrupt(format!(
                    "segment {i} is {} bytes raw, over the {MAX_SEGMENT_LEN}-byte limit",
                    l.raw_len
                )));
            }
            let continues = !entry.is_absent() && open.is_some_and(|f| f.same_frame(l));
            if continues {
                if u64::from(l.frame_at) != filled {
                    return Err(corrupt(format!(
                        "segment {i} is at {} in its frame, not {filled} where the one before it ends",
                        l.frame_at
                    )));
                }
            } else {
                check_frame_full(i, open, filled).map_err(corrupt)?;
                if l.offset != next {
                    return Err(corrupt(format!(
                        "segment {i}'s frame is at offset {}, not {next} where the one before it ends",
                        l.offset
                    )));
                }
                check_frame_sizes(i, &entry).map_err(corrupt)?;
                next += u64::from(l.stored_len); // both < 2^33: no overflow
                if next > trailer.catalog_offset {
                    return Err(corrupt(format!(
                        "segment {i}'s frame ends at {next}, past the catalog at {}",
                        trailer.catalog_offset
                    )));
                }
                open = (!entry.is_absent()).then_some(*l);
                filled = 0;
            }
            if !entry.is_absent() {
                filled += u64::from(l.raw_len);
                if filled > u64::from(l.frame_len) {
                    return Err(corrupt(format!(
                        "segment {i} ends at {filled} in its {}-byte frame",
                        l.frame_len
                    )));
                }
            }
            entries.push(entry);
        }
        check_frame_full(entries.len(), open, filled).map_err(corrupt)?;
        if next != trailer.catalog_offset {
            return Err(corrupt(format!(
                "the frames end at {next}, not at the catalog at {}",
                trailer.catalog_offset
            )));
        }
        Ok(Catalog {
            name: name.to_string(),
            container_id: trailer.container_id,
            version: trailer.version,
            catalog_len: trailer.catalog_len,
            entries,
        })
    }

    fn check_id(&self, id: u64) -> Result<()> {
        if self.container_id != id {
            return Err(Error::corrupt(
                &self.name,
                format!("it holds container id {:#x}", self.container_id),
            ));
        }
        Ok(())
    }

    pub fn container_id(&self) -> u64 {
        self.container_id
    }

    /// The size of the container object in bytes, which `read` has found
    /// to be exactly the header, the segments, the catalog and the trailer.
    pub fn container_len(&self) -> u64 {
        let stored: u64 = self
            .frame_starts()
            .map(|i| u64::from(self.entries[i].location.stored_len))
            .sum();
        (HEADER_LEN + TRAILER_LEN) as u64 + self.catalog_len + stored
    }

    /// The segments in container order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entries that start a frame (absent ones excluded).
    fn frame_starts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.entries.len()).filter(|&i| {
            let e = &self.entries[i];
            !e.is_absent() && e.location.frame_at == 0 && !self.continues_frame(i)
        })
    }

    /// Entry `i` lies in the frame of entry `i - 1`.
    fn continues_frame(&self, i: usize) -> bool {
        i > 0 && {
            let (a, b) = (&self.entries[i - 1], &self.entries[i]);
            !a.is_absent() && !b.is_absent() && a.location.same_frame(&b.location)
        }
    }

    /// `len` bytes at `offset` of the object this catalog was read from. A
    /// catalog read from `compacted/<id>`, while a compaction replaced
    /// `containers/<id>`, outlives that object: the compaction deletes it
    /// once `containers/<id>` holds the same bytes again, so a read that
    /// finds it gone reads those (a restore beside a collection failed on
    /// this, about once in fifty runs of `gc_concurrent`).
    fn get_range(&self, store: &dyn ObjectStore, offset: u64, len: u64) -> Result<Vec<u8>> {
        match store.get_range(&self.name, offset, len) {
            Err(Error::NotFound { .. }) if self.name.starts_with(COMPACTED_PREFIX) => {
                store.get_range(&container_name(self.container_id), offset, len)
            }
            other => other,
        }
    }

    /// Read segment `i` alone: one ranged read of its frame, checked and
    /// decompressed.
    pub fn read_segment(&self, store: &dyn ObjectStore, i: usize) -> Result<Vec<u8>> {
        let entry = self.entry(i)?;
        self.check_present(i, entry)?;
        let l = &entry.location;
        let stored = self.get_range(store, l.offset, u64::from(l.stored_len))?;
        let frame = decode_frame(i, l, &stored).map_err(|d| Error::corrupt(&self.name, d))?;
        segment_of(store.segment_hash(), &self.name, i, entry, &frame)
    }

    /// Read segments `first..first + count` with one ranged read of their
    /// frames (a container writes them back to back), each frame checked
    /// and decompressed once. Each segment is an `Ok` or `Err` of its own,
    /// so a damaged frame does not cost the segments before it.
    pub fn read_run(
        &self,
        store: &dyn ObjectStore,
        first: usize,
        count: usize,
    ) -> Result<Vec<Result<Vec<u8>>>> {
        self.read_run_cached(store, first, count, &FrameCache::new(0))
    }

    /// `read_run`, taking frames from `cache` when it has them and leaving
    /// the ones it decompressed there: a restore whose runs break inside a
    /// frame (a duplicate segment stored elsewhere in between) then
    /// decompresses the frame once, not once per run.
    pub fn read_run_cached(
        &self,
        store: &dyn ObjectStore,
        first: usize,
        count: usize,
        cache: &FrameCache,
    ) -> Result<Vec<Result<Vec<u8>>>> {
        let end = first.saturating_add(count);
        self.entry(end.saturating_sub(1).max(first))?;
        let run = &self.entries[first..end];
        let key = |l: &Location| FrameKey {
            container: self.container_id,
            offset: l.offset,
            stored_len: l.stored_len,
            stored_crc: l.stored_crc,
        };
        // The frames the cache has, taken now (other threads may evict
        // them meanwhile); one ranged read from the first it lacks to the
        // last.
        let mut hits: Vec<(u64, Arc<Vec<u8>>)> = Vec::new();
        let mut missing: Vec<&Location> = Vec::new();
        for l in run.iter().filter(|e| !e.is_absent()).map(|e| &e.location) {
            let seen = |at: u64| hits.iter().any(|(o, _)| *o == at);
            if seen(l.offset) || missing.last().is_some_and(|m| m.offset == l.offset) {
                continue;
            }
            match cache.get(&key(l)) {
                Some(f) => hits.push((l.offset, f)),
                None => missing.push(l),
            }
        }
        let (start, bytes) = match (missing.first(), missing.last()) {
            (Some(a), Some(b)) => {
                let len = b.frame_end() - a.offset;
                let exact = || self.get_range(store, a.offset, len);
                (
                    a.offset,
                    cache
                        .windows
                        .read(store, &self.name, a.offset, len, exact)?,
                )
            }
            _ => (0, Vec::new()),
        };
        let mut frame: Option<(u64, Decoded)> = None;
        let hash = store.segment_hash();
        Ok(run
            .iter()
            .enumerate()
            .map(|(k, e)| {
                let i = first + k;
                self.check_present(i, e)?;
                let l = &e.location;
                if frame.as_ref().is_some_and(|(at, _)| *at != l.offset) {
                    frame = None;
                }
                let (_, raw) = frame.get_or_insert_with(|| {
                    if let Some((_, f)) = hits.iter().find(|(o, _)| *o == l.offset) {
                        return (l.offset, Ok(Arc::clone(f)));
                    }
                    let at = l.offset.saturating_sub(start) as usize;
                    let decoded = bytes
                        .get(at..at + l.stored_len as usize)
                        .ok_or_else(|| format!("segment {i}'s frame was not read"))
                        .and_then(|stored| decode_frame(i, l, stored))
                        .map(Arc::new);
                    if let Ok(f) = &decoded {
                        cache.put(key(l), Arc::clone(f));
                    }
                    (l.offset, decoded)
                });
                match raw {
                    Ok(raw) => segment_of(hash, &self.name, i, e, raw),
                    Err(d) => Err(Error::corrupt(&self.name, d.clone())),
                }
            })
            .collect())
    }

    /// Read the container's header (one ranged read) and check that it
    /// agrees with this catalog, which `read` does not look at: with it,
    /// every byte but the segment bodies has been checked.
    pub fn check_header(&self, store: &dyn ObjectStore) -> Result<()> {
        let bytes = self.get_range(store, 0, HEADER_LEN as u64)?;
        let bytes: &[u8; HEADER_LEN] = bytes.as_slice().try_into().map_err(|_| {
            Error::corrupt(&self.name, format!("its header is not {HEADER_LEN} bytes"))
        })?;
        let header = decode_header(&self.name, bytes)?;
        let count = self.entries.len() as u64;
        if header.version != self.version {
            return Err(Error::corrupt(
                &self.name,
                format!(
                    "the header says format version {}, the trailer {}",
                    header.version, self.version
                ),
            ));
        }
        if (header.container_id, u64::from(header.segment_count)) != (self.container_id, count) {
            return Err(Error::corrupt(
                &self.name,
                format!(
                    "the header says container {:#x} with {} segments, the trailer {:#x} with {count}",
                    header.container_id, header.segment_count, self.container_id
                ),
            ));
        }
        Ok(())
    }

    fn check_present(&self, i: usize, entry: &Entry) -> Result<()> {
        if entry.is_absent() {
            return Err(Error::corrupt(
                &self.name,
                format!("segment {i} was removed by garbage collection, but is asked for"),
            ));
        }
        Ok(())
    }

    /// The object this catalog was read from (the container, or its
    /// compacted version while that replaces it).
    pub fn object_name(&self) -> &str {
        &self.name
    }

    /// What `catalog_spill.rs` keeps beside the id and the entries: the
    /// object name, the format version and the stored catalog's length.
    pub(crate) fn spill_parts(&self) -> (&str, u32, u64) {
        (&self.name, self.version, self.catalog_len)
    }

    /// A catalog kept by `catalog_spill.rs` (which read it from the
    /// repository and checks its own record).
    pub(crate) fn from_spill(
        name: String,
        container_id: u64,
        version: u32,
        catalog_len: u64,
        entries: Vec<Entry>,
    ) -> Catalog {
        Catalog {
            name,
            container_id,
            version,
            catalog_len,
            entries,
        }
    }

    fn entry(&self, i: usize) -> Result<&Entry> {
        self.entries.get(i).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "container {} has {} segments, no segment {i}",
                self.name,
                self.entries.len()
            ))
        })
    }
}

/// A frame decompressed, or why it could not be.
type Decoded = std::result::Result<Arc<Vec<u8>>, String>;

/// Which frame: its container and the frame's own fields (a compaction
/// keeps the id but moves frames; a frame from before it is never taken
/// for one after, and each segment is checked against its fingerprint
/// anyway).
#[derive(Clone, Copy, PartialEq, Eq)]
struct FrameKey {
    container: u64,
    offset: u64,
    stored_len: u32,
    stored_crc: u32,
}

/// The last few frames decompressed, newest last; shared by the threads
/// of one restore.
pub struct FrameCache {
    frames: Mutex<VecDeque<(FrameKey, Arc<Vec<u8>>)>>,
    capacity: usize,
    /// The stored bytes read ahead, where requests are dear.
    windows: Windows,
}

impl FrameCache {
    /// A cache of up to `capacity` frames (0: none kept); every read
    /// exact.
    pub fn new(capacity: usize) -> FrameCache {
        FrameCache::reading_ahead(capacity, 0, 0)
    }

    /// As `new`, and an object read before is read again in windows of
    /// `granule` bytes, up to `windows` of them kept (`read_windows.rs`).
    pub fn reading_ahead(capacity: usize, granule: u64, windows: usize) -> FrameCache {
        FrameCache {
            frames: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
            windows: Windows::new(granule, windows),
        }
    }

    /// Drop what was read ahead (a read is tried again after a
    /// compaction may have rewritten a container under it).
    pub fn forget_read_ahead(&self) {
        self.windows.forget();
    }

    fn frames(&self) -> std::sync::MutexGuard<'_, VecDeque<(FrameKey, Arc<Vec<u8>>)>> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: &FrameKey) -> Option<Arc<Vec<u8>>> {
        let mut frames = self.frames();
        let at = frames.iter().position(|(k, _)| k == key)?;
        let hit = frames.remove(at)?;
        let frame = Arc::clone(&hit.1);
        frames.push_back(hit);
        Some(frame)
    }

    fn put(&self, key: FrameKey, frame: Arc<Vec<u8>>) {
        if self.capacity == 0 {
            return;
        }
        let mut frames = self.frames();
        if frames.len() == self.capacity {
            frames.pop_front();
        }
        frames.push_back((key, frame));
    }
}

/// A whole container in memory, every part checked.
pub struct Container {
    bytes: Vec<u8>,
    catalog: Catalog,
    /// The last frame `segment` decompressed (its offset and bytes): reading
    /// a container's segments in order decompresses each frame once.
    last_frame: Mutex<Option<(u64, Arc<Vec<u8>>)>>,
    /// How `segment` checks a segment: the store's (`read`), plain
    /// BLAKE3 after `parse` unless `hashed_with` says otherwise.
    hash: SegmentHash,
}

impl Container {
    /// Read container `id` whole.
    pub fn read(store: &dyn ObjectStore, id: u64) -> Result<Container> {
        with_fallback(id, |name| {
            let container =
                Container::parse(name, store.get(name)?)?.hashed_with(store.segment_hash());
            container.catalog.check_id(id)?;
            Ok(container)
        })
    }

    /// Read container `id` whole in one request if it is at most `max`
    /// bytes (`None` if it is larger). Only its structure is checked
    /// (`parse_structure`): `segment` checks each body as it reads it, so
    /// one damaged frame costs only its segments.
    pub fn read_upto(store: &dyn ObjectStore, id: u64, max: u64) -> Result<Option<Container>> {
        with_fallback(id, |name| {
            let (bytes, size) = store.get_upto(name, 0, max)?;
            if size > max {
                return Ok(None);
            }
            let container =
                Container::parse_structure(name, bytes)?.hashed_with(store.segment_hash());
            container.catalog.check_id(id)?;
            Ok(Some(container))
        })
    }

    /// Parse a container's bytes; `name` is what errors call it. Checks
    /// every checksum, segment bodies included, so any damage is refused
    /// here rather than found at restore time.
    pub fn parse(name: &str, bytes: Vec<u8>) -> Result<Container> {
        let container = Container::parse_structure(name, bytes)?;
        for i in container.catalog.frame_starts() {
            let l = &container.catalog.entries[i].location;
            let stored = &container.bytes[l.offset as usize..][..l.stored_len as usize];
            check_stored_crc(i, l, stored).map_err(|d| Error::corrupt(name, d))?;
        }
        Ok(container)
    }

    /// Parse a container's bytes checking everything but the segment
    /// bodies: header, trailer, catalog and where each segment lies.
    /// `segment` still checks each body as it reads it, so nothing unchecked
    /// is ever returned; a store check uses this to name every damaged
    /// segment rather than refuse the container at the first.
    pub fn parse_structure(name: &str, bytes: Vec<u8>) -> Result<Container> {
        let corrupt = |detail: String| Error::corrupt(name, detail);
        if bytes.len() < HEADER_LEN + TRAILER_LEN {
            return Err(corrupt(format!(
                "it is {} bytes, shorter than a header and a trailer ({})",
                bytes.len(),
                HEADER_LEN + TRAILER_LEN
            )));
        }
        let header = decode_header(name, bytes[..HEADER_LEN].try_into().expect("HEADER_LEN"))?;
        let tail = &bytes[bytes.len() - TRAILER_LEN..];
        let trailer = decode_trailer(name, tail.try_into().expect("TRAILER_LEN"))?;
        if (header.container_id, header.segment_count)
            != (trailer.container_id, trailer.segment_count)
        {
            return Err(corrupt(format!(
                "the header says container {:#x} with {} segments, the trailer {:#x} with {}",
                header.container_id,
                header.segment_count,
                trailer.container_id,
                trailer.segment_count
            )));
        }
        let catalog_len = checked_catalog_len(name, &trailer)?;
        let expected_len = trailer
            .catalog_offset
            .checked_add(catalog_len + TRAILER_LEN as u64);
        if expected_len != Some(bytes.len() as u64) {
            return Err(corrupt(format!(
                "the trailer puts a {catalog_len}-byte catalog at offset {}, which does not end at the trailer of this {}-byte container",
                trailer.catalog_offset,
                bytes.len()
            )));
        }
        let start = trailer.catalog_offset as usize;
        let catalog = Catalog::parse(name, &trailer, &bytes[start..start + catalog_len as usize])?;
        if header.version != trailer.version {
            return Err(corrupt(format!(
                "the header says format version {}, the trailer {}",
                header.version, trailer.version
            )));
        }
        Ok(Container {
            bytes,
            catalog,
            last_frame: Mutex::new(None),
            hash: SegmentHash::PLAIN,
        })
    }

    /// Check segments with `hash` (that of the store the bytes came from).
    pub fn hashed_with(mut self, hash: SegmentHash) -> Container {
        self.hash = hash;
        self
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The container's size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Segment `i`, decompressed and checked against its fingerprint.
    pub fn segment(&self, i: usize) -> Result<Vec<u8>> {
        let entry = self.catalog.entry(i)?;
        self.catalog.check_present(i, entry)?;
        let name = &self.catalog.name;
        let frame = self
            .frame(i, &entry.location)
            .map_err(|d| Error::corrupt(name, d))?;
        segment_of(self.hash, name, i, entry, &frame)
    }

    /// Segments `first..first + count`, each checked, as
    /// `Catalog::read_run_cached` gives them: a frame that does not decode
    /// fails each of its segments in the run with the error of the first
    /// (one damaged frame, one error); every other check is each
    /// segment's own.
    pub fn run(&self, first: usize, count: usize) -> Vec<Result<Vec<u8>>> {
        let name = &self.catalog.name;
        let mut frame: Option<(u64, Decoded)> = None;
        (first..first.saturating_add(count))
            .map(|i| {
                let entry = self.catalog.entry(i)?;
                self.catalog.check_present(i, entry)?;
                let l = &entry.location;
                if frame.as_ref().is_some_and(|(at, _)| *at != l.offset) {
                    frame = None;
                }
                let (_, decoded) = frame.get_or_insert_with(|| (l.offset, self.frame(i, l)));
                match decoded {
                    Ok(f) => segment_of(self.hash, name, i, entry, f),
                    Err(d) => Err(Error::corrupt(name, d.as_str())),
                }
            })
            .collect()
    }

    /// The decoded frame at `l` (segment `i`'s), the last one kept.
    fn frame(&self, i: usize, l: &Location) -> Decoded {
        let mut last = self.last_frame.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, frame)) = &*last {
            if *at == l.offset {
                return Ok(Arc::clone(frame));
            }
        }
        let stored = &self.bytes[l.offset as usize..][..l.stored_len as usize];
        let frame = Arc::new(decode_frame(i, l, stored)?);
        *last = Some((l.offset, Arc::clone(&frame)));
        Ok(frame)
    }
}

/// Decode the header and refuse versions and flags this build does not read.
fn decode_header(name: &str, bytes: &[u8; HEADER_LEN]) -> Result<Header> {
    let corrupt = |detail: String| Error::corrupt(name, detail);
    let header = Header::decode(bytes).map_err(corrupt)?;
    if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&header.version) {
        return Err(corrupt(format!(
            "format version {} in the header; this build reads versions {OLDEST_VERSION} to {FORMAT_VERSION}",
            header.version
        )));
    }
    if header.flags != 0 {
        return Err(corrupt(format!("unknown header flags {:#x}", header.flags)));
    }
    Ok(header)
}

/// Decode the trailer and refuse versions this build does not read.
fn decode_trailer(name: &str, bytes: &[u8; TRAILER_LEN]) -> Result<Trailer> {
    let trailer = Trailer::decode(bytes).map_err(|e| Error::corrupt(name, e))?;
    if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&trailer.version) {
        return Err(Error::corrupt(
            name,
            format!(
                "format version {} in the trailer; this build reads versions {OLDEST_VERSION} to {FORMAT_VERSION}",
                trailer.version
            ),
        ));
    }
    if trailer.catalog_offset < HEADER_LEN as u64 {
        return Err(Error::corrupt(
            name,
            format!(
                "the catalog offset {} lies inside the {HEADER_LEN}-byte header",
                trailer.catalog_offset
            ),
        ));
    }
    Ok(trailer)
}

/// The catalog's stored length, which must fit its segments: exactly one
/// entry each, or when compressed, what such entries can compress to.
fn checked_catalog_len(name: &str, trailer: &Trailer) -> Result<u64> {
    let (version, count, len) = (trailer.version, trailer.segment_count, trailer.catalog_len);
    if !catalog_bytes::fits(version, count, len) {
        let why = if catalog_bytes::is_compressed(version) {
            format!("which cannot hold {count} compressed entries")
        } else {
            let need = u64::from(count) * entry_len(version) as u64;
            format!("but {count} segments need {need}")
        };
        return Err(Error::corrupt(
            name,
            format!("the catalog is {len} bytes, {why}"),
        ));
    }
    Ok(len)
}

/// A frame's stored bytes match the crc32c its entries record.
fn check_stored_crc(i: usize, l: &Location, stored: &[u8]) -> std::result::Result<(), String> {
    let sum = crc(stored);
    if sum != l.stored_crc {
        return Err(format!(
            "segment {i}'s frame (at offset {}) has checksum {:#010x}, which does not match its bytes ({sum:#010x})",
            l.offset, l.stored_crc
        ));
    }
    Ok(())
}

/// Check and decompress the frame holding segment `i`, whose stored bytes
/// are `stored`; the reason in words if it is damaged.
fn decode_frame(i: usize, l: &Location, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
    check_stored_crc(i, l, stored)?;
    match l.compression {
        Compression::None => Ok(stored.to_vec()),
        c => {
            let mut out = vec![0u8; l.frame_len as usize];
            let what = format!("the frame of segment {i} (at offset {})", l.offset);
            c.decompress(stored, &mut out, &what)
                .map_err(|e| e.to_string())?;
            Ok(out)
        }
    }
}

/// Segment `i` cut from its decompressed frame and checked against its
/// fingerprint.
fn segment_of(
    hash: SegmentHash,
    name: &str,
    i: usize,
    entry: &Entry,
    frame: &[u8],
) -> Result<Vec<u8>> {
    let l = &entry.location;
    let at = l.frame_at as usize;
    let raw = frame.get(at..at + l.raw_len as usize).ok_or_else(|| {
        Error::corrupt(
            name,
            format!("segment {i} lies outside its {}-byte frame", frame.len()),
        )
    })?;
    if hash.of(raw) != entry.fingerprint {
        return Err(Error::corrupt(
            name,
            format!("segment {i} does not match its fingerprint"),
        ));
    }
    Ok(raw.to_vec())
}

/// The frame that was open before segment `i` holds exactly the segments
/// its length promises.
fn check_frame_full(
    i: usize,
    open: Option<Location>,
    filled: u64,
) -> std::result::Result<(), String> {
    match open {
        Some(f) if u64::from(f.frame_len) != filled => Err(format!(
            "the frame before segment {i} is {} bytes raw, but its segments fill {filled}",
            f.frame_len
        )),
        _ => Ok(()),
    }
}

/// A frame's stored and raw sizes agree with its compression and limits
/// (checked at the segment `i` that starts it).
fn check_frame_sizes(i: usize, entry: &Entry) -> std::result::Result<(), String> {
    let l = &entry.location;
    if entry.is_absent() {
        return Ok(());
    }
    if l.frame_at != 0 {
        return Err(format!(
            "segment {i} starts a frame, but at {} in it",
            l.frame_at
        ));
    }
    if l.frame_len as usize > MAX_FRAME_LEN {
        return Err(format!(
            "segment {i}'s frame is {} bytes raw, over the {MAX_FRAME_LEN}-byte limit",
            l.frame_len
        ));
    }
    let agree = match l.compression {
        Compression::None => l.stored_len == l.frame_len,
        _ => l.stored_len < l.frame_len,
    };
    if !agree {
        return Err(format!(
            "segment {i}'s frame stores {} bytes for {} raw with compression {}",
            l.stored_len, l.frame_len, l.compression
        ));
    }
    Ok(())
}
