//! Many requests in flight at once: the same new content written by many
//! threads is stored once with exact counts; random mixed workloads with GC
//! running alongside match per-thread models; readers racing writers and GC
//! never see another chunk's bytes.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

use common::{assert_consistent, MemDevice, ModelDisk, Patterns};
use rand::{Rng, SeedableRng};

const CS: usize = 4096;

/// Sets the flag when dropped, so a panicking worker stops its companions
/// instead of leaving them looping forever.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn concurrent_writers_of_the_same_new_content_store_it_once() {
    let threads = 8;
    let per_thread = 64u64;
    let md = MemDevice::new(CS as u32, threads * per_thread, 64);
    let p = Patterns::new(4, CS);
    // Slow data writes keep each writer between its index lookup and its
    // index insert for a while: exactly where a second writer must wait.
    let slow = common::FaultyBlockFile {
        write_delay: std::time::Duration::from_micros(200),
        ..common::FaultyBlockFile::new(md.data.clone())
    };
    let dev = md
        .open_on(Box::new(slow), Box::new(md.meta.clone()))
        .unwrap();
    for round in 1..4usize {
        let barrier = Barrier::new(threads as usize);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (dev, p, barrier) = (&dev, &p, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..per_thread {
                        // Interleave so threads hit the same content at the same time.
                        let lbn = i * threads + t;
                        dev.write(lbn * CS as u64, p.chunk(round), false).unwrap();
                    }
                });
            }
        });
        let (pbn, count) = dev.inspect_lbn(0).unwrap().unwrap();
        assert_eq!(
            count as u64,
            threads * per_thread + 1,
            "one index reference + every LBN"
        );
        for lbn in 0..threads * per_thread {
            assert_eq!(dev.inspect_lbn(lbn).unwrap().unwrap().0, pbn);
        }
        dev.gc().unwrap();
        assert_eq!(dev.stats().chunks_stored, 1, "round {round}: stored once");
        assert_consistent(&dev);
    }
}

#[test]
fn mixed_workloads_with_gc_running_match_per_thread_models() {
    mixed_workloads(0);
}

/// The same through write-back: each thread reads its own writes back
/// while they may still be queued, and GC and flushes run alongside.
#[test]
fn mixed_workloads_with_write_back_match_per_thread_models() {
    mixed_workloads(256 << 10);
}

fn mixed_workloads(write_back: u64) {
    let threads = 4usize;
    let region_chunks = 48usize;
    // Room for every LBN's own content plus the batches in flight, so a
    // write never fails for space however GC and writers interleave.
    let mut md = MemDevice::new(CS as u32, (threads * region_chunks) as u64, 240);
    md.write_back_bytes = write_back;
    let p = Patterns::new(6, CS);
    let dev = md.open().unwrap();
    let stop = AtomicBool::new(false);
    let models: Vec<ModelDisk> = std::thread::scope(|s| {
        let gc = s.spawn(|| {
            let mut passes = 0;
            while !stop.load(Ordering::Relaxed) {
                dev.gc().unwrap();
                dev.flush().unwrap();
                passes += 1;
            }
            passes
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (dev, p) = (&dev, &p);
                let stop = &stop;
                s.spawn(move || {
                    let _stop = StopOnDrop(stop);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(1000 + t as u64);
                    let base = (t * region_chunks * CS) as u64;
                    let len = region_chunks * CS;
                    let mut model = ModelDisk::new(len, CS);
                    for _ in 0..1500 {
                        let off = rng.random_range(0..len as u64);
                        let n = rng.random_range(1..=(len as u64 - off).min(6 * CS as u64));
                        match rng.random_range(0..10) {
                            0..=3 => {
                                // Aligned whole chunks of a shared pattern: cross-thread dedup.
                                let lbn = off / CS as u64;
                                let chunks = (n / CS as u64).clamp(1, region_chunks as u64 - lbn);
                                let pat = rng.random_range(0..6);
                                let data = p.bytes(pat, 0, chunks as usize * CS);
                                dev.write(base + lbn * CS as u64, &data, false).unwrap();
                                model.write(lbn * CS as u64, &data);
                            }
                            4..=5 => {
                                let data = p.bytes(rng.random_range(0..6), off, n as usize);
                                dev.write(base + off, &data, rng.random_bool(0.1)).unwrap();
                                model.write(off, &data);
                            }
                            6 => {
                                dev.discard(base + off, n, false).unwrap();
                                model.zero(off, n);
                            }
                            _ => {
                                let mut got = vec![0u8; n as usize];
                                dev.read(base + off, &mut got).unwrap();
                                assert_eq!(&got[..], model.read(off, n as usize), "thread {t}");
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        let models = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        assert!(gc.join().unwrap() > 0, "GC ran alongside the workload");
        models
    });
    let all: Vec<u8> = models
        .iter()
        .flat_map(|m| m.bytes.iter().copied())
        .collect();
    assert_eq!(common::read_all(&dev), all);
    assert_consistent(&dev);
    dev.gc().unwrap();
    let mut whole = ModelDisk::new(all.len(), CS);
    whole.write(0, &all);
    let (nonzero, distinct) = whole.nonzero_and_distinct();
    let s = dev.stats();
    assert_eq!((s.chunks_mapped, s.chunks_stored), (nonzero, distinct));
    if write_back > 0 {
        assert!(
            s.counters.write_back_requests > 0,
            "writes went through the queue"
        );
        assert_eq!(s.counters.write_back_failures, 0);
    }
}

/// Chunk image tagged with its LBN, so a reader can tell whose data it got.
fn tagged(p: &Patterns, pattern: usize, lbn: u64) -> Vec<u8> {
    let mut c = p.chunk(pattern).to_vec();
    c[..8].copy_from_slice(&lbn.to_le_bytes());
    c
}

#[test]
fn readers_racing_writers_and_gc_never_see_another_chunks_bytes() {
    let chunks = 32u64;
    // Few physical chunks: GC frees and allocation reuses PBNs constantly.
    let md = MemDevice::new(CS as u32, chunks, 40);
    let p = Patterns::new(5, CS);
    let dev = md.open().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let mut rng = rand::rngs::StdRng::seed_from_u64(5);
            for _ in 0..20_000 {
                let lbn = rng.random_range(0..chunks);
                if rng.random_bool(0.2) {
                    dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
                } else {
                    let data = tagged(&p, rng.random_range(1..5), lbn);
                    dev.write(lbn * CS as u64, &data, false).unwrap();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                dev.gc().unwrap();
            }
        });
        for r in 0..2 {
            let (dev, p, stop) = (&dev, &p, &stop);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(77 + r);
                let mut buf = vec![0u8; 4 * CS];
                while !stop.load(Ordering::Relaxed) {
                    let lbn = rng.random_range(0..chunks - 4);
                    dev.read(lbn * CS as u64, &mut buf).unwrap();
                    for (i, c) in buf.chunks(CS).enumerate() {
                        let l = lbn + i as u64;
                        let ok =
                            c.iter().all(|&b| b == 0) || (1..5).any(|pat| c == tagged(p, pat, l));
                        assert!(ok, "LBN {l} returned bytes that were never written to it");
                    }
                }
            });
        }
        writer.join().unwrap();
    });
    assert_consistent(&dev);
}
