//! thin (and `ordered`, which runs its code) when the host's filesystem
//! fills under it and is freed again: its window, zone-record and table
//! writes fail with ENOSPC for a while, on the data device, the metadata
//! device or both. Every write acknowledged before or during the outage,
//! and every FLUSH that succeeded, must read back once space returns,
//! without a restart, after a crash right after the next successful
//! flush, and after a clean stop; meanwhile every error says ENOSPC. thin
//! used to refuse everything after its first failed window until a
//! restart (with EIO), so the write acknowledged before it was lost and
//! the metadata could not be saved at stop.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use common::{flush_until_ok, FaultyBlockFile, MemDevice, ModelDisk};
use dedup_core::backends::{BackendParams, WindowParams};
use dedup_core::fingerprint::HashAlgo;
use dedup_core::Device;

const CS: usize = 4096;
const LBNS: u64 = 128;
/// Small windows: a 32-chunk write ends several, so window writes fail
/// inside a (queued) write too, not only at FLUSH.
const WINDOW: u64 = 8;
/// One write: 32 chunks.
const RUN: u64 = 32;

/// `RUN` distinct chunks from `seed` on: even ones compress (and carry
/// entries in C-blocks), odd ones do not.
fn unique(seed: u64) -> Vec<u8> {
    (seed..seed + RUN)
        .flat_map(|s| {
            if s % 2 == 0 {
                let line = format!("{s:08} the quick brown fox jumps over the lazy dog\n");
                line.bytes().cycle().take(CS).collect()
            } else {
                dedup_core::testdata::noise(s, CS)
            }
        })
        .collect()
}

fn device(backend: &str, write_back: bool, lbns: u64, physical: u64) -> MemDevice {
    let cfg = common::config(backend, CS as u32, lbns, physical, HashAlgo::Blake3, false);
    let params = BackendParams {
        window: WindowParams {
            blocks: WINDOW,
            ms: 10_000,
        },
        ..BackendParams::default()
    };
    let mut md = MemDevice::format(cfg, &params);
    md.write_back_bytes = if write_back { 1 << 20 } else { 0 };
    md
}

/// The device over both memory devices, each refusing writes with ENOSPC
/// while its switch is on: (data, meta).
fn open_faulty(md: &MemDevice) -> (Device, [Arc<AtomicBool>; 2]) {
    let full = |inner| FaultyBlockFile {
        errno: libc::ENOSPC,
        ..FaultyBlockFile::new(inner)
    };
    let (data, meta) = (full(md.data.clone()), full(md.meta.clone()));
    let switches = [data.fail_writes.clone(), meta.fail_writes.clone()];
    let dev = md.open_on(Box::new(data), Box::new(meta)).unwrap();
    (dev, switches)
}

fn at(lbn: u64) -> u64 {
    lbn * CS as u64
}

/// The device reads as the model and its metadata is consistent.
fn holds(dev: &Device, model: &ModelDisk, what: &str, when: &str) {
    // Not assert_eq: a diff of two 512 KiB images helps nobody.
    assert!(common::read_all(dev) == model.bytes, "{what}: {when}");
    common::assert_consistent(dev);
}

fn assert_enospc(e: &dedup_core::Error, what: &str) {
    assert_eq!(e.errno(), libc::ENOSPC, "{what}: {e}");
}

/// One outage on the devices `full` names (data, meta).
fn outage(backend: &str, write_back: bool, full: [bool; 2]) {
    let what = format!("{backend}, write-back {write_back}, full {full:?}");
    let md = device(backend, write_back, LBNS, 512);
    let (dev, switches) = open_faulty(&md);
    let mut model = ModelDisk::new(LBNS as usize * CS, CS);
    let first = unique(1000);
    dev.write(0, &first, false).unwrap();
    model.write(0, &first);
    dev.flush().unwrap();

    for (s, on) in switches.iter().zip(full) {
        s.store(on, SeqCst);
    }
    // Overwrites (freed chunks make a commit of the tables due) and new
    // LBNs: acknowledged if the call succeeds; if refused, with ENOSPC, and
    // their chunks may read old or new afterwards (a failed write).
    let mut refused = Vec::new();
    for (lbn, seed) in [(0, 2000), (2 * RUN, 3000)] {
        let bytes = unique(seed);
        match dev.write(at(lbn), &bytes, false) {
            Ok(()) => model.write(at(lbn), &bytes),
            Err(e) => {
                assert_enospc(&e, &what);
                refused.push((lbn, bytes));
            }
        }
    }
    if write_back {
        assert!(
            refused.len() < 2,
            "{what}: the first write was queued (acknowledged)"
        );
    }
    // Every flush fails while the host is full (a queued write is
    // acknowledged and pending), and says why; retries in between keep the
    // reason (they used to turn it into EIO).
    for _ in 0..2 {
        match dev.flush() {
            Err(e) => assert_enospc(&e, &what),
            Ok(()) => assert!(!write_back, "{what}: flushed with a queued write failing"),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut got = vec![0u8; CS];
    dev.read(at(LBNS - 1), &mut got)
        .unwrap_or_else(|e| panic!("{what}: a range nothing waits on reads: {e}"));

    // Space returns: no restart.
    for s in &switches {
        s.store(false, SeqCst);
    }
    flush_until_ok(&dev);
    for (lbn, bytes) in refused {
        for i in 0..RUN as usize {
            let mut got = vec![0u8; CS];
            dev.read(at(lbn + i as u64), &mut got).unwrap();
            let new = &bytes[i * CS..(i + 1) * CS];
            assert!(
                got == model.chunk(lbn as usize + i) || got == new,
                "{what}: LBN {} of a refused write reads neither old nor new",
                lbn as usize + i
            );
            model.write(at(lbn + i as u64), &got);
        }
    }
    holds(&dev, &model, &what, "after space returned");
    let last = unique(4000);
    dev.write(at(3 * RUN), &last, false).unwrap();
    model.write(at(3 * RUN), &last);
    dev.flush()
        .unwrap_or_else(|e| panic!("{what}: flush after recovery: {e}"));

    // A crash right after: every flushed write is there.
    drop(dev);
    let dev = md.open().unwrap();
    holds(&dev, &model, &what, "after a crash");
    // A clean stop saves.
    dev.close()
        .unwrap_or_else(|e| panic!("{what}: close after the outage: {e}"));
    drop(dev);
    let dev = md.open().unwrap();
    holds(&dev, &model, &what, "after a clean stop");
}

#[test]
fn thin_serves_on_after_the_host_filled_and_loses_no_acknowledged_write() {
    for backend in ["thin", "ordered", "thin/none"] {
        for full in [[true, false], [false, true], [true, true]] {
            outage(backend, true, full);
        }
    }
}

#[test]
fn without_write_back_the_failed_writes_say_enospc_and_the_device_recovers() {
    for full in [[true, false], [false, true], [true, true]] {
        outage("thin", false, full);
    }
}

/// A client that keeps writing new data while the host is full: each write
/// fails with ENOSPC, but its chunks used to stay in RAM behind the window
/// the host refused, without bound (on a large device, until memory ran
/// out). Past 64 MiB an allocation writes them out itself and, failing,
/// refuses the chunk instead.
#[test]
fn new_data_does_not_pile_up_in_ram_while_the_host_is_full() {
    const LIMIT: u64 = (64 << 20) / CS as u64;
    const CHUNKS: u64 = LIMIT + LIMIT / 4;
    const WRITE: u64 = 256;
    let md = device("thin", false, CHUNKS, CHUNKS + 1024);
    let (dev, [data, _]) = open_faulty(&md);
    data.store(true, SeqCst);
    let mut refused = 0;
    for lbn in (0..CHUNKS).step_by(WRITE as usize) {
        let bytes = dedup_core::testdata::noise(lbn, (WRITE as usize) * CS);
        if let Err(e) = dev.write(at(lbn), &bytes, false) {
            assert_enospc(&e, "a write while the host is full");
            refused += 1;
        }
    }
    assert_eq!(refused, CHUNKS / WRITE, "every write meets the full host");
    let staged = dev.stats().backend_stats["chunks_staged"];
    assert!(
        staged < LIMIT + WRITE,
        "{staged} chunks held in RAM (bound {LIMIT})"
    );
    data.store(false, SeqCst);
    flush_until_ok(&dev);
    // Refused writes: each chunk reads as before (zeros) or as written.
    for lbn in (0..CHUNKS).step_by(WRITE as usize) {
        let bytes = dedup_core::testdata::noise(lbn, (WRITE as usize) * CS);
        let mut got = vec![0u8; bytes.len()];
        dev.read(at(lbn), &mut got).unwrap();
        for (g, b) in got.chunks(CS).zip(bytes.chunks(CS)) {
            assert!(g == b || g.iter().all(|&x| x == 0), "LBN {lbn}..: torn");
        }
    }
    common::assert_consistent(&dev);
    dev.close().unwrap();
}
