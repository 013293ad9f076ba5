//! Conformance of the two seams (`backend.rs`'s `MetadataBackend`,
//! `placement`'s `Placement`), run against the documented skeletons
//! (`backends/skeleton.rs`, `placement/skeleton.rs`). A device is built
//! from a hand-made `registry::Pair`, as a new store or placement is tried
//! before it is registered, and driven through seeded random sequences of
//! aligned and unaligned writes (a small alphabet of contents, zeros
//! included, so duplicates are everywhere), trims, write-zeroes, flushes,
//! reads and GC, on a data device sometimes too small for them (ENOSPC,
//! and the collection it triggers). After every step the device must read
//! like a plain in-memory disk, `check` must be clean and the totals
//! `stats` reports must agree with the model.
//!
//! To test a new store or placement, swap it into the `Pair` of one of the
//! tests below. The skeletons persist nothing, so devices are never
//! reopened here; a persistent store also belongs in `tests/device/model.rs`,
//! which reopens and crashes devices, once it is registered.

use std::collections::HashSet;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use dedup_core::backend::MetadataBackend;
use dedup_core::backends::skeleton::Skeleton;
use dedup_core::backends::OpenOptions;
use dedup_core::blockfile::{BlockFile, MemBlockFile};
use dedup_core::compress::Compression;
use dedup_core::config::DeviceConfig;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::placement::plain::Plain;
use dedup_core::placement::skeleton::SkeletonPlacement;
use dedup_core::placement::Placement;
use dedup_core::registry::Pair;
use dedup_core::{Device, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CS: usize = 4096;
const LOGICAL_CHUNKS: u64 = 16;
const SIZE: u64 = LOGICAL_CHUNKS * CS as u64;
/// Pattern 0 is zeros; the others are distinct pseudo-random chunk images.
const PATTERNS: usize = 5;
const SEEDS: u64 = 300;
const OPS: usize = 50;

fn config(physical_chunks: u64, verify: bool) -> DeviceConfig {
    DeviceConfig {
        uuid: [0x5e; 16],
        backend: "skeleton".into(),
        chunk_size: CS as u32,
        hash: HashAlgo::Blake3,
        verify,
        logical_size: SIZE,
        physical_chunks,
        compression: Compression::None,
    }
}

type Build =
    fn(&DeviceConfig, Arc<dyn BlockFile>) -> (Box<dyn MetadataBackend>, Box<dyn Placement>);

fn device(cfg: &DeviceConfig, build: Build) -> Device {
    let data: Arc<dyn BlockFile> = Arc::new(MemBlockFile::new(cfg.data_device_len(), "data"));
    let (store, placement) = build(cfg, data);
    let pair = Pair {
        store,
        placement,
        record: Default::default(),
        commits: false,
        rolled_back: false,
        recovered: None,
        data_ordered: false,
        written: None,
    };
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    Device::assemble(cfg.clone(), pair, &opts).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    /// Whole aligned chunks, each of its own pattern (duplicates within
    /// one batch, and zero chunks among stored ones).
    WriteChunks {
        lbn: u64,
        patterns: Vec<usize>,
        fua: bool,
    },
    /// Any byte range of one pattern: read-modify-write at the edges.
    WriteBytes {
        offset: u64,
        len: u64,
        pattern: usize,
    },
    Read {
        offset: u64,
        len: u64,
    },
    Trim {
        offset: u64,
        len: u64,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    Flush,
    Gc,
}

fn range(rng: &mut StdRng) -> (u64, u64) {
    let offset = rng.random_range(0..SIZE);
    let len = rng.random_range(1..=SIZE / 2).min(SIZE - offset);
    (offset, len)
}

fn random_op(rng: &mut StdRng) -> Op {
    match rng.random_range(0..20) {
        0..=6 => {
            let lbn = rng.random_range(0..LOGICAL_CHUNKS);
            let n = rng.random_range(1..=4).min(LOGICAL_CHUNKS - lbn);
            let one = rng.random_range(0..PATTERNS);
            let patterns = (0..n)
                .map(|_| {
                    if rng.random_bool(0.5) {
                        one
                    } else {
                        rng.random_range(0..PATTERNS)
                    }
                })
                .collect();
            Op::WriteChunks {
                lbn,
                patterns,
                fua: rng.random_bool(0.2),
            }
        }
        7..=10 => {
            let (offset, len) = range(rng);
            Op::WriteBytes {
                offset,
                len,
                pattern: rng.random_range(0..PATTERNS),
            }
        }
        11..=13 => {
            let (offset, len) = range(rng);
            Op::Read { offset, len }
        }
        14..=15 => {
            let (offset, len) = range(rng);
            Op::Trim {
                offset,
                len,
                fua: rng.random_bool(0.2),
            }
        }
        16 => {
            let (offset, len) = range(rng);
            Op::WriteZeroes { offset, len }
        }
        17 => Op::Flush,
        _ => Op::Gc,
    }
}

/// Pattern `p`'s bytes for device range `[offset, offset + len)`: periodic
/// in the chunk size, so every whole chunk of `p` is the same chunk.
fn pattern_bytes(images: &[Vec<u8>], p: usize, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| images[p][((offset + i) % CS as u64) as usize])
        .collect()
}

struct Harness {
    dev: Device,
    model: Vec<u8>,
    images: Vec<Vec<u8>>,
    physical_chunks: u64,
}

impl Harness {
    fn chunk(&self, lbn: usize) -> &[u8] {
        &self.model[lbn * CS..(lbn + 1) * CS]
    }

    /// (non-zero chunks, distinct non-zero contents) of the model.
    fn nonzero_and_distinct(&self) -> (u64, u64) {
        let mut distinct = HashSet::new();
        let mut nonzero = 0;
        for lbn in 0..LOGICAL_CHUNKS as usize {
            let c = self.chunk(lbn);
            if c.iter().any(|&b| b != 0) {
                nonzero += 1;
                distinct.insert(c.to_vec());
            }
        }
        (nonzero, distinct.len() as u64)
    }

    /// Apply a mutation of `[offset, offset + len)` whose result, if it
    /// succeeds, is `after`. ENOSPC may leave each chunk of the range old
    /// or new (batches before the full one were applied); nothing else.
    fn mutate(
        &mut self,
        offset: u64,
        len: u64,
        after: Vec<u8>,
        f: impl FnOnce(&Device) -> dedup_core::Result<()>,
    ) {
        match f(&self.dev) {
            Ok(()) => self.model = after,
            Err(Error::NoSpace { .. }) => {
                let lbns = offset / CS as u64..(offset + len).div_ceil(CS as u64);
                for lbn in lbns.map(|l| l as usize) {
                    let mut got = vec![0u8; CS];
                    self.dev.read((lbn * CS) as u64, &mut got).unwrap();
                    let (old, new) = (self.chunk(lbn), &after[lbn * CS..(lbn + 1) * CS]);
                    assert!(
                        got == old || got == new,
                        "chunk {lbn} holds neither old nor new data after ENOSPC"
                    );
                    self.model[lbn * CS..(lbn + 1) * CS].copy_from_slice(&got);
                }
            }
            Err(e) => panic!("mutation failed: {e}"),
        }
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::WriteChunks { lbn, patterns, fua } => {
                let offset = lbn * CS as u64;
                let mut data = Vec::with_capacity(patterns.len() * CS);
                for &p in patterns {
                    data.extend_from_slice(&self.images[p]);
                }
                let mut after = self.model.clone();
                after[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                self.mutate(offset, data.len() as u64, after, |d| {
                    d.write(offset, &data, *fua)
                });
            }
            &Op::WriteBytes {
                offset,
                len,
                pattern,
            } => {
                let data = pattern_bytes(&self.images, pattern, offset, len as usize);
                let mut after = self.model.clone();
                after[offset as usize..(offset + len) as usize].copy_from_slice(&data);
                self.mutate(offset, len, after, |d| d.write(offset, &data, false));
            }
            &Op::Read { offset, len } => {
                let mut got = vec![0u8; len as usize];
                self.dev.read(offset, &mut got).unwrap();
                assert!(
                    got == self.model[offset as usize..(offset + len) as usize],
                    "read of {len} bytes at {offset} differs from the model"
                );
            }
            &Op::Trim { offset, len, fua } => {
                let mut after = self.model.clone();
                after[offset as usize..(offset + len) as usize].fill(0);
                self.mutate(offset, len, after, |d| d.discard(offset, len, fua));
            }
            &Op::WriteZeroes { offset, len } => {
                let mut after = self.model.clone();
                after[offset as usize..(offset + len) as usize].fill(0);
                self.mutate(offset, len, after, |d| d.write_zeroes(offset, len, false));
            }
            Op::Flush => self.dev.flush().unwrap(),
            Op::Gc => {
                self.dev.gc().unwrap();
                let (_, distinct) = self.nonzero_and_distinct();
                assert_eq!(
                    self.dev.stats().chunks_stored,
                    distinct,
                    "after GC, stored chunks = distinct live contents"
                );
            }
        }
        self.assert_consistent();
    }

    /// `check` clean, and every total agreeing with the model and each other.
    fn assert_consistent(&self) {
        let report = self.dev.check(true).unwrap();
        assert!(
            report.is_clean(),
            "check found problems: {:#?}",
            report.problems
        );
        let (nonzero, distinct) = self.nonzero_and_distinct();
        let s = self.dev.stats();
        assert_eq!(
            s.chunks_mapped, nonzero,
            "chunks_mapped = non-zero chunks of the model"
        );
        assert_eq!(
            report.lbns_mapped, nonzero,
            "check's mapped LBNs = non-zero chunks"
        );
        assert_eq!(
            report.pbns_used, s.chunks_stored,
            "check's used PBNs = chunks_stored"
        );
        // Every stored chunk is indexed (no fingerprint collides here).
        assert_eq!(
            s.hash_index_entries, s.chunks_stored,
            "hash entries = chunks stored"
        );
        assert!(
            distinct <= s.chunks_stored && s.chunks_stored <= self.physical_chunks,
            "distinct {distinct} <= stored {} <= physical {}",
            s.chunks_stored,
            self.physical_chunks
        );
        assert_eq!(s.data_blocks_used, s.chunks_stored, "one block per chunk");
        assert_eq!(
            s.physical_bytes_used + s.physical_bytes_free,
            s.physical_size
        );
    }
}

/// The model suite: `SEEDS` sequences of `OPS` random steps each, on data
/// devices from much smaller than the logical size (ENOSPC) to roomy. A
/// failure reports the seed and every step up to the failing one.
fn conformance(build: Build, verify: bool) {
    for seed in 0..SEEDS {
        let mut rng = StdRng::seed_from_u64(seed);
        let physical_chunks = [5, 10, 24][seed as usize % 3];
        let cfg = config(physical_chunks, verify);
        let mut images = vec![vec![0u8; CS]];
        images
            .extend((1..PATTERNS as u64).map(|p| dedup_core::testdata::noise(p * 0x9abc_def1, CS)));
        let mut h = Harness {
            dev: device(&cfg, build),
            model: vec![0; SIZE as usize],
            images,
            physical_chunks,
        };
        let mut done = Vec::new();
        let run = catch_unwind(AssertUnwindSafe(|| {
            for _ in 0..OPS {
                let op = random_op(&mut rng);
                done.push(op.clone());
                h.step(&op);
            }
            let mut all = vec![0u8; SIZE as usize];
            h.dev.read(0, &mut all).unwrap();
            assert!(all == h.model, "the whole device differs from the model");
            h.dev.close().unwrap();
        }));
        if let Err(panic) = run {
            eprintln!("seams: failed with seed {seed} (physical_chunks {physical_chunks}, verify {verify}) at step {} of:", done.len());
            for (i, op) in done.iter().enumerate() {
                eprintln!("  {i:3}: {op:?}");
            }
            resume_unwind(panic);
        }
    }
}

#[test]
fn skeleton_store_passes_the_conformance_model() {
    conformance(
        |cfg, data| {
            (
                Box::new(Skeleton::new(cfg)),
                Box::new(Plain::new(cfg, data, false)),
            )
        },
        false,
    );
}

#[test]
fn skeleton_placement_passes_the_conformance_model() {
    conformance(
        |cfg, data| {
            (
                Box::new(Skeleton::new(cfg)),
                Box::new(SkeletonPlacement::new(cfg, data)),
            )
        },
        false,
    );
}

/// Verify mode reads the stored chunk on every fingerprint hit: the
/// placement's `read` of whole chunks, on the write path.
#[test]
fn skeleton_placement_passes_the_conformance_model_with_verify() {
    conformance(
        |cfg, data| {
            (
                Box::new(Skeleton::new(cfg)),
                Box::new(SkeletonPlacement::new(cfg, data)),
            )
        },
        true,
    );
}

/// The store's own contract, called directly as the engine would: what it
/// must refuse (and with which error), allocation, and paged scans.
#[test]
fn skeleton_store_keeps_the_trait_contract() {
    use dedup_core::backend::{scan_all, ScanCursor};
    use dedup_core::fingerprint::Fingerprint;

    let cfg = config(4, false);
    let mut s = Skeleton::new(&cfg);
    let corrupt = |r: dedup_core::Result<u32>| matches!(r, Err(Error::Corrupt { .. }));
    assert!(
        corrupt(s.refcount_dec(0)),
        "dropping a reference from a free PBN"
    );
    assert!(
        corrupt(s.refcount_inc(0)),
        "adding a reference to a free PBN"
    );
    assert!(corrupt(s.refcount_get(4)), "a PBN beyond the data device");
    assert!(matches!(
        s.lbn_map_lookup(LOGICAL_CHUNKS),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        s.lbn_map_insert(LOGICAL_CHUNKS, 0),
        Err(Error::InvalidArgument(_))
    ));

    // Sequential allocation, count 1 each, until full; a freed PBN comes back.
    let pbns: Vec<_> = (0..4).map(|_| s.alloc_pbn().unwrap().unwrap()).collect();
    assert_eq!(pbns, [0, 1, 2, 3]);
    assert_eq!(s.alloc_pbn().unwrap(), None);
    assert_eq!(s.refcount_inc(2).unwrap(), 2);
    assert_eq!(s.refcount_dec(2).unwrap(), 1);
    assert_eq!(s.refcount_dec(2).unwrap(), 0);
    assert_eq!((s.usage().pbns_used, s.usage().pbns_free), (3, 1));
    assert_eq!(s.alloc_pbn().unwrap(), Some(2));
    s.refcount_set(3, 0).unwrap();
    s.refcount_set(3, 5).unwrap();
    assert_eq!((s.refcount_get(3).unwrap(), s.usage().pbns_used), (5, 4));

    // Mappings and index entries, read back through scans a page at a time.
    for lbn in 0..LOGICAL_CHUNKS {
        assert_eq!(s.lbn_map_insert(lbn, lbn % 4).unwrap(), None);
        s.hash_index_insert(&Fingerprint([lbn as u8; 32]), lbn % 4)
            .unwrap();
    }
    assert_eq!(s.lbn_map_insert(3, 1).unwrap(), Some(3));
    assert_eq!(s.lbn_map_delete(3).unwrap(), Some(1));
    assert_eq!(s.lbn_map_delete(3).unwrap(), None);
    assert!(matches!(
        s.hash_index_insert(&Fingerprint([1; 32]), 2),
        Err(Error::Corrupt { .. })
    ));
    let mut lbns = Vec::new();
    scan_all(
        |c, page| s.lbn_map_scan(c, 3, page),
        |lbn, _| {
            lbns.push(lbn);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(
        lbns,
        (0..LOGICAL_CHUNKS).filter(|&l| l != 3).collect::<Vec<_>>()
    );
    // Deleting behind and ahead of a scan's cursor loses no other entry.
    let mut seen = Vec::new();
    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = s.hash_index_scan(&c, 5, &mut page).unwrap();
        for (fp, _) in &page {
            seen.push(fp.0[0]);
            if fp.0[0] == 6 {
                assert!(s.hash_index_delete(&Fingerprint([2; 32]), 2).unwrap());
                assert!(!s.hash_index_delete(&Fingerprint([12; 32]), 1).unwrap());
                assert!(s.hash_index_delete(&Fingerprint([12; 32]), 0).unwrap());
            }
        }
    }
    let expect: Vec<u8> = (0..LOGICAL_CHUNKS as u8).filter(|&b| b != 12).collect();
    assert_eq!(seen, expect);
    assert!(!s.hash_index_delete(&Fingerprint([12; 32]), 0).unwrap());

    s.commit(&[7, 8]).unwrap();
    assert_eq!(s.private_data(), [7, 8]);
    s.close(&[9]).unwrap();
    assert_eq!(s.private_data(), [9]);
}

/// The metadata seam is the 18 methods its documentation promises
/// (`backend.rs`, docs/ARCHITECTURE.md): what only some stores do (give
/// back a reserve, warm a sampled index, name damaged table blocks) is the
/// `Upkeep` trait's, with defaults, so a new store writes 18 methods.
#[test]
fn the_metadata_seam_has_the_18_methods_its_docs_promise() {
    let src = include_str!("../../src/backend.rs");
    let start = src
        .find("pub trait MetadataBackend")
        .expect("backend.rs declares the seam");
    let body = &src[start..];
    let end = body.find("\n}\n").expect("the trait ends");
    let methods: Vec<&str> = body[..end]
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("fn "))
        .map(|l| l.split(['(', '<']).next().unwrap_or(l))
        .collect();
    assert_eq!(methods.len(), 18, "MetadataBackend: {methods:?}");
    assert!(src.contains("The metadata store: 18 methods."));
    let architecture = include_str!("../../../../docs/ARCHITECTURE.md");
    assert!(architecture.contains("18 methods"));
}
