//! A copy of the metadata taken while the device is served (`cp meta
//! meta.live`), put back after a crash (kill -9): the copy carries the live
//! file's generation, so only the commit number the data device records
//! after every commit (`generation.rs`) tells it from the metadata that
//! belongs with the data. Random writes, trims, flushes and online
//! collections run against a plain in-memory model; copies are taken at
//! random points; after the crash each copy is put back on its own. A copy
//! that a FLUSH committed after must never be served (it lacks writes that
//! FLUSH made durable); a FLUSH with no write since the last commit commits
//! nothing (group commit), so the copy is still the device's metadata. A
//! copy served must read, block for block, what the model says.

use crate::common;

use std::sync::Arc;

use common::{MemDevice, ModelDisk, Patterns};
use dedup_core::blockfile::sim::{splitmix, SimDisk};
use dedup_core::blockfile::MemBlockFile;
use dedup_core::{Device, Error};

const CS: usize = 4096;
const CHUNKS: u64 = 64;

struct Copy {
    meta: Vec<u8>,
    /// FLUSHes that committed before the copy was taken.
    flushes_before: usize,
}

/// What the device must hold after the crash: the model at the last
/// successful FLUSH, except that a block written since may also read any
/// value written to it since (a commit the store made on its own).
struct Expected {
    at_flush: Vec<u8>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Expected {
    fn allows(&self, lbn: usize, got: &[u8]) -> bool {
        got == &self.at_flush[lbn * CS..(lbn + 1) * CS] || self.since[lbn].iter().any(|v| v == got)
    }
}

fn open_on(md: &MemDevice, data: &Arc<MemBlockFile>, meta: Vec<u8>) -> dedup_core::Result<Device> {
    let meta = Arc::new(SimDisk::from_image(meta, "meta", Arc::default()));
    md.open_stale(data.clone(), meta, false)
}

fn format(variant: &str) -> MemDevice {
    common::variant_device(variant, CS as u32, CHUNKS, CHUNKS * 2)
}

/// One random life of a served device, then every copy put back.
fn run(variant: &str, seed: u64) {
    let mut next = splitmix(seed);
    let md = format(variant);
    let p = Patterns::new(9, CS);
    let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
    let mut expected = Expected {
        at_flush: model.bytes.clone(),
        since: vec![Vec::new(); CHUNKS as usize],
    };
    let mut copies = Vec::new();
    let mut flushes = 0;
    let dev = md.open().unwrap();
    for _ in 0..120 {
        let lbn = next() % CHUNKS;
        match next() % 16 {
            0..=7 => {
                let bytes = p.chunk(1 + (next() % 8) as usize);
                dev.write(lbn * CS as u64, bytes, false).unwrap();
                model.write(lbn * CS as u64, bytes);
                expected.since[lbn as usize].push(bytes.to_vec());
            }
            8 => {
                dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
                model.zero(lbn * CS as u64, CS as u64);
                expected.since[lbn as usize].push(vec![0; CS]);
            }
            9..=11 => {
                let commits = dev.stats().counters.commits;
                dev.flush().unwrap();
                if dev.stats().counters.commits > commits {
                    flushes += 1;
                }
                expected.at_flush = model.bytes.clone();
                expected.since.iter_mut().for_each(Vec::clear);
            }
            12 => {
                dev.gc().unwrap();
            }
            _ => copies.push(Copy {
                meta: md.meta.contents(),
                flushes_before: flushes,
            }),
        }
    }
    // kill -9: nothing more reaches either file; what was written stays.
    drop(dev);
    let data_after_crash = md.data.snapshot();

    let live = Arc::new(MemBlockFile::from_bytes(data_after_crash.clone(), "data"));
    let dev = open_on(&md, &live, md.meta.contents())
        .unwrap_or_else(|e| panic!("{variant} seed {seed}: the live metadata must open: {e}"));
    check_content(
        &dev,
        &expected,
        &format!("{variant} seed {seed}, live metadata"),
    );
    drop(dev);

    let mut kept_one = false;
    for (i, c) in copies.into_iter().enumerate() {
        let what = format!("{variant} seed {seed}, copy {i}");
        let data = Arc::new(MemBlockFile::from_bytes(data_after_crash.clone(), "data"));
        match open_on(&md, &data, c.meta.clone()) {
            Err(Error::StaleCommit { .. } | Error::Stale { .. }) if !kept_one => {
                // Kept as asked: every chunk verified, then it is the
                // device's metadata and opens as such.
                kept_one = true;
                let meta = Arc::new(SimDisk::from_image(c.meta, "meta", Arc::default()));
                let dev = md
                    .open_stale(data.clone(), meta.clone(), true)
                    .unwrap_or_else(|e| panic!("{what}: kept as asked: {e}"));
                let report = dev.check(true).unwrap();
                assert!(report.is_clean(), "{what}: {:#?}", report.problems);
                dev.close().unwrap();
                drop(
                    md.open_stale(data.clone(), meta, false)
                        .unwrap_or_else(|e| panic!("{what}: {e}")),
                );
            }
            Err(Error::StaleCommit { .. } | Error::Stale { .. }) => {}
            Err(e) => panic!("{what}: refused, but not as stale: {e}"),
            Ok(dev) => {
                assert!(
                    c.flushes_before == flushes,
                    "{what}: served, though {} FLUSHes committed after it was taken",
                    flushes - c.flushes_before
                );
                check_content(&dev, &expected, &what);
            }
        }
    }
}

fn check_content(dev: &Device, expected: &Expected, what: &str) {
    let got = common::read_all(dev);
    for (lbn, g) in got.chunks(CS).enumerate() {
        assert!(
            expected.allows(lbn, g),
            "{what}: LBN {lbn} lost a write that a FLUSH made durable"
        );
    }
}

#[test]
fn a_metadata_copy_taken_while_serving_is_never_served_after_a_crash() {
    for variant in ["sparse", "sparse/lz4", "disktable"] {
        for seed in 0..12 {
            run(variant, seed);
        }
    }
}

/// The data's record must not refuse the metadata that belongs with it:
/// after a crash at any commit, with the record written or not (a power
/// cut may lose it), and after a clean stop, the device opens.
#[test]
fn the_metadata_that_belongs_with_the_data_always_opens() {
    for variant in ["sparse", "disktable"] {
        let md = format(variant);
        let p = Patterns::new(5, CS);
        for round in 0..6u64 {
            let dev = md.open().unwrap();
            let before = md.data.snapshot();
            for lbn in 0..8 {
                dev.write(
                    (round * 8 + lbn) * CS as u64,
                    p.chunk(1 + (lbn % 4) as usize),
                    false,
                )
                .unwrap();
                dev.flush().unwrap();
            }
            if round % 2 == 0 {
                dev.close().unwrap();
            } else {
                drop(dev);
                // The record of the last commit lost, as a power cut may:
                // the older record must still accept this metadata.
                let data = Arc::new(MemBlockFile::from_bytes(before, "data"));
                drop(open_on(&md, &data, md.meta.contents()).unwrap_or_else(|e| {
                    panic!("{variant} round {round}: refused with an older record: {e}")
                }));
            }
        }
        drop(md.open().unwrap());
    }
}
