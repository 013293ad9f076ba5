//! Corrupt metadata, for every backend: flip bits across the metadata
//! device (every structure: superblock slots, tables, journal, B-tree pages;
//! for lsm, its files too). Opening must never panic; it either refuses with
//! an error, or the device opens and `check` reports the damage, or the flip
//! hit bytes nothing uses and every chunk reads back exactly as written.
//! Wrong data served while `check` is clean fails the test.

use crate::common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dedup_core::backends::OpenOptions;
use dedup_core::blockfile::sim::SimDisk;
use dedup_core::blockfile::{BlockFile, MemBlockFile};
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{Device, Error};
use rand::{Rng, SeedableRng};

const CHUNKS: u64 = 48;

fn open(data: Arc<MemBlockFile>, meta: Arc<SimDisk>, aux: &Path) -> dedup_core::Result<Device> {
    let opts = OpenOptions {
        writable: true,
        aux_dir: Some(common::lsm_dir(aux)),
        ..Default::default()
    };
    Device::open(
        Box::new(data) as Box<dyn BlockFile>,
        Box::new(meta),
        &opts,
        None,
    )
}

#[derive(Default, Debug)]
struct Tally {
    refused: u32,
    found: u32,
    harmless: u32,
}

/// Open damaged metadata and classify the outcome; panics on a violation.
fn try_damaged(built: &common::Image, meta: Vec<u8>, aux: &Path, what: &str, tally: &mut Tally) {
    let data = Arc::new(MemBlockFile::from_bytes(built.data.clone(), "data"));
    let meta = Arc::new(SimDisk::from_image(meta, "meta", Arc::default()));
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), Error> {
        let dev = open(data, meta, aux)?;
        let report = dev.check(true)?;
        if !report.is_clean() {
            tally.found += 1;
            return Ok(());
        }
        let mut got = vec![0u8; built.contents.len()];
        dev.read(0, &mut got)?;
        assert!(
            got == built.contents,
            "{what}: check is clean but the device serves wrong data"
        );
        tally.harmless += 1;
        Ok(())
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            assert!(!e.to_string().is_empty());
            tally.refused += 1;
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            files(&e.path(), out);
        } else if e.metadata().unwrap().len() > 0 {
            out.push(e.path());
        }
    }
}

fn corruption_suite(backend: &str) {
    let built = common::image(backend, CHUNKS, CHUNKS, HashAlgo::Sha256);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xc0ffee);
    let mut tally = Tally::default();
    let len = built.meta.len();
    // The first bytes of every 4 KiB block, then random places.
    let mut spots: Vec<usize> = (0..len)
        .step_by(4096)
        .flat_map(|b| [b, b + 8, b + 64])
        .collect();
    spots.extend((0..300).map(|_| rng.random_range(0..len)));
    for spot in spots.into_iter().filter(|&s| s < len) {
        let mut meta = built.meta.clone();
        meta[spot] ^= 1 << rng.random_range(0..8);
        let aux = tempfile::tempdir().unwrap();
        common::copy_dir(built.aux.path(), aux.path());
        try_damaged(
            &built,
            meta,
            aux.path(),
            &format!("{backend}: metadata byte {spot}"),
            &mut tally,
        );
    }
    if backend == "lsm" {
        let mut paths = Vec::new();
        files(built.aux.path(), &mut paths);
        for path in paths {
            let rel = path.strip_prefix(built.aux.path()).unwrap().to_path_buf();
            let size = std::fs::metadata(&path).unwrap().len() as usize;
            for _ in 0..20 {
                let aux = tempfile::tempdir().unwrap();
                common::copy_dir(built.aux.path(), aux.path());
                let victim = aux.path().join(&rel);
                let mut bytes = std::fs::read(&victim).unwrap();
                let at = rng.random_range(0..size);
                bytes[at] ^= 1 << rng.random_range(0..8);
                std::fs::write(&victim, bytes).unwrap();
                try_damaged(
                    &built,
                    built.meta.clone(),
                    aux.path(),
                    &format!("lsm: {} byte {at}", rel.display()),
                    &mut tally,
                );
            }
        }
    }
    eprintln!("{backend}: {tally:?}");
    assert!(
        tally.refused + tally.found > 0,
        "{backend}: no damage was ever noticed"
    );
}

#[test]
fn sparse_refuses_or_reports_damaged_metadata() {
    corruption_suite("sparse");
}

#[test]
fn inram_refuses_or_reports_damaged_metadata() {
    corruption_suite("inram");
}

#[test]
fn disktable_refuses_or_reports_damaged_metadata() {
    corruption_suite("disktable");
}

#[test]
fn cowbtree_refuses_or_reports_damaged_metadata() {
    corruption_suite("cowbtree");
}

#[test]
fn lsm_refuses_or_reports_damaged_metadata() {
    corruption_suite("lsm");
}
