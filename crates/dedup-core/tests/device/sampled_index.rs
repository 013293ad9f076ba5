//! The sparse store's hash index at a fraction of the memory a full index
//! needs (Guo & Efstathopoulos §3.2): on successive versions of a data set
//! (a workload with locality), deduplication must stay within what their
//! Eq. 2 predicts for the sampling period the budget forces, and every
//! chunk must read back right whatever the index missed.

use crate::common;

use std::sync::Arc;

use dedup_core::backends::sparse::index::{Grouping, SampledIndex, GROUP_BLOCKS};
use dedup_core::backends::sparse::predicted_efficiency;
use dedup_core::backends::{BackendParams, OpenOptions};
use dedup_core::blockfile::{BlockFile, FileBlockFile};
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{registry, Device};

const CS: usize = 4096;
/// An index of 5,836 fingerprints (24 KiB of compact table, beside one
/// group's prefetch).
const INDEX_MEMORY: u64 = 64 << 10;

#[test]
fn an_eighth_of_the_index_finds_what_eq_2_predicts_on_successive_versions() {
    // The compact table's capacity (the same for any PBN space whose
    // group numbers leave it a long enough tag, as this test's does).
    let full = SampledIndex::full_capacity(INDEX_MEMORY, Grouping::new(None, 1 << 30));
    // Eight times what the budget holds in full: the index samples 1 in 8
    // or so by the end of the first version.
    let n = 8 * full;
    let physical = 2 * n + dedup_core::engine::overwrite_reserve_chunks(CS as u32);
    let mut cfg = common::config(
        "sparse",
        CS as u32,
        2 * n,
        physical,
        HashAlgo::Blake3,
        false,
    );
    cfg.compression = dedup_core::compress::Compression::None;
    let dir = tempfile::tempdir().unwrap();
    let data =
        Arc::new(FileBlockFile::create(&dir.path().join("data"), cfg.data_device_len()).unwrap());
    let meta_len = registry::metadata_device_len(&cfg).unwrap();
    let meta = Arc::new(FileBlockFile::create(&dir.path().join("meta"), meta_len).unwrap());
    let params = BackendParams {
        index_memory: INDEX_MEMORY,
        ..Default::default()
    };
    Device::format(&cfg, data.as_ref(), meta.clone(), &params, None).unwrap();
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    let dev = Device::open(
        Box::new(data.clone()) as Box<dyn BlockFile>,
        Box::new(meta.clone()),
        &opts,
        None,
    )
    .unwrap();

    // Version 1: n unique chunks. Version 2, written after it: the same
    // data with one chunk in 50 changed.
    let v1 = dedup_core::testdata::noise(1, n as usize * CS);
    let mut v2 = v1.clone();
    let mut changed = 0u64;
    for c in (0..n as usize).step_by(50) {
        v2[c * CS..c * CS + 8].copy_from_slice(&(c as u64 + 1).to_le_bytes());
        v2[c * CS + 8] ^= 0xa5;
        changed += 1;
    }
    for (at, piece) in v1.chunks(1 << 20).enumerate() {
        dev.write((at << 20) as u64, piece, false).unwrap();
    }
    let before = dev.stats();
    let base = n * CS as u64;
    for (at, piece) in v2.chunks(1 << 20).enumerate() {
        dev.write(base + (at << 20) as u64, piece, false).unwrap();
    }
    let after = dev.stats();
    let found = after.counters.duplicate_writes - before.counters.duplicate_writes;
    let duplicates = n - changed;
    let efficiency = found as f64 / duplicates as f64;
    let ix = after.hash_index.expect("sparse reports its index");
    let predicted = predicted_efficiency(ix.sampling_period as f64);
    eprintln!(
        "{n} chunks, index full at {full}: sampling 1 in {}, found {found} of {duplicates} duplicates ({:.2} %), Eq. 2 predicts {:.2} % (groups of {GROUP_BLOCKS} blocks); {:?}",
        ix.sampling_period,
        100.0 * efficiency,
        100.0 * predicted,
        ix
    );
    assert!(
        ix.sampling_period >= 4,
        "the budget must force sampling: {ix:?}"
    );
    assert!(
        efficiency >= predicted - 0.01,
        "found {:.2} % of duplicates, Eq. 2 predicts {:.2} %",
        100.0 * efficiency,
        100.0 * predicted
    );
    assert!(ix.bytes <= ix.index_memory, "over budget: {ix:?}");
    // What status estimates the sampling missed, against what it missed.
    let missed = duplicates - found;
    assert!(
        ix.missed_estimate * 2 >= missed && ix.missed_estimate <= missed * 2,
        "estimated {} missed, {missed} were",
        ix.missed_estimate
    );
    // Whatever the index missed, the data is right.
    let mut back = vec![0u8; 1 << 20];
    for at in [0usize, n as usize / 2, n as usize - 256] {
        dev.read(base + (at * CS) as u64, &mut back).unwrap();
        assert!(back == v2[at * CS..at * CS + (1 << 20)], "v2 at chunk {at}");
        dev.read((at * CS) as u64, &mut back).unwrap();
        assert!(back == v1[at * CS..at * CS + (1 << 20)], "v1 at chunk {at}");
    }
    assert!(dev.check(false).unwrap().is_clean());
    dev.close().unwrap();
}

/// After a crash (no index checkpoint) a device serves at once: open reads
/// the first records into the index, a background thread the rest, and
/// once it is done every duplicate is found again.
#[test]
fn after_a_crash_the_index_is_rebuilt_in_the_background() {
    let n = 20_000u64;
    let physical = 2 * n + dedup_core::engine::overwrite_reserve_chunks(CS as u32);
    let mut cfg = common::config(
        "sparse",
        CS as u32,
        2 * n,
        physical,
        HashAlgo::Blake3,
        false,
    );
    cfg.compression = dedup_core::compress::Compression::None;
    let dir = tempfile::tempdir().unwrap();
    let data =
        Arc::new(FileBlockFile::create(&dir.path().join("data"), cfg.data_device_len()).unwrap());
    let meta_len = registry::metadata_device_len(&cfg).unwrap();
    let meta = Arc::new(FileBlockFile::create(&dir.path().join("meta"), meta_len).unwrap());
    Device::format(
        &cfg,
        data.as_ref(),
        meta.clone(),
        &BackendParams::default(),
        None,
    )
    .unwrap();
    let open = |warm: usize| {
        let opts = OpenOptions {
            writable: true,
            open_warm_records: Some(warm),
            ..Default::default()
        };
        Device::open(
            Box::new(data.clone()) as Box<dyn BlockFile>,
            Box::new(meta.clone()),
            &opts,
            None,
        )
        .unwrap()
    };
    let v1 = dedup_core::testdata::noise(7, n as usize * CS);
    let dev = open(0);
    for (at, piece) in v1.chunks(1 << 20).enumerate() {
        dev.write((at << 20) as u64, piece, false).unwrap();
    }
    dev.flush().unwrap();
    drop(dev); // a crash: committed, but no index checkpoint

    // Dropped while its index rebuilds: the thread stops and the device's
    // lock goes with it, so it opens again at once.
    let dev = open(1000);
    drop(dev);
    let dev = open(1000);
    let ix = dev.stats().hash_index.unwrap();
    assert!(!ix.from_checkpoint);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while dev.stats().hash_index.unwrap().records_to_warm > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the rebuild did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(dev.stats().hash_index.unwrap().entries, n);
    let before = dev.stats().counters.duplicate_writes;
    for (at, piece) in v1.chunks(1 << 20).enumerate() {
        dev.write(n * CS as u64 + (at << 20) as u64, piece, false)
            .unwrap();
    }
    assert_eq!(dev.stats().counters.duplicate_writes - before, n);
    assert!(dev.check(false).unwrap().is_clean());
    dev.close().unwrap();
}
