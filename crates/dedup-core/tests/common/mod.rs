//! Shared helpers for the engine's integration tests: in-memory devices that
//! can be closed, crashed and reopened, and chunk-periodic content patterns
//! that make duplicates common.
#![allow(dead_code)]

use std::sync::Arc;

use dedup_core::backends::{BackendParams, OpenOptions};
use dedup_core::blockfile::sim::SimDisk;
use dedup_core::blockfile::{BlockFile, MemBlockFile};
use dedup_core::compress::Compression;
use dedup_core::config::DeviceConfig;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::registry;
use dedup_core::{Device, Result};

pub struct MemDevice {
    pub cfg: DeviceConfig,
    pub data: Arc<MemBlockFile>,
    /// A simulated disk: it grows like a file (the B-tree backends need
    /// that) and never loses a write unless a test asks it to.
    pub meta: Arc<SimDisk>,
    /// Where the lsm backend keeps its files.
    pub aux: tempfile::TempDir,
    /// Write-back queue of the devices opened (0: off).
    pub write_back_bytes: u64,
}

impl MemDevice {
    pub fn new(chunk_size: u32, logical_chunks: u64, physical_chunks: u64) -> MemDevice {
        Self::with(
            chunk_size,
            logical_chunks,
            physical_chunks,
            HashAlgo::Blake3,
            false,
        )
    }

    pub fn with(
        chunk_size: u32,
        logical_chunks: u64,
        physical_chunks: u64,
        hash: HashAlgo,
        verify: bool,
    ) -> MemDevice {
        let cfg = config(
            registry::DEFAULT,
            chunk_size,
            logical_chunks,
            physical_chunks,
            hash,
            verify,
        );
        Self::format(cfg, &BackendParams::default())
    }

    /// A device of the given backend and geometry.
    pub fn format(cfg: DeviceConfig, params: &BackendParams) -> MemDevice {
        let data = Arc::new(MemBlockFile::new(cfg.data_device_len(), "data"));
        let meta_len = registry::metadata_device_len(&cfg).unwrap();
        let meta = Arc::new(SimDisk::new(meta_len, "meta", Arc::default()));
        let aux = scratch_dir();
        let lsm = aux.path().join("meta.lsm");
        Device::format(&cfg, data.as_ref(), meta.clone(), params, Some(&lsm)).unwrap();
        MemDevice {
            cfg,
            data,
            meta,
            aux,
            write_back_bytes: 0,
        }
    }

    pub fn open(&self) -> Result<Device> {
        self.open_with(false)
    }

    /// Open through arbitrary wrappers of the two memory devices.
    pub fn open_on(&self, data: Box<dyn BlockFile>, meta: Box<dyn BlockFile>) -> Result<Device> {
        let opts = OpenOptions {
            writable: true,
            aux_dir: Some(self.aux.path().join("meta.lsm")),
            write_back_bytes: self.write_back_bytes,
            ..Default::default()
        };
        Device::open(data, meta, &opts, None)
    }

    /// Open on these two disks (a metadata copy put back, the data as a
    /// crash left it), keeping older metadata if `accept_stale` (what
    /// `check --repair --data` does).
    pub fn open_stale(
        &self,
        data: Arc<MemBlockFile>,
        meta: Arc<SimDisk>,
        accept_stale: bool,
    ) -> Result<Device> {
        let opts = OpenOptions {
            writable: true,
            accept_stale,
            aux_dir: Some(lsm_dir(self.aux.path())),
            write_back_bytes: self.write_back_bytes,
            ..Default::default()
        };
        Device::open(Box::new(data), Box::new(meta), &opts, None)
    }

    pub fn open_with(&self, accept_unclean: bool) -> Result<Device> {
        let opts = OpenOptions {
            writable: true,
            accept_unclean,
            aux_dir: Some(self.aux.path().join("meta.lsm")),
            write_back_bytes: self.write_back_bytes,
            ..Default::default()
        };
        Device::open(
            Box::new(self.data.clone()) as Box<dyn BlockFile>,
            Box::new(self.meta.clone()),
            &opts,
            None,
        )
    }
}

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
    let (v, _) = index_budget(variant);
    v.split('/').next().unwrap_or(v)
}

/// A variant without its "@N" index budget, and the budget.
fn index_budget(variant: &str) -> (&str, Option<u64>) {
    match variant.split_once('@') {
        Some((v, n)) => (v, Some(n.parse().expect("@N: a byte count"))),
        None => (variant, None),
    }
}

/// `params` with the variant's index budget, if it names one.
pub fn params(variant: &str, params: BackendParams) -> BackendParams {
    match index_budget(variant).1 {
        Some(index_memory) => BackendParams {
            index_memory,
            ..params
        },
        None => params,
    }
}

pub fn config(
    backend: &str,
    chunk_size: u32,
    logical_chunks: u64,
    physical_chunks: u64,
    hash: HashAlgo,
    verify: bool,
) -> DeviceConfig {
    // "name/codec" picks a compression (packing, for all but thin); a
    // bare name stores chunks as they are, except for the thin family,
    // whose own LZ4 C-blocks are its default.
    let (backend, _) = index_budget(backend);
    let (backend, compression) = match backend.split_once('/') {
        Some((name, codec)) => (name, Compression::parse(codec).unwrap()),
        None if dedup_core::kinds::kind(backend)
            .is_some_and(|k| k.placement == dedup_core::kinds::PlacementKind::Thin) =>
        {
            (backend, Compression::Lz4)
        }
        None => (backend, Compression::None),
    };
    DeviceConfig {
        uuid: [0x42; 16],
        backend: backend.to_string(),
        compression,
        chunk_size,
        hash,
        verify,
        logical_size: logical_chunks * chunk_size as u64,
        physical_chunks,
    }
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

pub fn lsm_dir(aux: &std::path::Path) -> std::path::PathBuf {
    aux.join("meta.lsm")
}

pub fn image(backend: &str, logical_chunks: u64, physical_chunks: u64, hash: HashAlgo) -> Image {
    let cfg = config(backend, 4096, logical_chunks, physical_chunks, hash, false);
    let data = Arc::new(MemBlockFile::new(cfg.data_device_len(), "data"));
    let meta = Arc::new(SimDisk::new(
        registry::metadata_device_len(&cfg).unwrap(),
        "meta",
        Arc::default(),
    ));
    let aux = scratch_dir();
    Device::format(
        &cfg,
        data.as_ref(),
        meta.clone(),
        &BackendParams::default(),
        Some(&lsm_dir(aux.path())),
    )
    .unwrap();
    let opts = OpenOptions {
        writable: true,
        aux_dir: Some(lsm_dir(aux.path())),
        ..Default::default()
    };
    let dev = Device::open(
        Box::new(data.clone()) as Box<dyn BlockFile>,
        Box::new(meta.clone()),
        &opts,
        None,
    )
    .unwrap();
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
        data: data.snapshot(),
        meta: meta.contents(),
        aux,
        contents,
    }
}

/// A scratch directory for lsm's files: in RAM when the machine has
/// /dev/shm (these are the simulated disks' companions, not a durability
/// test), which keeps fjall's syncs from dominating the test's time.
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
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
