//! thin and its policies on the cases ThinDedup's design must get right:
//! incompressible data (nothing to embed into: entries go to metadata
//! blocks), all-duplicate windows (no new chunk at all), compressible data
//! (entries ride in C-blocks), a window of one block; each written,
//! flushed, crashed (the device dropped without closing), reopened,
//! verified and checked. And recovery's cost: the same uncommitted work on
//! a small and a sixteen times larger device is the same work.

use crate::common;

use common::MemDevice;
use dedup_core::backends::BackendParams;
use dedup_core::backends::WindowParams;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::Device;

const CS: usize = 4096;

fn random_block(seed: u64) -> Vec<u8> {
    dedup_core::testdata::noise(seed, CS)
}

fn text_block(seed: u64) -> Vec<u8> {
    let line = format!("{seed:08} the quick brown fox jumps over the lazy dog\n");
    line.bytes().cycle().take(CS).collect()
}

fn device(backend: &str, physical: u64, window: u64) -> MemDevice {
    let cfg = common::config(backend, CS as u32, 256, physical, HashAlgo::Blake3, false);
    let params = BackendParams {
        window: WindowParams {
            blocks: window,
            ms: 10_000,
        },
        ..BackendParams::default()
    };
    MemDevice::format(cfg, &params)
}

fn stat(dev: &Device, name: &str) -> u64 {
    dev.stats().backend_stats.get(name).copied().unwrap_or(0)
}

/// Write `blocks` at LBN 0.., flush, write more without a flush, crash;
/// reopen and check the flushed part exactly, the rest for being old or new.
fn crash_round(backend: &str, window: u64, blocks: &[Vec<u8>]) -> (Device, MemDevice) {
    let md = device(backend, 512, window);
    let dev = md.open().unwrap();
    for (i, b) in blocks.iter().enumerate() {
        dev.write((i * CS) as u64, b, false).unwrap();
    }
    dev.flush().unwrap();
    // After the flush: overwrite half with the other half's data, no flush.
    let half = blocks.len() / 2;
    for i in 0..half {
        dev.write((i * CS) as u64, &blocks[half + i], false)
            .unwrap();
    }
    drop(dev);
    let dev = md.open().unwrap();
    for (i, b) in blocks.iter().enumerate() {
        let mut got = vec![0u8; CS];
        dev.read((i * CS) as u64, &mut got).unwrap();
        let newer = (i < half).then(|| &blocks[half + i]);
        assert!(
            &got == b || Some(&got) == newer,
            "{backend}, window {window}: block {i} lost"
        );
    }
    let report = dev.check(true).unwrap();
    assert!(report.is_clean(), "{backend}: {:#?}", report.problems);
    (dev, md)
}

#[test]
fn incompressible_duplicate_compressible_and_one_block_windows_survive_a_crash() {
    for backend in ["thin", "ordered"] {
        for window in [1, 32] {
            let incompressible: Vec<Vec<u8>> = (0..40).map(random_block).collect();
            let (dev, _md) = crash_round(backend, window, &incompressible);
            drop(dev);

            // All duplicates: one content everywhere (one new chunk, then
            // windows with nothing new to embed into).
            let same = vec![random_block(7); 40];
            crash_round(backend, window, &same);

            let text: Vec<Vec<u8>> = (0..40).map(text_block).collect();
            crash_round(backend, window, &text);

            let mixed: Vec<Vec<u8>> = (0..40)
                .map(|i| {
                    if i % 2 == 0 {
                        text_block(i)
                    } else {
                        random_block(i)
                    }
                })
                .collect();
            crash_round(backend, window, &mixed);
        }
    }
}

#[test]
fn entries_ride_in_compressible_blocks_and_fall_back_to_metadata_blocks() {
    // thin: compressible windows embed every entry, no metadata block.
    let md = device("thin", 512, 32);
    let dev = md.open().unwrap();
    for i in 0..64u64 {
        dev.write(i * CS as u64, &text_block(i), false).unwrap();
    }
    dev.flush().unwrap();
    assert!(stat(&dev, "c_blocks_written") >= 64);
    assert_eq!(stat(&dev, "entries_embedded"), stat(&dev, "entries"));
    assert_eq!(stat(&dev, "metadata_blocks_written"), 0);

    // Incompressible or all-duplicate windows: metadata blocks.
    for i in 0..32u64 {
        dev.write((64 + i) * CS as u64, &random_block(i), false)
            .unwrap();
    }
    dev.flush().unwrap();
    for i in 0..32u64 {
        dev.write((100 + i) * CS as u64, &text_block(3), false)
            .unwrap();
    }
    dev.flush().unwrap();
    assert!(stat(&dev, "metadata_blocks_written") >= 2);
    assert!(stat(&dev, "entries") > stat(&dev, "entries_embedded"));
    dev.close().unwrap();

    // ordered embeds nothing: every entry is in a metadata block.
    let md = device("ordered", 512, 32);
    let dev = md.open().unwrap();
    for i in 0..64u64 {
        dev.write(i * CS as u64, &text_block(i), false).unwrap();
    }
    dev.flush().unwrap();
    assert_eq!(stat(&dev, "entries_embedded"), 0);
    assert!(stat(&dev, "metadata_blocks_written") >= 1);
}

#[test]
fn ideal_refuses_to_reopen_after_a_crash_and_loses_nothing_when_closed() {
    let md = device("ideal", 512, 32);
    let dev = md.open().unwrap();
    for i in 0..20u64 {
        dev.write(i * CS as u64, &text_block(i), false).unwrap();
    }
    dev.close().unwrap();
    drop(dev);
    let dev = md.open().unwrap();
    let mut got = vec![0u8; CS];
    dev.read(5 * CS as u64, &mut got).unwrap();
    assert_eq!(got, text_block(5));
    dev.write(0, &random_block(1), true).unwrap();
    drop(dev); // crash
    match md.open() {
        Err(dedup_core::Error::Unclean { .. }) => {}
        other => panic!("ideal reopened after a crash: {:?}", other.map(|_| ())),
    }
}

#[test]
fn recovery_work_follows_the_uncommitted_entries_not_the_device_size() {
    let mut seen = Vec::new();
    for physical in [1024u64, 16 * 1024] {
        let md = device("thin", physical, 32);
        let dev = md.open().unwrap();
        for i in 0..96u64 {
            let b = if i % 3 == 0 {
                random_block(i)
            } else {
                text_block(i)
            };
            dev.write((i % 200) * CS as u64, &b, false).unwrap();
        }
        dev.flush().unwrap();
        drop(dev);
        let dev = md.open().unwrap();
        let us = stat(&dev, "recovery_us");
        let verified = stat(&dev, "recovery_chunks_verified");
        let applied = stat(&dev, "recovery_applied");
        eprintln!(
            "thin recovery, {} MiB data device: {us} µs, {applied} entries applied, {verified} chunks verified",
            (physical * CS as u64) >> 20
        );
        assert!(applied > 0);
        seen.push((verified, applied));
    }
    // The same entries and chunks, whatever the device size.
    assert_eq!(seen[0], seen[1]);
}
