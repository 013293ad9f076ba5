//! Reading containers: the whole of one (`Container`), or only its catalog
//! (`Catalog`, two ranged reads: the trailer, then catalog and trailer),
//! which is what the paper's catalog prefetch needs (§3.2: a hit on a
//! sampled fingerprint loads its container's catalog into the cache).
//!
//! Every check names the container and what is wrong; nothing panics,
//! whatever the bytes.

use dedup_core::compress::Compression;

use crate::error::{Error, Result};
use crate::format::{
    crc, Entry, Header, Trailer, ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, MAX_SEGMENT_LEN,
    TRAILER_LEN,
};
use crate::objects::ObjectStore;
use crate::writer::HASH;

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

/// A container's catalog: each segment's fingerprint and location.
#[derive(Clone, Debug)]
pub struct Catalog {
    name: String,
    container_id: u64,
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
        let tail = store.get_tail(&name, TRAILER_LEN as u64)?;
        let tail: &[u8; TRAILER_LEN] = tail.as_slice().try_into().map_err(|_| {
            corrupt(format!(
                "it is {} bytes, shorter than a {TRAILER_LEN}-byte trailer",
                tail.len()
            ))
        })?;
        let trailer = decode_trailer(&name, tail)?;
        let catalog_len = checked_catalog_len(&name, &trailer)?;
        // Read the catalog with the trailer after it: finding the same
        // trailer there proves the catalog offset is where the object ends.
        let with_trailer = catalog_len + TRAILER_LEN as u64;
        let bytes = match store.get_range(&name, trailer.catalog_offset, with_trailer) {
            Err(Error::OutOfRange { size, .. }) => {
                return Err(corrupt(format!(
                    "the trailer puts a {catalog_len}-byte catalog at offset {}, past the end of the {size}-byte object",
                    trailer.catalog_offset
                )))
            }
            other => other?,
        };
        let (catalog, found) = bytes.split_at(catalog_len as usize);
        if found != tail {
            return Err(corrupt(format!(
                "the catalog offset {} and length {catalog_len} do not end at the trailer",
                trailer.catalog_offset
            )));
        }
        let catalog = Catalog::parse(&name, &trailer, catalog)?;
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
        // Segments lie back to back from the header to the catalog, in
        // catalog order: no gaps, no overlaps, nothing outside.
        let mut next = HEADER_LEN as u64;
        let mut entries = Vec::with_capacity(trailer.segment_count as usize);
        for (i, raw) in bytes.chunks_exact(ENTRY_LEN).enumerate() {
            let raw: &[u8; ENTRY_LEN] = raw.try_into().expect("chunks_exact gives ENTRY_LEN");
            let entry = Entry::decode(raw).map_err(|e| corrupt(format!("segment {i}: {e}")))?;
            let l = &entry.location;
            if l.offset != next {
                return Err(corrupt(format!(
                    "segment {i} is at offset {}, not {next} where the one before it ends",
                    l.offset
                )));
            }
            if l.raw_len as usize > MAX_SEGMENT_LEN {
                return Err(corrupt(format!(
                    "segment {i} is {} bytes raw, over the {MAX_SEGMENT_LEN}-byte limit",
                    l.raw_len
                )));
            }
            let sizes_agree = match l.compression {
                _ if entry.is_absent() => true,
                Compression::None => l.stored_len == l.raw_len,
                _ => l.stored_len < l.raw_len,
            };
            if !sizes_agree {
                return Err(corrupt(format!(
                    "segment {i} stores {} bytes for {} raw with compression {}",
                    l.stored_len, l.raw_len, l.compression
                )));
            }
            next += u64::from(l.stored_len); // both < 2^33: no overflow
            if next > trailer.catalog_offset {
                return Err(corrupt(format!(
                    "segment {i} ends at {next}, past the catalog at {}",
                    trailer.catalog_offset
                )));
            }
            entries.push(entry);
        }
        if next != trailer.catalog_offset {
            return Err(corrupt(format!(
                "the segments end at {next}, not at the catalog at {}",
                trailer.catalog_offset
            )));
        }
        Ok(Catalog {
            name: name.to_string(),
            container_id: trailer.container_id,
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
            .entries
            .iter()
            .map(|e| u64::from(e.location.stored_len))
            .sum();
        (HEADER_LEN + self.entries.len() * ENTRY_LEN + TRAILER_LEN) as u64 + stored
    }

    /// The segments in container order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Read segment `i` alone with one ranged read, checked and decompressed.
    pub fn read_segment(&self, store: &dyn ObjectStore, i: usize) -> Result<Vec<u8>> {
        let entry = self.entry(i)?;
        self.check_present(i, entry)?;
        let l = &entry.location;
        let stored = store.get_range(&self.name, l.offset, u64::from(l.stored_len))?;
        decode_segment(&self.name, i, entry, &stored)
    }

    /// Read segments `first..first + count` with one ranged read when they
    /// lie back to back (as a container writes them); one read each
    /// otherwise. Each is checked and decompressed on its own, so a damaged
    /// one does not cost the ones before it.
    pub fn read_run(
        &self,
        store: &dyn ObjectStore,
        first: usize,
        count: usize,
    ) -> Result<Vec<Result<Vec<u8>>>> {
        let end = first.saturating_add(count);
        self.entry(end.saturating_sub(1).max(first))?;
        let run = &self.entries[first..end];
        let contiguous = run.windows(2).all(|w| {
            w[0].location.offset + u64::from(w[0].location.stored_len) == w[1].location.offset
        });
        if !contiguous || run.is_empty() {
            return Ok((first..end).map(|i| self.read_segment(store, i)).collect());
        }
        let start = run[0].location.offset;
        let len: u64 = run.iter().map(|e| u64::from(e.location.stored_len)).sum();
        let bytes = store.get_range(&self.name, start, len)?;
        Ok(run
            .iter()
            .enumerate()
            .map(|(k, e)| {
                self.check_present(first + k, e)?;
                let at = (e.location.offset - start) as usize;
                let stored = &bytes[at..at + e.location.stored_len as usize];
                decode_segment(&self.name, first + k, e, stored)
            })
            .collect())
    }

    /// Read the container's header (one ranged read) and check that it
    /// agrees with this catalog, which `read` does not look at: with it,
    /// every byte but the segment bodies has been checked.
    pub fn check_header(&self, store: &dyn ObjectStore) -> Result<()> {
        let bytes = store.get_range(&self.name, 0, HEADER_LEN as u64)?;
        let bytes: &[u8; HEADER_LEN] = bytes.as_slice().try_into().map_err(|_| {
            Error::corrupt(&self.name, format!("its header is not {HEADER_LEN} bytes"))
        })?;
        let header = decode_header(&self.name, bytes)?;
        let count = self.entries.len() as u64;
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

/// A whole container in memory, every part checked.
pub struct Container {
    bytes: Vec<u8>,
    catalog: Catalog,
}

impl Container {
    /// Read container `id` whole.
    pub fn read(store: &dyn ObjectStore, id: u64) -> Result<Container> {
        with_fallback(id, |name| {
            let container = Container::parse(name, store.get(name)?)?;
            container.catalog.check_id(id)?;
            Ok(container)
        })
    }

    /// Parse a container's bytes; `name` is what errors call it. Checks
    /// every checksum, segment bodies included, so any damage is refused
    /// here rather than found at restore time.
    pub fn parse(name: &str, bytes: Vec<u8>) -> Result<Container> {
        let container = Container::parse_structure(name, bytes)?;
        for (i, entry) in container.catalog.entries.iter().enumerate() {
            if entry.is_absent() {
                continue;
            }
            let l = &entry.location;
            let stored = &container.bytes[l.offset as usize..][..l.stored_len as usize];
            check_stored_crc(name, i, entry, stored)?;
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
        Ok(Container { bytes, catalog })
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The container's size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Segment `i`'s stored bytes as they are (compressed), unchecked
    /// beyond what `parse` checked.
    pub fn stored(&self, i: usize) -> Result<&[u8]> {
        let l = &self.catalog.entry(i)?.location;
        Ok(&self.bytes[l.offset as usize..][..l.stored_len as usize])
    }

    /// Segment `i`, decompressed and checked against its fingerprint.
    pub fn segment(&self, i: usize) -> Result<Vec<u8>> {
        let entry = self.catalog.entry(i)?;
        self.catalog.check_present(i, entry)?;
        let l = &entry.location;
        let stored = &self.bytes[l.offset as usize..][..l.stored_len as usize];
        decode_segment(&self.catalog.name, i, entry, stored)
    }
}

/// Decode the header and refuse versions and flags this build does not read.
fn decode_header(name: &str, bytes: &[u8; HEADER_LEN]) -> Result<Header> {
    let corrupt = |detail: String| Error::corrupt(name, detail);
    let header = Header::decode(bytes).map_err(corrupt)?;
    if header.version != FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {} in the header; this build reads version {FORMAT_VERSION}",
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
    if trailer.version != FORMAT_VERSION {
        return Err(Error::corrupt(
            name,
            format!(
                "format version {} in the trailer; this build reads version {FORMAT_VERSION}",
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

/// The catalog length, which must be exactly one entry per segment.
fn checked_catalog_len(name: &str, trailer: &Trailer) -> Result<u64> {
    let expected = u64::from(trailer.segment_count) * ENTRY_LEN as u64;
    if trailer.catalog_len != expected {
        return Err(Error::corrupt(
            name,
            format!(
                "the catalog is {} bytes, but {} segments need {expected}",
                trailer.catalog_len, trailer.segment_count
            ),
        ));
    }
    Ok(expected)
}

fn check_stored_crc(name: &str, i: usize, entry: &Entry, stored: &[u8]) -> Result<()> {
    let sum = crc(stored);
    if sum != entry.location.stored_crc {
        return Err(Error::corrupt(
            name,
            format!(
                "segment {i}'s checksum {:#010x} does not match its bytes ({sum:#010x})",
                entry.location.stored_crc
            ),
        ));
    }
    Ok(())
}

/// Check, decompress and verify one segment's stored bytes.
fn decode_segment(name: &str, i: usize, entry: &Entry, stored: &[u8]) -> Result<Vec<u8>> {
    check_stored_crc(name, i, entry, stored)?;
    let l = &entry.location;
    let raw = match l.compression {
        Compression::None => stored.to_vec(),
        c => {
            let mut out = vec![0u8; l.raw_len as usize];
            let what = format!("segment {i} of container {name}");
            c.decompress(stored, &mut out, &what)
                .map_err(|e| Error::corrupt(name, e.to_string()))?;
            out
        }
    };
    if HASH.fingerprint(&raw) != entry.fingerprint {
        return Err(Error::corrupt(
            name,
            format!("segment {i} does not match its fingerprint"),
        ));
    }
    Ok(raw)
}
