//! Power-loss crash tests for the crash-safe backends. A seeded workload of
//! writes (aligned and not), trims, FUA writes, flushes and GC runs on
//! simulated disks whose power is cut at a chosen I/O operation. The disks
//! then keep what was synced plus a random subset of the writes since, some
//! torn at sector boundaries. The device must reopen on its own, every chunk
//! must hold its content as of the last flush or a content written after it
//! (never another chunk's bytes, never garbage), and `check` must be clean.
//!
//! Every failure names its backend, seed and cut point, so it can be
//! replayed with `DEDUP_CRASH_ONLY=backend:seed:cut` (exactly, except in
//! the "+wb" suites: their appliers make the order of I/Os depend on
//! timing, so a replay cuts near the same point, not always at it). `DEDUP_CRASH_SEEDS`
//! scales the run (default 40 seeds per backend).

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{ModelDisk, Patterns};
use dedup_core::backends::{BackendParams, OpenOptions};
use dedup_core::blockfile::sim::{PowerSwitch, SimDisk};
use dedup_core::blockfile::BlockFile;
use dedup_core::config::DeviceConfig;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::registry;
use dedup_core::superblock::SUPERBLOCK_AREA;
use dedup_core::{Device, Error};
use rand::{Rng, SeedableRng};

const CS: usize = 4096;
const CHUNKS: u64 = 24;
const OPS: usize = 70;
const CUTS_PER_SEED: u64 = 50;

#[derive(Clone, Debug)]
enum Op {
    Write {
        offset: u64,
        len: usize,
        pattern: usize,
        fua: bool,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    Flush,
    Gc,
}

fn workload(seed: u64) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let size = CHUNKS * CS as u64;
    (0..OPS)
        .map(|_| match rng.random_range(0..20) {
            0..=9 => {
                let lbn = rng.random_range(0..CHUNKS);
                let n = rng.random_range(1..=4).min(CHUNKS - lbn);
                Op::Write {
                    offset: lbn * CS as u64,
                    len: n as usize * CS,
                    pattern: rng.random_range(0..6),
                    fua: rng.random_bool(0.1),
                }
            }
            10..=13 => {
                let offset = rng.random_range(0..size - 1);
                let len = rng.random_range(1..=(size - offset).min(3 * CS as u64)) as usize;
                Op::Write {
                    offset,
                    len,
                    pattern: rng.random_range(0..6),
                    fua: false,
                }
            }
            14..=15 => {
                let offset = rng.random_range(0..size - 1);
                Op::Trim {
                    offset,
                    len: rng.random_range(1..=(size - offset).min(2 * CS as u64)),
                }
            }
            16..=18 => Op::Flush,
            _ => Op::Gc,
        })
        .collect()
}

struct Disks {
    cfg: DeviceConfig,
    data: Arc<SimDisk>,
    meta: Arc<SimDisk>,
}

fn open(data: Arc<SimDisk>, meta: Arc<SimDisk>) -> dedup_core::Result<Device> {
    open_with(data, meta, 0)
}

/// `write_back`: the write-back queue's size (0: off).
fn open_with(
    data: Arc<SimDisk>,
    meta: Arc<SimDisk>,
    write_back: u64,
) -> dedup_core::Result<Device> {
    let opts = OpenOptions {
        writable: true,
        write_back_bytes: write_back,
        ..Default::default()
    };
    Device::open(
        Box::new(data) as Box<dyn BlockFile>,
        Box::new(meta),
        &opts,
        None,
    )
}

fn format(backend: &str, power: Arc<PowerSwitch>, txn_writes: u64) -> Disks {
    format_chunks(backend, power, txn_writes, CHUNKS)
}

/// `format` of a device of `chunks` chunks.
fn format_chunks(backend: &str, power: Arc<PowerSwitch>, txn_writes: u64, chunks: u64) -> Disks {
    let cfg = common::config(
        backend,
        CS as u32,
        chunks,
        chunks + 8,
        HashAlgo::Blake3,
        false,
    );
    // Format on reliable disks, then move the images under the power switch.
    let data = SimDisk::new(cfg.data_device_len(), "data", Arc::default());
    let meta = Arc::new(SimDisk::new(
        registry::metadata_device_len(&cfg).unwrap(),
        "meta",
        Arc::default(),
    ));
    let params = common::params(
        backend,
        BackendParams {
            txn_writes,
            ..BackendParams::default()
        },
    );
    Device::format(&cfg, &data, meta.clone(), &params, None).unwrap();
    Disks {
        data: Arc::new(SimDisk::from_image(data.contents(), "data", power.clone())),
        meta: Arc::new(SimDisk::from_image(meta.contents(), "meta", power)),
        cfg,
    }
}

/// What each chunk may hold after a crash: its content at the last flush
/// and every content written to it since.
struct Expect {
    model: ModelDisk,
    possible: Vec<HashSet<Vec<u8>>>,
}

impl Expect {
    fn new() -> Expect {
        Expect {
            model: ModelDisk::new(CHUNKS as usize * CS, CS),
            possible: vec![HashSet::from([vec![0u8; CS]]); CHUNKS as usize],
        }
    }

    fn settle(&mut self) {
        for (lbn, set) in self.possible.iter_mut().enumerate() {
            set.clear();
            set.insert(self.model.chunk(lbn).to_vec());
        }
    }

    /// Record a mutation before it runs: if power fails during it, any of
    /// its chunks may or may not have changed.
    fn apply(&mut self, offset: u64, len: u64, f: impl FnOnce(&mut ModelDisk)) {
        f(&mut self.model);
        for lbn in offset / CS as u64..(offset + len).div_ceil(CS as u64) {
            let c = self.model.chunk(lbn as usize).to_vec();
            self.possible[lbn as usize].insert(c);
        }
    }
}

/// Run `ops` until they finish or the power fails. Returns whether it failed.
fn run(dev: &Device, ops: &[Op], patterns: &Patterns, exp: &mut Expect) -> bool {
    for op in ops {
        let result = match *op {
            Op::Write {
                offset,
                len,
                pattern,
                fua,
            } => {
                let data = patterns.bytes(pattern, offset, len);
                exp.apply(offset, len as u64, |m| m.write(offset, &data));
                dev.write(offset, &data, fua).map(|_| fua)
            }
            Op::Trim { offset, len } => {
                exp.apply(offset, len, |m| m.zero(offset, len));
                dev.discard(offset, len, false).map(|_| false)
            }
            Op::Flush => dev.flush().map(|_| true),
            Op::Gc => dev.gc().map(|_| false),
        };
        match result {
            Ok(true) => exp.settle(),
            Ok(false) => {}
            Err(Error::NoSpace { .. }) => {
                panic!("the workload is sized never to fill the device")
            }
            Err(_) => return true,
        }
    }
    false
}

/// A suite's name: a variant of `common::VARIANTS`, with "+wb" for
/// write-back in front (a queue of a few writes).
fn variant(suite: &str) -> (&str, u64) {
    match suite.strip_suffix("+wb") {
        Some(backend) => (backend, 32 << 10),
        None => (suite, 0),
    }
}

/// One crash: cut the power at I/O `cut`, crash, reopen, verify.
fn crash_once(suite: &str, seed: u64, cut: u64, txn_writes: u64) {
    let at =
        format!("{suite}, seed {seed}, cut {cut} (replay: DEDUP_CRASH_ONLY={suite}:{seed}:{cut})");
    let (backend, write_back) = variant(suite);
    let power = PowerSwitch::cutting_at(cut);
    let disks = format(backend, power.clone(), txn_writes);
    let patterns = Patterns::new(6, CS);
    let mut exp = Expect::new();
    let ops = workload(seed);
    // The power may fail while the device opens, too.
    if let Ok(dev) = open_with(disks.data.clone(), disks.meta.clone(), write_back) {
        run(&dev, &ops, &patterns, &mut exp);
        power.cut();
        // Dropped with the power off: nothing more reaches the disks.
    }
    let mut images = rand::rngs::StdRng::seed_from_u64(seed ^ cut.rotate_left(32));
    let mut rng = || images.random::<u64>();
    let tear = cut % 2 == 0;
    let data = Arc::new(SimDisk::from_image(
        disks.data.crash_image(&mut rng, tear),
        "data",
        Arc::default(),
    ));
    let meta = Arc::new(SimDisk::from_image(
        disks.meta.crash_image(&mut rng, tear),
        "meta",
        Arc::default(),
    ));
    let dev = match open(data.clone(), meta.clone()) {
        Ok(d) => d,
        Err(e) => panic!("{at}: the device did not reopen after the crash: {e}"),
    };
    let got = common::read_all(&dev);
    for lbn in 0..CHUNKS as usize {
        let c = &got[lbn * CS..(lbn + 1) * CS];
        assert!(
            exp.possible[lbn].contains(c),
            "{at}: chunk {lbn} holds neither its content at the last flush nor one written after it"
        );
    }
    let report = dev.check(true).unwrap();
    assert!(
        report.is_clean(),
        "{at}: check after recovery: {:#?}",
        report.problems
    );
    // The recovered device keeps working and survives a clean restart.
    let more = patterns.bytes(5, 0, 2 * CS);
    dev.write(0, &more, true).unwrap();
    dev.close().unwrap();
    drop(dev);
    let dev = open(data, meta).unwrap();
    let mut back = vec![0u8; 2 * CS];
    dev.read(0, &mut back).unwrap();
    assert_eq!(back, more, "{at}: a write after recovery was lost");
    assert!(
        dev.check(true).unwrap().is_clean(),
        "{at}: check after restart"
    );
    let _ = disks.cfg;
}

/// I/O operations the whole workload performs (no crash).
fn ops_in_workload(suite: &str, seed: u64, txn_writes: u64) -> u64 {
    let (backend, write_back) = variant(suite);
    let power = Arc::new(PowerSwitch::default());
    let disks = format(backend, power.clone(), txn_writes);
    let dev = open_with(disks.data.clone(), disks.meta.clone(), write_back).unwrap();
    let failed = run(
        &dev,
        &workload(seed),
        &Patterns::new(6, CS),
        &mut Expect::new(),
    );
    assert!(!failed);
    if suite.ends_with("@64") {
        let ix = dev.stats().hash_index.expect("sparse reports its index");
        assert!(
            ix.sampling_period > 1,
            "{suite}: the index never sampled: {ix:?}"
        );
    }
    if write_back > 0 {
        let queued = dev.stats().counters.write_back_requests;
        assert!(queued > 0, "{suite}: no write went through the queue");
    }
    power.ops()
}

fn crash_suite(backend: &str) {
    if let Ok(only) = std::env::var("DEDUP_CRASH_ONLY") {
        let parts: Vec<&str> = only.split(':').collect();
        if parts[0] == backend {
            let (seed, cut) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
            crash_once(backend, seed, cut, seed % 4);
        }
        return;
    }
    let seeds: u64 = std::env::var("DEDUP_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let mut crashes = 0;
    for seed in 0..seeds {
        // Transaction lengths 0 (flush only), 1 (every write), 2, 3.
        let txn_writes = seed % 4;
        let total = ops_in_workload(backend, seed, txn_writes);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut cuts: Vec<u64> = (0..CUTS_PER_SEED)
            .map(|i| i * total / CUTS_PER_SEED)
            .collect();
        cuts.extend((0..CUTS_PER_SEED / 5).map(|_| rng.random_range(0..total)));
        for cut in cuts {
            crash_once(backend, seed, cut, txn_writes);
            crashes += 1;
        }
    }
    eprintln!("{backend}: {crashes} crash points verified");
}

#[test]
fn sparse_survives_power_cuts_at_any_io() {
    crash_suite("sparse");
}

#[test]
fn sparse_packing_lz4_survives_power_cuts_at_any_io() {
    crash_suite("sparse/lz4");
}

/// An index of 3 fingerprints: it samples, and misses most duplicates.
#[test]
fn sparse_with_a_sampling_index_survives_power_cuts_at_any_io() {
    crash_suite("sparse@64");
}

/// The index moves to its compact table (group hints) after 3 chunks.
#[test]
fn sparse_with_a_compact_index_survives_power_cuts_at_any_io() {
    crash_suite("sparse/lz4@41216");
}

#[test]
fn cowbtree_survives_power_cuts_at_any_io() {
    crash_suite("cowbtree");
}

#[test]
fn disktable_survives_power_cuts_at_any_io() {
    crash_suite("disktable");
}

#[test]
fn disktable_packing_lz4_survives_power_cuts_at_any_io() {
    crash_suite("disktable/lz4");
}

#[test]
fn cowbtree_packing_zstd_survives_power_cuts_at_any_io() {
    crash_suite("cowbtree/zstd");
}

/// Write-back in front: a FLUSH that returned covers every write queued
/// before it, and a cut loses only writes not yet flushed.
#[test]
fn disktable_packing_lz4_with_write_back_survives_power_cuts_at_any_io() {
    crash_suite("disktable/lz4+wb");
}

#[test]
fn cowbtree_with_write_back_survives_power_cuts_at_any_io() {
    crash_suite("cowbtree+wb");
}

#[test]
fn thin_survives_power_cuts_at_any_io() {
    crash_suite("thin");
}

#[test]
fn ordered_survives_power_cuts_at_any_io() {
    crash_suite("ordered");
}

/// thin at every I/O of ten workloads, not a sample of them: so every
/// write of a window, of a zone record and of a commit of the tables
/// (where the C-zones' entries become committed and freed chunks are
/// released, thin's refcount batch) is a cut point.
#[test]
fn thin_survives_a_power_cut_at_every_single_io() {
    let mut crashes = 0;
    for seed in 100..110 {
        let total = ops_in_workload("thin", seed, 0);
        for cut in 0..total {
            crash_once("thin", seed, cut, 0);
            crashes += 1;
        }
    }
    eprintln!("thin: {crashes} crash points verified, every I/O of 10 workloads");
}

/// Large enough that a small transaction touches few of the tables'
/// blocks, so its journal has room to list its data blocks (on the crash
/// suites' tiny devices a commit often rewrites every table block, and
/// then syncs the data first).
const LISTED_CHUNKS: u64 = 4096;

/// A FLUSH syncs the data beside the journal (`blockfile/written.rs`), so
/// a cut between the two can leave the journal durable and its data not.
/// Here every cut point of a FLUSH is tried, keeping the most metadata and
/// the least data a disk could: every unsynced metadata write, no unsynced
/// data write. The transaction must come back whole or not at all (its
/// blocks checked against the digests the journal lists), never as
/// mappings to data that is not there.
#[test]
fn a_journal_durable_without_its_data_is_dropped_whole() {
    for suite in ["sparse", "sparse/lz4", "disktable", "disktable/lz4"] {
        let patterns = Patterns::new(6, CS);
        let (a, b, a2) = (
            patterns.bytes(1, 0, CS),
            patterns.bytes(2, CS as u64, CS),
            patterns.bytes(3, 0, CS),
        );
        // Both writes go after a flush that made `a` durable. Sets
        // `flushed` once that flush returned.
        let scenario = |dev: &Device, flushed: &mut bool| -> dedup_core::Result<()> {
            dev.write(0, &a, false)?;
            dev.flush()?;
            *flushed = true;
            dev.write(CS as u64, &b, false)?;
            dev.write(0, &a2, false)?;
            dev.flush()
        };
        let probe = Arc::new(PowerSwitch::default());
        let disks = format_chunks(suite, probe.clone(), 0, LISTED_CHUNKS);
        let dev = open(disks.data.clone(), disks.meta.clone()).unwrap();
        let from = probe.ops();
        scenario(&dev, &mut false).unwrap();
        let total = probe.ops();
        drop(dev);
        // Both stores' journals start right after the superblock slots: a
        // listed journal's header is its magic, then its sequence number.
        let at_journal = SUPERBLOCK_AREA as usize;
        let header = |image: &[u8]| {
            let h = &image[at_journal..at_journal + 16];
            (
                h[..8] == *b"DDUPJRN2",
                u64::from_le_bytes(h[8..].try_into().unwrap()),
            )
        };
        let (_, last_flush) = header(&disks.meta.contents());
        let (mut old, mut new, mut dropped) = (0, 0, 0);
        for cut in from..total {
            let at = format!("{suite}, cut {cut}");
            let power = PowerSwitch::cutting_at(cut);
            let disks = format_chunks(suite, power.clone(), 0, LISTED_CHUNKS);
            let mut flushed = false;
            if let Ok(dev) = open(disks.data.clone(), disks.meta.clone()) {
                let _ = scenario(&dev, &mut flushed);
                power.cut();
            }
            let data = Arc::new(SimDisk::from_image(
                disks.data.crash_image(&mut || 0, false),
                "data",
                Arc::default(),
            ));
            let meta_image = disks.meta.crash_image(&mut || 1, false);
            // The second FLUSH's journal, listed, reached the disk.
            let listed = header(&meta_image) == (true, last_flush);
            let meta = Arc::new(SimDisk::from_image(meta_image, "meta", Arc::default()));
            let dev = open(data, meta.clone()).unwrap_or_else(|e| panic!("{at}: reopen: {e}"));
            let got = common::read_all(&dev);
            let (first, second) = (&got[..CS], &got[CS..2 * CS]);
            if first == &a2[..] && second == &b[..] {
                new += 1;
            } else {
                assert!(
                    second.iter().all(|&x| x == 0),
                    "{at}: chunk 1 holds neither nothing nor its write"
                );
                let before_first_flush = !flushed && first.iter().all(|&x| x == 0);
                assert!(
                    first == &a[..] || before_first_flush,
                    "{at}: chunk 0 holds neither its flushed content nor its write"
                );
                old += 1;
                if listed {
                    // Dropped, and cleared down to the commit before it.
                    assert_eq!(
                        header(&meta.contents()),
                        (false, last_flush - 1),
                        "{at}: the dropped journal was not cleared"
                    );
                    dropped += 1;
                }
            }
            let report = dev.check(true).unwrap();
            assert!(report.is_clean(), "{at}: check: {:#?}", report.problems);
        }
        assert!(
            old > 0 && new > 0 && dropped > 0,
            "{suite}: cuts gave {old} old and {new} new states, {dropped} listed journals dropped"
        );
    }
}
