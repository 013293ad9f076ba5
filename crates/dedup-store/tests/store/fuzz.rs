//! Fuzz-style: arbitrary bytes, and arbitrary fields dressed up with valid
//! checksums (so they get past the crcs into the deeper checks), must never
//! make the container parser or the catalog reader panic.

use dedup_common::fingerprint::Fingerprint;
use dedup_store::catalog_bytes;
use dedup_store::format::{
    crc, Entry, Header, Location, Trailer, FORMAT_VERSION, HEADER_LEN, OLDEST_VERSION,
};
use dedup_store::{container_name, Catalog, Container, ContainerWriter, LocalDir, ObjectStore};
use proptest::prelude::*;

/// Parse, and if that succeeds, read every segment: neither may panic.
fn exercise(bytes: Vec<u8>) {
    if let Ok(c) = Container::parse("fuzz", bytes) {
        for i in 0..c.catalog().entries().len() + 1 {
            let _ = c.segment(i);
        }
    }
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        any::<[u8; 32]>(),
        prop_oneof![Just(HEADER_LEN as u64), 0..200u64, any::<u64>()],
        prop_oneof![0..64u32, any::<u32>()],
        prop_oneof![0..64u32, any::<u32>()],
        prop::sample::select(vec![0u8, 1, 0x83]),
        any::<u32>(),
        prop_oneof![Just(0u32), 0..64u32, any::<u32>()],
        prop_oneof![0..128u32, any::<u32>()],
    )
        .prop_map(
            |(fp, offset, stored_len, raw_len, code, stored_crc, frame_at, frame_len)| Entry {
                fingerprint: Fingerprint(fp),
                location: Location {
                    offset,
                    stored_len,
                    raw_len,
                    compression: dedup_common::compress::Compression::from_code(code).unwrap(),
                    stored_crc,
                    frame_at,
                    frame_len,
                },
            },
        )
}

/// A container put together from arbitrary parts with every checksum valid.
fn forged() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(entry(), 0..4),
        // Mostly the id its name gives (0 below), sometimes any other.
        prop_oneof![3 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        any::<bool>(),
        prop::sample::select(vec![OLDEST_VERSION, 2, FORMAT_VERSION]),
    )
        .prop_map(
            |(body, entries, id, offset_override, honest_count, version)| {
                let count = if honest_count {
                    entries.len() as u32
                } else {
                    entries.len() as u32 + 1
                };
                let mut out = Header {
                    version,
                    flags: 0,
                    container_id: id,
                    segment_count: count,
                }
                .encode()
                .to_vec();
                out.extend_from_slice(&body);
                let catalog_offset = out.len() as u64;
                out.extend_from_slice(&catalog_bytes::pack(&entries, version));
                let catalog = &out[catalog_offset as usize..];
                let trailer = Trailer {
                    version,
                    segment_count: count,
                    container_id: id,
                    catalog_offset: offset_override.unwrap_or(catalog_offset),
                    catalog_len: catalog.len() as u64,
                    catalog_crc: crc(catalog),
                };
                out.extend_from_slice(&trailer.encode());
                out
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        exercise(bytes);
    }

    #[test]
    fn forged_containers_never_panic(bytes in forged()) {
        exercise(bytes);
    }

    /// A real container with a few bytes overwritten, so most of it is
    /// well-formed.
    #[test]
    fn damaged_real_containers_never_panic(
        segments in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..5),
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut w = ContainerWriter::new(1);
        for s in &segments {
            w.add(s).unwrap();
        }
        let mut bytes = w.seal();
        let len = bytes.len();
        for (at, v) in damage {
            bytes[at.index(len)] = v;
        }
        exercise(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The catalog reader, through a store, on forged tails.
    #[test]
    fn forged_catalogs_never_panic(bytes in forged()) {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalDir::open(tmp.path()).unwrap();
        store.put(&container_name(0), &bytes).unwrap();
        let catalog = Catalog::read(&store, 0);
        if let Ok(catalog) = &catalog {
            for i in 0..catalog.entries().len() {
                let _ = catalog.read_segment(&store, i);
                let _ = catalog.read_run(&store, i, catalog.entries().len() - i);
            }
        }
        // Whatever the whole-container read accepts, the catalog reader
        // (which checks a subset) accepts the same way. Both check the id
        // inside against the name; a bare parse has no name to check.
        if let Ok(whole) = Container::read(&store, 0) {
            let catalog = catalog.expect("the catalog of a valid container reads");
            prop_assert_eq!(catalog.entries(), whole.catalog().entries());
        }
    }
}
