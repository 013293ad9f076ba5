//! Reading and rewriting a container's catalog in tests that damage or
//! forge one: the catalog of version 3 is compressed, so its entries are
//! not at fixed offsets in the container's bytes.
#![allow(dead_code)] // each test file uses its own part

use dedup_store::catalog_bytes;
use dedup_store::format::{crc, entry_len, Entry, Trailer, TRAILER_LEN};

pub fn trailer(bytes: &[u8]) -> Trailer {
    Trailer::decode(bytes[bytes.len() - TRAILER_LEN..].try_into().unwrap()).unwrap()
}

/// The catalog's entries, from a container's bytes.
pub fn entries(bytes: &[u8]) -> Vec<Entry> {
    let t = trailer(bytes);
    let stored = &bytes[t.catalog_offset as usize..bytes.len() - TRAILER_LEN];
    let rows = catalog_bytes::unpack(t.version, t.segment_count, stored).unwrap();
    rows.chunks_exact(entry_len(t.version))
        .map(|e| Entry::decode(e, t.version).unwrap())
        .collect()
}

/// The container with its catalog's entries changed by `change`, and the
/// catalog and trailer written again with good checksums (the segment
/// count stays).
pub fn with_entries(bytes: &[u8], change: impl FnOnce(&mut Vec<Entry>)) -> Vec<u8> {
    let t = trailer(bytes);
    let mut all = entries(bytes);
    change(&mut all);
    let catalog = catalog_bytes::pack(&all, t.version);
    let mut out = bytes[..t.catalog_offset as usize].to_vec();
    out.extend_from_slice(&catalog);
    let fixed = Trailer {
        catalog_len: catalog.len() as u64,
        catalog_crc: crc(&catalog),
        ..t
    };
    out.extend_from_slice(&fixed.encode());
    out
}
