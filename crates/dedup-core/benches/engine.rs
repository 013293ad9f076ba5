//! In-process engine throughput, one thread (so MB/s is per core), 4 KiB
//! chunks: all-unique and all-duplicate writes in 4 KiB and 1 MiB requests,
//! reads, and the fingerprint functions alone as the floor, on the inram
//! store. The data device is in memory, so this measures the engine, not a
//! disk.
//!
//!   cargo bench -p dedup-core --bench engine

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dedup_core::backends::OpenOptions;
use dedup_core::blockfile::MemBlockFile;
use dedup_core::config::DeviceConfig;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::registry;
use dedup_core::Device;

const CS: usize = 4096;
const LOGICAL: u64 = 256 << 20;
const PHYSICAL: u64 = 512 << 20;

fn device(hash: HashAlgo) -> Device {
    let cfg = DeviceConfig {
        uuid: [1; 16],
        // The in-RAM store, so this measures the engine's own work (the table
        // in docs/benchmarks.md and earlier runs are on it too), not a store's
        // I/O.
        backend: "inram".into(),
        chunk_size: CS as u32,
        hash,
        verify: false,
        logical_size: LOGICAL,
        physical_chunks: PHYSICAL / CS as u64,
        compression: dedup_core::compress::Compression::None,
    };
    // Touch every page up front: first-touch page faults would otherwise
    // dominate unique writes, and a real data device has none.
    let data = MemBlockFile::from_bytes(vec![0x5a; cfg.data_device_len() as usize], "data");
    let meta = std::sync::Arc::new(MemBlockFile::new(
        registry::metadata_device_len(&cfg).unwrap(),
        "meta",
    ));
    Device::format(&cfg, &data, meta.clone(), &Default::default(), None).unwrap();
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    Device::open(Box::new(data), Box::new(meta), &opts, None).unwrap()
}

/// Pseudo-random bytes; chunk `i` is made unique by stamping a counter in it.
fn noise(len: usize) -> Vec<u8> {
    dedup_core::testdata::noise(0x2545_F491_4F6C_DD1D, len)
}

fn stamp(buf: &mut [u8], counter: &mut u64) {
    for c in buf.chunks_mut(CS) {
        *counter += 1;
        c[..8].copy_from_slice(&counter.to_le_bytes());
    }
}

fn writes(c: &mut Criterion) {
    let mut g = c.benchmark_group("write");
    g.measurement_time(Duration::from_secs(4)).sample_size(20);
    for req in [CS, 1 << 20] {
        g.throughput(Throughput::Bytes(req as u64));
        let label = if req == CS {
            "4KiB-requests"
        } else {
            "1MiB-requests"
        };

        g.bench_function(BenchmarkId::new("unique", label), |b| {
            let dev = device(HashAlgo::Blake3);
            let mut buf = noise(req);
            let mut counter = 0u64;
            let mut offset = 0u64;
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    stamp(&mut buf, &mut counter);
                    // Overwritten chunks become garbage; collect it outside the timing.
                    if dev.stats().physical_used_percent > 80.0 {
                        dev.gc().unwrap();
                    }
                    let t = Instant::now();
                    dev.write(offset, &buf, false).unwrap();
                    spent += t.elapsed();
                    offset = (offset + req as u64) % LOGICAL;
                }
                spent
            });
        });

        g.bench_function(BenchmarkId::new("duplicate", label), |b| {
            let dev = device(HashAlgo::Blake3);
            let chunk = noise(CS);
            let buf: Vec<u8> = chunk.iter().copied().cycle().take(req).collect();
            dev.write(0, &buf, false).unwrap();
            let mut offset = 0u64;
            b.iter(|| {
                dev.write(offset, &buf, false).unwrap();
                offset = (offset + req as u64) % LOGICAL;
            });
        });
    }
    g.finish();
}

fn reads(c: &mut Criterion) {
    let mut g = c.benchmark_group("read");
    g.measurement_time(Duration::from_secs(3)).sample_size(20);
    let dev = device(HashAlgo::Blake3);
    let mut buf = noise(1 << 20);
    let mut counter = 0;
    for off in (0..LOGICAL).step_by(1 << 20) {
        stamp(&mut buf, &mut counter);
        dev.write(off, &buf, false).unwrap();
    }
    g.throughput(Throughput::Bytes(1 << 20));
    let mut offset = 0u64;
    g.bench_function("1MiB-requests", |b| {
        b.iter(|| {
            dev.read(offset, &mut buf).unwrap();
            offset = (offset + (1 << 20)) % LOGICAL;
        })
    });
    g.finish();
}

fn fingerprints(c: &mut Criterion) {
    let mut g = c.benchmark_group("fingerprint-4KiB");
    g.measurement_time(Duration::from_secs(2)).sample_size(20);
    let chunk = noise(CS);
    g.throughput(Throughput::Bytes(CS as u64));
    for algo in HashAlgo::ALL {
        g.bench_function(algo.name(), |b| {
            b.iter(|| algo.fingerprint(std::hint::black_box(&chunk)))
        });
    }
    g.finish();
}

criterion_group!(benches, writes, reads, fingerprints);
criterion_main!(benches);
