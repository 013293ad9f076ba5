//! Getting the index back after a restart: rebuilt from the catalogs of
//! containers written through `LocalDir`, or loaded from a checkpoint that
//! refuses any corruption by name and never panics.

use std::collections::HashMap;

use dedup_common::compress::Compression;
use dedup_common::fingerprint::Fingerprint;
use dedup_store::index::rebuild::{catalog_loader, container_ids};
use dedup_store::index::{Index, IndexConfig, HOOK_BYTES};
use dedup_store::{container_name, ContainerWriter, Error, LocalDir, ObjectStore};
use proptest::prelude::*;

const CONTAINERS: u64 = 12;
const SEGMENTS: usize = 300;

fn config() -> IndexConfig {
    IndexConfig {
        // 1,000 hooks for 3,600 segments: R drops below 1.
        index_memory: 1_000 * HOOK_BYTES,
        cache_entries: 1024,
        ..IndexConfig::default()
    }
}

/// Writes the containers and returns the live index built as they were
/// sealed, and every fingerprint with its container.
fn populate(store: &LocalDir) -> (Index, Vec<(Fingerprint, u64)>) {
    let mut live = Index::new(config());
    let mut all = Vec::new();
    for id in 0..CONTAINERS {
        let mut w = ContainerWriter::with_options(id, 1 << 24, Compression::None);
        let mut fps = Vec::new();
        for s in 0..SEGMENTS {
            let (f, _) = w
                .add(format!("container {id} segment {s}").as_bytes())
                .unwrap();
            fps.push(f);
            all.push((f, id));
        }
        store.put(&container_name(id), &w.seal()).unwrap();
        live.insert(id, &fps);
    }
    assert!(live.rate().period() > 1);
    (live, all)
}

/// The hooks, by fingerprint prefix.
fn hooks(index: &Index) -> HashMap<u64, (u64, bool)> {
    let table = index.hooks();
    table
        .iter()
        .map(|(p, h)| (p, (h.container, h.pinned)))
        .collect()
}

/// Every lookup of `fps`, in order, through the store's catalogs.
fn answers(index: &mut Index, store: &LocalDir, fps: &[(Fingerprint, u64)]) -> Vec<String> {
    let load = catalog_loader(store);
    fps.iter()
        .map(|(f, _)| format!("{:?}", index.lookup(f, &load).unwrap()))
        .collect()
}

#[test]
fn rebuild_from_catalogs_answers_as_the_live_index() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    let (mut live, all) = populate(&store);
    assert_eq!(
        container_ids(&store).unwrap(),
        (0..CONTAINERS).collect::<Vec<_>>()
    );
    let mut rebuilt = Index::rebuild(&store, config()).unwrap();
    assert_eq!(rebuilt.rate(), live.rate());
    assert_eq!(hooks(&rebuilt), hooks(&live));
    let expected = answers(&mut live, &store, &all);
    assert_eq!(answers(&mut rebuilt, &store, &all), expected);
    // Prefetch from real catalogs, into a cache big enough that nothing is
    // evicted: in-order lookups find everything, with the catalog entry.
    let roomy = IndexConfig {
        cache_entries: 16 << 10,
        ..config()
    };
    let mut fresh = Index::rebuild(&store, roomy).unwrap();
    let load = catalog_loader(&store);
    for (i, (f, id)) in all.iter().enumerate() {
        let a = fresh.lookup(f, &load).unwrap();
        let a = a.unwrap_or_else(|| panic!("segment {i} not found"));
        assert_eq!(a.container, *id);
        assert_eq!(a.entry.map(|e| e as usize), Some(i % SEGMENTS));
    }
    assert_eq!(fresh.counters().prefetches, CONTAINERS);
}

#[test]
fn rebuild_refuses_a_stray_name_under_containers() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    populate(&store);
    store.put("containers/not-hex", b"x").unwrap();
    let err = Index::rebuild(&store, config()).err().unwrap();
    assert!(
        matches!(err, Error::Corrupt { ref container, .. } if container == "containers/not-hex")
    );
}

#[test]
fn checkpoint_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    let (mut live, all) = populate(&store);
    let bytes = live.checkpoint();
    let mut loaded = Index::from_checkpoint(&bytes, config()).unwrap();
    assert_eq!(loaded.rate(), live.rate());
    assert_eq!(hooks(&loaded), hooks(&live));
    assert_eq!(loaded.hooks().fingerprints(), live.hooks().fingerprints());
    assert_eq!(loaded.checkpoint(), bytes, "the encoding is canonical");
    assert_eq!(
        answers(&mut loaded, &store, &all),
        answers(&mut live, &store, &all)
    );
    // A smaller budget on load halves R to fit.
    let small = IndexConfig {
        index_memory: 300 * HOOK_BYTES,
        ..config()
    };
    let shrunk = Index::from_checkpoint(&bytes, small).unwrap();
    assert!(shrunk.rate().period() > live.rate().period());
    assert!(shrunk.hooks().len() <= 300);
    assert!(shrunk.hooks().ram_bytes() <= small.index_memory);
}

fn refused(bytes: &[u8]) -> String {
    match Index::from_checkpoint(bytes, config()) {
        Err(Error::Corrupt { container, detail }) => {
            assert_eq!(container, "index checkpoint");
            detail
        }
        Err(e) => panic!("wrong error kind: {e}"),
        Ok(_) => panic!("corrupt checkpoint accepted"),
    }
}

#[test]
fn every_byte_flip_and_truncation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    let (live, _) = populate(&store);
    let bytes = live.checkpoint();
    for i in 0..bytes.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            refused(&b);
        }
    }
    for len in 0..bytes.len() {
        refused(&bytes[..len]);
    }
    let mut longer = bytes.clone();
    longer.push(0);
    refused(&longer);
    assert!(refused(&bytes[..10]).contains("shorter"));
}

/// A checkpoint body with a valid checksum, so the checks after it run.
fn seal(mut body: Vec<u8>) -> Vec<u8> {
    let sum = crc32c::crc32c(&body);
    body.extend_from_slice(&sum.to_le_bytes());
    body
}

fn header(version: u32, log2: u32, fingerprints: u64, count: u64) -> Vec<u8> {
    let mut b = b"DDUPHOOK".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&log2.to_le_bytes());
    b.extend_from_slice(&fingerprints.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}

/// A container's group: its id, its hook count, then the prefixes (the
/// first is its pinned hook).
fn group(container: u64, prefixes: &[u64]) -> Vec<u8> {
    let mut g = container.to_le_bytes().to_vec();
    g.extend_from_slice(&(prefixes.len() as u32).to_le_bytes());
    for p in prefixes {
        g.extend_from_slice(&p.to_le_bytes());
    }
    g
}

fn checkpoint(log2: u32, fingerprints: u64, groups: &[Vec<u8>]) -> Vec<u8> {
    let hooks: usize = groups.iter().map(|g| (g.len() - 12) / 8).sum();
    let mut b = header(2, log2, fingerprints, hooks as u64);
    groups.iter().for_each(|g| b.extend_from_slice(g));
    seal(b)
}

#[test]
fn forged_checkpoints_with_good_checksums_are_refused_by_name() {
    let good = |groups: &[Vec<u8>]| checkpoint(3, 100, groups);
    // Prefixes that are multiples of 8 are sampled at 1/8.
    assert!(
        Index::from_checkpoint(&good(&[group(7, &[1, 8, 16]), group(9, &[3])]), config()).is_ok()
    );
    assert!(refused(&seal(header(1, 0, 0, 0))).contains("version 1"));
    assert!(refused(&seal(header(2, 64, 0, 0))).contains("2^64"));
    assert!(refused(&seal(header(2, 0, 10, 1))).contains("groups hold 0"));
    assert!(refused(&seal(header(2, 0, 0, u64::MAX))).contains("only 0 fingerprints"));
    assert!(refused(&good(&[group(7, &[1, 16, 8])])).contains("out of order"));
    assert!(refused(&good(&[group(7, &[1, 8, 8])])).contains("out of order"));
    assert!(refused(&good(&[group(9, &[1]), group(7, &[2])])).contains("out of order"));
    assert!(refused(&good(&[group(7, &[1]), group(7, &[2])])).contains("out of order"));
    assert!(refused(&good(&[group(7, &[])])).contains("no pinned hook"));
    assert!(refused(&good(&[group(7, &[1, 8]), group(8, &[8])])).contains("repeats a prefix"));
    assert!(refused(&good(&[group(7, &[1, 9])])).contains("neither pinned nor sampled"));
    assert!(refused(&good(&[group(1 << 63, &[1])])).contains("highest id"));
    let mut long = group(7, &[1]);
    long[8] = 2; // claims two hooks, holds one
    assert!(refused(&good(&[long])).contains("more than the"));
    let mut short = header(2, 0, 10, 1);
    short.extend_from_slice(&[0; 11]);
    assert!(refused(&seal(short)).contains("too few for a container's group"));
    assert!(
        refused(&checkpoint(0, 1, &[group(7, &[1]), group(8, &[2])]))
            .contains("only 1 fingerprints")
    );
}

#[test]
fn checkpoint_keeps_eight_bytes_a_hook() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalDir::open(dir.path()).unwrap();
    let (live, _) = populate(&store);
    let hooks = live.hooks().len();
    let containers = CONTAINERS as usize;
    assert_eq!(
        live.checkpoint().len(),
        32 + containers * 12 + hooks * 8 + 4
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = Index::from_checkpoint(&bytes, config());
    }

    #[test]
    fn random_records_with_good_checksums_never_panic(
        log2 in 0u32..70,
        fingerprints in any::<u64>(),
        groups in proptest::collection::vec(
            (0u64..4, proptest::collection::vec(0u64..40, 0..5)),
            0..6,
        ),
        claimed in 0u32..8,
    ) {
        let mut b = header(2, log2, fingerprints, groups.len() as u64);
        for (c, prefixes) in groups {
            let mut g = group(c, &prefixes);
            if claimed > 5 {
                g[8..12].copy_from_slice(&claimed.to_le_bytes());
            }
            b.extend(g);
        }
        let _ = Index::from_checkpoint(&seal(b), config());
    }
}
