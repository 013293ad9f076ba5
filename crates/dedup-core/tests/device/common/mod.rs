//! Shared helpers for the engine's integration tests: the in-memory device
//! (the crate's rig, `src/testrig.rs`) with faults on demand, the variants
//! the conformance suites run over, and chunk-periodic content patterns
//! that make duplicates common.
#![allow(dead_code)]

use std::sync::Arc;

use dedup_core::backends::BackendParams;
use dedup_core::blockfile::BlockFile;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::{Device, Result};

/// The in-memory device and its configuration: the crate's one rig. Each
/// test binary uses some of them (as `dead_code` above, for the rest).
#[allow(unused_imports)]
pub use dedup_core::testrig::{config, lsm_dir, scratch_dir, MemDevice};

/// A memory device with faults on demand: slow writes (to widen race
/// windows in concurrency tests) and failing writes (for error paths).
/// Clones share the switch, so a test keeps one to flip it.
#[derive(Clone)]
pub struct FaultyBlockFile {
    pub inner: Arc<dyn BlockFile>,
    pub write_delay: std::time::Duration,
    pub fail_writes: Arc<std::sync::atomic::AtomicBool>,
    /// What a failing write returns: EIO (a failing disk) unless a test
    /// asks for ENOSPC (the host's filesystem full).
    pub errno: i32,
}

impl FaultyBlockFile {
    pub fn new(inner: Arc<dyn BlockFile>) -> Self {
        FaultyBlockFile {
            inner,
            write_delay: std::time::Duration::ZERO,
            fail_writes: Arc::default(),
            errno: libc::EIO,
        }
    }
}

impl BlockFile for FaultyBlockFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        std::thread::sleep(self.write_delay);
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(dedup_core::Error::io(
                "injected write failure",
                std::io::Error::from_raw_os_error(self.errno),
            ));
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> Result<u64> {
        self.inner.len()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn capacity(&self) -> Result<Option<u64>> {
        self.inner.capacity()
    }
    fn punch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.punch(offset, len)
    }
}

/// Every backend, and the packing layer over each kind of backend (and
/// thin without compression): what the conformance suites run over.
///
/// "@N" sets the sparse hash index's budget to N bytes: "sparse@64" holds 3
/// fingerprints (its exact table samples on a few chunks); "sparse/lz4@41216"
/// moves to the compact table after 3.
pub const VARIANTS: &[&str] = &[
    "sparse",
    "sparse/lz4",
    "sparse@64",
    "sparse/lz4@41216",
    "inram",
    "disktable",
    "cowbtree",
    "lsm",
    "thin",
    "ordered",
    "ideal",
    "inram/lz4",
    "disktable/lz4",
    "cowbtree/zstd:1",
    "lsm/lz4",
    "disktable/zstd",
    "thin/none",
];

/// The backend name of a variant ("disktable/lz4" -> "disktable").
pub fn base(variant: &str) -> &str {
    let (v, _) = index_memory_of(variant);
    v.split('/').next().unwrap_or(v)
}

/// A variant without its "@N" index budget, and the budget.
fn index_memory_of(variant: &str) -> (&str, Option<u64>) {
    match variant.split_once('@') {
        Some((v, n)) => (v, Some(n.parse().expect("@N: a byte count"))),
        None => (variant, None),
    }
}

/// `params` with the variant's index budget, if it names one.
pub fn params(variant: &str, params: BackendParams) -> BackendParams {
    match index_memory_of(variant).1 {
        Some(index_memory) => BackendParams {
            index_memory,
            ..params
        },
        None => params,
    }
}

/// A formatted in-memory device of `variant` (see `VARIANTS`, its "@N"
/// index budget applied), BLAKE3, verify off.
pub fn variant_device(variant: &str, chunk_size: u32, logical: u64, physical: u64) -> MemDevice {
    let cfg = config(
        variant,
        chunk_size,
        logical,
        physical,
        HashAlgo::Blake3,
        false,
    );
    MemDevice::format(cfg, &params(variant, BackendParams::default()))
}

/// Content patterns: pattern 0 is all zeros; the others are pseudo-random
/// chunk images, so a write of pattern p over whole aligned chunks produces
/// chunks identical to every other such write of p.
pub struct Patterns {
    images: Vec<Vec<u8>>,
}

impl Patterns {
    pub fn new(count: usize, chunk_size: usize) -> Patterns {
        let mut images = vec![vec![0u8; chunk_size]];
        for p in 1..count {
            let random = dedup_core::testdata::noise(p as u64 * 0x1234_5678_9abc, chunk_size);
            // Even patterns compress (a random 100-byte unit repeated), so
            // backends that compress (thin's C-blocks) meet both kinds.
            images.push(if p % 2 == 0 {
                (0..chunk_size).map(|i| random[i % 100]).collect()
            } else {
                random
            });
        }
        Patterns { images }
    }

    /// Bytes of pattern `p` for device range `[offset, offset + len)`.
    pub fn bytes(&self, p: usize, offset: u64, len: usize) -> Vec<u8> {
        let img = &self.images[p];
        let cs = img.len() as u64;
        (0..len as u64)
            .map(|i| img[((offset + i) % cs) as usize])
            .collect()
    }

    pub fn chunk(&self, p: usize) -> &[u8] {
        &self.images[p]
    }
}

/// A plain in-memory disk: the model every engine test compares against.
#[derive(Clone)]
pub struct ModelDisk {
    pub bytes: Vec<u8>,
    pub chunk_size: usize,
}

impl ModelDisk {
    pub fn new(len: usize, chunk_size: usize) -> ModelDisk {
        ModelDisk {
            bytes: vec![0; len],
            chunk_size,
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    pub fn zero(&mut self, offset: u64, len: u64) {
        self.bytes[offset as usize..(offset + len) as usize].fill(0);
    }

    pub fn read(&self, offset: u64, len: usize) -> &[u8] {
        &self.bytes[offset as usize..offset as usize + len]
    }

    pub fn chunk(&self, lbn: usize) -> &[u8] {
        &self.bytes[lbn * self.chunk_size..(lbn + 1) * self.chunk_size]
    }

    pub fn chunks(&self) -> usize {
        self.bytes.len() / self.chunk_size
    }

    /// Non-zero chunks, and how many distinct contents they hold.
    pub fn nonzero_and_distinct(&self) -> (u64, u64) {
        let mut set = std::collections::HashSet::new();
        let mut nonzero = 0;
        for i in 0..self.chunks() {
            let c = self.chunk(i);
            if c.iter().any(|&b| b != 0) {
                nonzero += 1;
                set.insert(c.to_vec());
            }
        }
        (nonzero, set.len() as u64)
    }
}

/// Read the whole device.
pub fn read_all(dev: &Device) -> Vec<u8> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read(0, &mut buf).unwrap();
    buf
}

/// Flush until it succeeds (a stalled queued write is retried every 2 s
/// at most).
pub fn flush_until_ok(dev: &Device) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while let Err(e) = dev.flush() {
        assert!(std::time::Instant::now() < until, "still failing: {e}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Assert the metadata is consistent.
pub fn assert_consistent(dev: &Device) {
    let report = dev.check(true).unwrap();
    assert!(
        report.is_clean(),
        "check found problems: {:#?}",
        report.problems
    );
}

/// A device written with some duplicate-rich data and closed cleanly, as
/// bytes: the raw material of corruption and fuzz tests.
pub struct Image {
    pub data: Vec<u8>,
    pub meta: Vec<u8>,
    /// Holds lsm's files (`lsm_dir`).
    pub aux: tempfile::TempDir,
    /// What the device reads back.
    pub contents: Vec<u8>,
}

pub fn image(backend: &str, logical_chunks: u64, physical_chunks: u64, hash: HashAlgo) -> Image {
    let cfg = config(backend, 4096, logical_chunks, physical_chunks, hash, false);
    let md = MemDevice::format(cfg, &BackendParams::default());
    let dev = md.open().unwrap();
    let p = Patterns::new(5, 4096);
    for lbn in 0..logical_chunks - logical_chunks / 6 {
        dev.write(lbn * 4096, p.chunk((lbn % 5) as usize), false)
            .unwrap();
    }
    dev.write(3 * 4096 + 100, &p.bytes(2, 0, 5000), false)
        .unwrap();
    let contents = read_all(&dev);
    dev.close().unwrap();
    drop(dev);
    Image {
        data: md.data.snapshot(),
        meta: md.meta.contents(),
        aux: md.aux,
        contents,
    }
}

/// Copy a directory tree (lsm's files, to put back or damage a copy).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}
