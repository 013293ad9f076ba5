//! The catalog cache's second tier: catalogs the in-memory cache let go,
//! kept in an anonymous file on local disk for the rest of the process.
//!
//! Why: a backup reads back the catalog of every container it finds
//! duplicates in, and the memory holds 16 (`catalog_cache.rs`). A 2 GiB
//! image into a bucket wrote 44 containers and read the catalogs of ten of
//! its own back four times each, two requests a time: 46 of its 171
//! requests. A file keeps them for a few hundred KiB of local disk each,
//! and memory stays independent of the repository.
//!
//! It is the memory cache's tier, not a hint of its own: it lives under
//! the same lock, and the cache forgets a catalog in both at once (a
//! compaction, an epoch that condemned it), so it is never staler than the
//! memory would have been. The file is unlinked (nothing is left behind by
//! a crash, and nothing is readable by other users), and each record
//! carries a CRC-32C: one that does not match (a bad local disk) is
//! forgotten and the catalog read again from the repository.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::container::Catalog;
use crate::format::{entry_len, Entry};

/// Bytes of spilled catalogs kept at most: past this the file starts
/// over (64 bytes a segment: some 4 million segments, 16 GiB of 4 KiB
/// segments' catalogs).
const LIMIT: u64 = 256 << 20;

pub(crate) struct CatalogSpill {
    file: File,
    /// Where the next record goes.
    end: u64,
    /// Container id → the offset and length of its record.
    records: HashMap<u64, (u64, usize)>,
}

impl CatalogSpill {
    /// A new, empty spill file in the user's cache directory (or the
    /// system's temporary one); `None` if neither can make one, and the
    /// catalogs are then read again as before.
    pub(crate) fn new() -> Option<CatalogSpill> {
        let file = crate::local_cache::dir("spill")
            .and_then(|dir| tempfile::tempfile_in(dir).ok())
            .or_else(|| tempfile::tempfile().ok())?;
        Some(CatalogSpill {
            file,
            end: 0,
            records: HashMap::new(),
        })
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.records.contains_key(&id)
    }

    /// Keep `catalog`; a write that fails keeps nothing.
    pub(crate) fn put(&mut self, catalog: &Catalog) {
        let record = encode(catalog);
        if self.end + record.len() as u64 > LIMIT {
            self.clear();
        }
        if self.file.write_all_at(&record, self.end).is_ok() {
            self.records
                .insert(catalog.container_id(), (self.end, record.len()));
            self.end += record.len() as u64;
        }
    }

    /// Container `id`'s catalog, if kept and read back whole.
    pub(crate) fn get(&mut self, id: u64) -> Option<Catalog> {
        let &(at, len) = self.records.get(&id)?;
        let mut record = vec![0; len];
        let catalog = self
            .file
            .read_exact_at(&mut record, at)
            .ok()
            .and_then(|()| decode(&record))
            .filter(|c| c.container_id() == id);
        if catalog.is_none() {
            self.records.remove(&id);
        }
        catalog
    }

    pub(crate) fn forget(&mut self, id: u64) {
        self.records.remove(&id);
    }

    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.end = 0;
        let _ = self.file.set_len(0);
    }
}

/// crc32c (u32) of the rest, id (u64), version (u32), stored catalog
/// length (u64), entry count (u32), object name (u16 length, UTF-8), then
/// the entries as `entry_len(version)`-byte rows.
fn encode(c: &Catalog) -> Vec<u8> {
    let (name, version, catalog_len) = c.spill_parts();
    let row = entry_len(version);
    let mut b = Vec::with_capacity(32 + name.len() + c.entries().len() * row);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&c.container_id().to_le_bytes());
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&catalog_len.to_le_bytes());
    b.extend_from_slice(&(c.entries().len() as u32).to_le_bytes());
    b.extend_from_slice(&(name.len() as u16).to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    for e in c.entries() {
        b.extend_from_slice(&e.encode()[..row]);
    }
    let sum = crc32c::crc32c(&b[4..]);
    b[..4].copy_from_slice(&sum.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Catalog> {
    let (sum, rest) = b.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*sum) != crc32c::crc32c(rest) {
        return None;
    }
    let (id, rest) = rest.split_first_chunk::<8>()?;
    let (version, rest) = rest.split_first_chunk::<4>()?;
    let (catalog_len, rest) = rest.split_first_chunk::<8>()?;
    let (count, rest) = rest.split_first_chunk::<4>()?;
    let (name_len, rest) = rest.split_first_chunk::<2>()?;
    let (name, rows) = rest.split_at_checked(usize::from(u16::from_le_bytes(*name_len)))?;
    let version = u32::from_le_bytes(*version);
    let row = entry_len(version);
    if rows.len() != u32::from_le_bytes(*count) as usize * row {
        return None;
    }
    let entries = rows
        .chunks_exact(row)
        .map(|r| Entry::decode(r, version).ok())
        .collect::<Option<Vec<Entry>>>()?;
    Some(Catalog::from_spill(
        std::str::from_utf8(name).ok()?.to_string(),
        u64::from_le_bytes(*id),
        version,
        u64::from_le_bytes(*catalog_len),
        entries,
    ))
}

/// The catalog of a container `id` of `segments` distinct segments, as
/// read back from a directory: for the tests of this tier and of the
/// cache above it.
#[cfg(test)]
pub(crate) fn test_catalog(id: u64, segments: u64) -> Catalog {
    use crate::objects::ObjectStore;
    let dir = tempfile::tempdir().unwrap();
    let store = crate::LocalDir::open(dir.path()).unwrap();
    let mut w = crate::writer::ContainerWriter::new(id);
    for i in 0..segments {
        w.add(&(id * 1000 + i).to_le_bytes().repeat(100)).unwrap();
    }
    store.put(&crate::container_name(id), &w.seal()).unwrap();
    Catalog::read(&store, id).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(id: u64, segments: u64) -> Catalog {
        test_catalog(id, segments)
    }

    fn same(a: &Catalog, b: &Catalog) {
        assert_eq!(a.container_id(), b.container_id());
        assert_eq!(a.object_name(), b.object_name());
        assert_eq!(a.spill_parts(), b.spill_parts());
        assert_eq!(a.entries(), b.entries());
        assert_eq!(a.container_len(), b.container_len());
    }

    #[test]
    fn a_spilled_catalog_comes_back_whole() {
        let mut spill = CatalogSpill::new().unwrap();
        let (a, b) = (catalog(7, 40), catalog(9, 3));
        spill.put(&a);
        spill.put(&b);
        same(&spill.get(7).unwrap(), &a);
        same(&spill.get(9).unwrap(), &b);
        assert!(spill.get(8).is_none());
        spill.forget(7);
        assert!(spill.get(7).is_none() && spill.get(9).is_some());
        spill.clear();
        assert!(spill.get(9).is_none());
    }

    #[test]
    fn a_damaged_record_is_forgotten_not_believed() {
        let mut spill = CatalogSpill::new().unwrap();
        let a = catalog(3, 20);
        spill.put(&a);
        let (at, len) = spill.records[&3];
        for flip in [0, 5, 20, len as u64 / 2, len as u64 - 1] {
            let mut byte = [0u8];
            spill.file.read_exact_at(&mut byte, at + flip).unwrap();
            spill
                .file
                .write_all_at(&[byte[0] ^ 0x10], at + flip)
                .unwrap();
            assert!(spill.get(3).is_none(), "flip at {flip} believed");
            assert!(!spill.contains(3));
            spill.file.write_all_at(&byte, at + flip).unwrap();
            spill.records.insert(3, (at, len));
            same(&spill.get(3).unwrap(), &a);
        }
    }

    #[test]
    fn every_truncation_of_a_record_is_refused() {
        let record = encode(&catalog(4, 5));
        assert!(decode(&record).is_some());
        for cut in 0..record.len() {
            assert!(decode(&record[..cut]).is_none(), "cut at {cut}");
        }
    }
}
