//! A table block that fails its checksum (issue 16), on the stores that
//! keep 4 KiB checksummed table blocks (sparse, disktable): serving refuses
//! it naming the table and the block; `check` reports it; `repair` rebuilds
//! what can be derived (counts, summaries, fingerprints) and unmaps only
//! the LBNs a damaged LBN-map block held, naming them. Every other block
//! reads as a plain in-memory disk says.

use std::collections::HashMap;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backends::disktable::geometry::{Geometry as DiskGeometry, BLOCK};
use crate::backends::sparse::geometry::Geometry as SparseGeometry;
use crate::blockfile::BlockFile;
use crate::compress::Compression;
use crate::config::{DeviceConfig, Lbn};
use crate::engine::{Device, ProblemKind};
use crate::error::{Error, Result};
use crate::fingerprint::HashAlgo;
use crate::options::OpenOptions;
use crate::testrig::MemDevice;

const CS: usize = 4096;
/// Enough LBNs for several LBN-map blocks (511 LBNs each).
const LBNS: u64 = 1600;

/// The tables a damaged block can be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Table {
    LbnMap,
    Refcounts,
    /// sparse: the chunk records; disktable: the hash index.
    Fingerprints,
    /// sparse only.
    RefcountSummary,
    LbnSummary,
}

/// The crate's in-memory device, with what damages its tables.
struct Rig {
    md: MemDevice,
}

impl Rig {
    fn new(backend: &str, compression: Compression) -> Rig {
        let cfg = DeviceConfig {
            uuid: [16; 16],
            backend: backend.into(),
            chunk_size: CS as u32,
            hash: HashAlgo::Blake3,
            verify: false,
            logical_size: LBNS * CS as u64,
            physical_chunks: 1400,
            compression,
        };
        Rig {
            md: MemDevice::format(cfg, &Default::default()),
        }
    }

    fn open_with(&self, writable: bool, for_check: bool) -> Result<Device> {
        self.md.open_opts(OpenOptions {
            writable,
            for_check,
            ..self.md.options()
        })
    }

    /// Where each table's blocks are: (first block, blocks), and where the
    /// table blocks start on the metadata device.
    fn table(&self, t: Table) -> (u64, u64, u64) {
        if self.md.cfg.backend == "sparse" {
            let g = SparseGeometry::new(&self.md.cfg);
            let (first, n) = match t {
                Table::LbnMap => (g.lbn(0).0, g.lbn_blocks),
                Table::Refcounts => (g.refcount(0).0, g.ref_blocks),
                Table::Fingerprints => (g.record(0).0, g.record_blocks),
                Table::RefcountSummary => (g.summary(0).0, g.summary_blocks),
                Table::LbnSummary => (g.lbn_summary(0).0, g.lbn_summary_blocks),
            };
            (first, n, g.table_start())
        } else {
            let g = DiskGeometry::new(&self.md.cfg);
            let (first, n) = match t {
                Table::LbnMap => (g.lbn(0).0, g.lbn_blocks),
                Table::Refcounts => (g.refcount(0).0, g.ref_blocks),
                Table::Fingerprints => (g.slot(0).0, g.hash_blocks),
                _ => unreachable!("disktable keeps no summaries"),
            };
            (first, n, g.table_start())
        }
    }

    /// Flip one payload byte of a block of `t` that holds something;
    /// returns the block number and its index in its table.
    fn damage(&self, t: Table, pick: u64, byte: usize) -> (u64, u64) {
        let (first, n, start) = self.table(t);
        let mut b = vec![0u8; BLOCK];
        let written: Vec<u64> = (0..n)
            .filter(|&i| {
                self.md
                    .meta
                    .read_at(&mut b, start + (first + i) * BLOCK as u64)
                    .unwrap();
                b.iter().any(|&x| x != 0)
            })
            .collect();
        assert!(!written.is_empty(), "{t:?}: no block written");
        let i = written[(pick % written.len() as u64) as usize];
        let at = start + (first + i) * BLOCK as u64 + 8 + (byte % (BLOCK - 8)) as u64;
        let mut one = [0u8];
        self.md.meta.read_at(&mut one, at).unwrap();
        self.md.meta.write_at(&[one[0] ^ 0x5a], at).unwrap();
        (first + i, i)
    }
}

fn content(seed: u16) -> Vec<u8> {
    // Runs of equal bytes: lz4 packs several chunks into a block.
    (0..CS)
        .map(|i| ((i / 64) as u8).wrapping_mul(seed as u8 | 1) ^ (seed >> 8) as u8 ^ 0x11)
        .collect()
}

/// A random workload with duplicates, overwrites and discards; returns
/// what each LBN holds (absent: zeros).
fn workload(dev: &Device, seed: u64) -> HashMap<Lbn, u16> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = HashMap::new();
    for op in 0..2500 {
        let lbn = rng.random_range(0..LBNS);
        match rng.random_range(0..10) {
            0 => {
                let n = rng.random_range(1..8).min(LBNS - lbn);
                dev.discard(lbn * CS as u64, n * CS as u64, false).unwrap();
                for l in lbn..lbn + n {
                    model.remove(&l);
                }
            }
            _ => {
                // Few contents, so most writes are duplicates.
                let c = rng.random_range(0..400u16);
                dev.write(lbn * CS as u64, &content(c), false).unwrap();
                model.insert(lbn, c);
            }
        }
        if op % 300 == 299 {
            dev.flush().unwrap();
        }
    }
    model
}

/// Serving refuses the damage: at open, or when the block is first read
/// (sparse reads its tables as it needs them). The message names the table
/// and the block and says what to run.
fn assert_refused(rig: &Rig, table_name: &str, block: u64) {
    let err = match rig.open_with(true, false) {
        Err(e) => e,
        Ok(dev) => {
            let mut b = vec![0u8; CS];
            let read_all = (0..LBNS).try_for_each(|l| dev.read(l * CS as u64, &mut b));
            let e = match read_all.and_then(|_| dev.check(false)) {
                Err(e) => e,
                Ok(r) => panic!("damage in {table_name} went unnoticed: {:#?}", r.problems),
            };
            drop(dev); // not closed: nothing of the damage is written back
            e
        }
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
    assert!(msg.contains(table_name), "{msg}");
    assert!(msg.contains(&format!("block {block} ")), "{msg}");
    assert!(msg.contains("dedup check --repair"), "{msg}");
}

fn table_name(backend: &str, t: Table) -> &'static str {
    match (backend, t) {
        ("sparse", Table::LbnMap) => "sparse LBN map",
        ("sparse", Table::Refcounts) => "sparse refcount array",
        ("sparse", Table::Fingerprints) => "sparse chunk records",
        ("sparse", Table::RefcountSummary) => "sparse refcount summary",
        ("sparse", Table::LbnSummary) => "sparse LBN summary",
        (_, Table::LbnMap) => "disktable LBN map",
        (_, Table::Refcounts) => "disktable refcount array",
        (_, Table::Fingerprints) => "disktable hash index",
        _ => unreachable!(),
    }
}

/// Damage one block of `t`, then: refused to serve, reported by check,
/// repaired; the repaired device opens, checks clean, reads as the model
/// (the LBNs of a damaged LBN-map block read as zeros, and are exactly the
/// range the repair names).
fn damage_and_repair(
    backend: &str,
    compression: Compression,
    t: Table,
    seed: u64,
    pick: u64,
    byte: usize,
) {
    let what = format!("{backend} {compression} {t:?} seed {seed} pick {pick} byte {byte}");
    let rig = Rig::new(backend, compression);
    let dev = rig.open_with(true, false).unwrap();
    let model = workload(&dev, seed);
    dev.close().unwrap();
    drop(dev);
    let (block, index) = rig.damage(t, pick, byte);
    let name = table_name(backend, t);

    assert_refused(&rig, name, block);

    // `check` (read-only) reports the damage instead of failing.
    let dev = rig
        .open_with(false, true)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let report = dev.check(false).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::DamagedBlock
                && p.detail.contains(name)
                && p.detail.contains(&format!("block {block} "))),
        "{what}: {:#?}",
        report.problems
    );
    drop(dev);

    let dev = rig
        .open_with(true, true)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let (before, repaired) = dev.repair(false).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(!before.is_clean(), "{what}");
    dev.close().unwrap();
    drop(dev);
    let lost: Vec<std::ops::Range<Lbn>> = match t {
        Table::LbnMap => {
            let r = index * 511..((index + 1) * 511).min(LBNS);
            vec![r]
        }
        _ => Vec::new(),
    };
    let named: Vec<std::ops::Range<Lbn>> = repaired
        .lost
        .iter()
        .map(|l| l.first_lbn..l.last_lbn + 1)
        .collect();
    assert_eq!(named, lost, "{what}: {repaired:?}");
    for l in &repaired.lost {
        assert_eq!(l.offset, l.first_lbn * CS as u64, "{what}");
        assert_eq!(
            l.length,
            (l.last_lbn + 1 - l.first_lbn) * CS as u64,
            "{what}"
        );
    }

    let dev = rig
        .open_with(true, false)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let after = dev.check(true).unwrap();
    assert!(after.is_clean(), "{what}: {:#?}", after.problems);
    let mut b = vec![0u8; CS];
    for l in 0..LBNS {
        dev.read(l * CS as u64, &mut b).unwrap();
        let want = match model.get(&l) {
            Some(&c) if !lost.iter().any(|r| r.contains(&l)) => content(c),
            _ => vec![0u8; CS],
        };
        assert!(b == want, "{what}: LBN {l} reads wrong after the repair");
    }
    // It deduplicates and serves on: a copy of a surviving chunk shares it.
    if let Some((&l, &c)) = model
        .iter()
        .find(|(l, _)| !lost.iter().any(|r| r.contains(l)))
    {
        let spare = (0..LBNS).find(|x| !model.contains_key(x)).unwrap();
        dev.write(spare * CS as u64, &content(c), true).unwrap();
        assert_eq!(
            dev.inspect_lbn(spare).unwrap().map(|m| m.0),
            dev.inspect_lbn(l).unwrap().map(|m| m.0),
            "{what}: a rebuilt fingerprint no longer deduplicates"
        );
    }
    assert!(dev.check(true).unwrap().is_clean(), "{what}");
    dev.close().unwrap();
}

fn cases() -> Vec<(&'static str, Compression, Table)> {
    let mut v = Vec::new();
    for compression in [Compression::None, Compression::Lz4] {
        for t in [
            Table::LbnMap,
            Table::Refcounts,
            Table::Fingerprints,
            Table::RefcountSummary,
            Table::LbnSummary,
        ] {
            v.push(("sparse", compression, t));
        }
    }
    for t in [Table::LbnMap, Table::Refcounts, Table::Fingerprints] {
        v.push(("disktable", Compression::None, t));
    }
    v
}

/// A damaged refcount block is refused when the device opens to serve,
/// not when a write first needs it: with write-back, that write would
/// already have been acknowledged and could then only be dropped.
#[test]
fn a_damaged_refcount_block_is_refused_at_open_before_any_write_is_acknowledged() {
    for compression in [Compression::None, Compression::Lz4] {
        let rig = Rig::new("sparse", compression);
        let dev = rig.open_with(true, false).unwrap();
        workload(&dev, 3);
        dev.close().unwrap();
        drop(dev);
        let (block, _) = rig.damage(Table::Refcounts, 0, 700);
        let err = match rig.open_with(true, false) {
            Err(e) => e,
            Ok(_) => panic!("{compression}: opened to serve with refcount block {block} damaged"),
        };
        let msg = err.to_string();
        assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
        assert!(
            msg.contains("sparse refcount array") && msg.contains(&format!("block {block} ")),
            "{msg}"
        );
        assert!(msg.contains("dedup check --repair"), "{msg}");
        // Inspection still opens, to report it.
        drop(rig.open_with(false, true).unwrap());
    }
}

#[test]
fn a_damaged_table_block_is_refused_reported_and_repaired() {
    for (backend, compression, t) in cases() {
        damage_and_repair(backend, compression, t, 7, 1, 1000);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any written block of any table, any byte of it.
    #[test]
    fn damage_anywhere_in_a_table_is_repaired(
        case in 0..13usize,
        seed in 0..1000u64,
        pick in 0..64u64,
        byte in 0..BLOCK,
    ) {
        let (backend, compression, t) = cases()[case];
        damage_and_repair(backend, compression, t, seed, pick, byte);
    }
}

/// A block that held entries once and none now (the summaries call it
/// empty, so nothing reads it at open) is still found by check, where the
/// file tells which blocks were ever written, and rewritten by repair.
#[test]
fn a_damaged_block_emptied_since_it_was_written_is_found_and_rewritten() {
    let rig = Rig::new("sparse", Compression::None);
    let dev = rig.open_with(true, false).unwrap();
    dev.write(0, &content(1), false).unwrap();
    dev.write(600 * CS as u64, &content(2), false).unwrap();
    dev.flush().unwrap();
    dev.discard(600 * CS as u64, CS as u64, false).unwrap();
    dev.close().unwrap();
    drop(dev);
    let (block, index) = rig.damage(Table::LbnMap, 1, 7);
    assert_eq!(index, 1, "the second LBN-map block, empty now");

    let dev = rig.open_with(true, false).unwrap();
    let err = dev.write(600 * CS as u64, &content(3), false).unwrap_err();
    assert!(err.to_string().contains("dedup check --repair"), "{err}");
    drop(dev);

    let dev = rig.open_with(false, true).unwrap();
    let report = dev.check(false).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.kind == ProblemKind::DamagedBlock
                && p.detail.contains(&format!("block {block} "))),
        "{:#?}",
        report.problems
    );
    drop(dev);
    let dev = rig.open_with(true, true).unwrap();
    dev.repair(false).unwrap();
    dev.close().unwrap();
    drop(dev);

    let dev = rig.open_with(true, false).unwrap();
    dev.write(600 * CS as u64, &content(3), false).unwrap();
    let mut b = vec![0u8; CS];
    dev.read(600 * CS as u64, &mut b).unwrap();
    assert_eq!(b, content(3));
    dev.read(0, &mut b).unwrap();
    assert_eq!(b, content(1));
    assert!(dev.check(true).unwrap().is_clean());
    dev.close().unwrap();
}
