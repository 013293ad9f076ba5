//! The in-memory device rig every engine test builds on, written once: a
//! device on two memory disks that a test can open, close, crash, damage
//! and reopen. The engine's unit tests reach it as `crate::testrig`, the
//! integration tests (`tests/device/`) as `dedup_core::testrig`. It is
//! compiled into every build (hidden from the docs; nothing outside the
//! tests calls it) because a test-only feature made Cargo build the crate
//! twice in a workspace test run.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::blockfile::sim::SimDisk;
use crate::blockfile::{BlockFile, MemBlockFile};
use crate::compress::Compression;
use crate::config::DeviceConfig;
use crate::engine::Device;
use crate::error::Result;
use crate::fingerprint::HashAlgo;
use crate::kinds::{self, PlacementKind};
use crate::options::{BackendParams, OpenOptions};
use crate::registry;

/// A formatted device on memory disks, kept so a test can reopen it.
pub struct MemDevice {
    pub cfg: DeviceConfig,
    pub data: Arc<MemBlockFile>,
    /// A simulated disk: it grows like a file (the B-tree stores need
    /// that) and never loses a write unless a test asks it to.
    pub meta: Arc<SimDisk>,
    /// Where the lsm store keeps its files.
    pub aux: tempfile::TempDir,
    /// Write-back queue of the devices opened (0: off).
    pub write_back_bytes: u64,
}

impl MemDevice {
    /// The default store, with `chunk_size` chunks, BLAKE3, verify off.
    pub fn new(chunk_size: u32, logical_chunks: u64, physical_chunks: u64) -> MemDevice {
        Self::with(
            chunk_size,
            logical_chunks,
            physical_chunks,
            HashAlgo::Blake3,
            false,
        )
    }

    /// The default store, with the hash and verify mode given.
    /// `HashAlgo::Weak4` is for the crate's unit tests: only a unit-test
    /// build maps its on-disk code back, so such a device made from an
    /// integration test cannot be reopened.
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

    /// A device of the given configuration, formatted.
    pub fn format(cfg: DeviceConfig, params: &BackendParams) -> MemDevice {
        let data = Arc::new(MemBlockFile::new(cfg.data_device_len(), "data"));
        let meta_len =
            registry::metadata_device_len(&cfg).expect("a test's configuration is valid");
        let meta = Arc::new(SimDisk::new(meta_len, "meta", Arc::default()));
        let aux = scratch_dir();
        Device::format(
            &cfg,
            data.as_ref(),
            meta.clone(),
            params,
            Some(&lsm_dir(aux.path())),
        )
        .expect("a test's device formats");
        MemDevice {
            cfg,
            data,
            meta,
            aux,
            write_back_bytes: 0,
        }
    }

    /// What the devices are opened with unless a test says otherwise:
    /// writable, lsm's files in the scratch directory, the rig's write-back.
    pub fn options(&self) -> OpenOptions {
        OpenOptions {
            writable: true,
            aux_dir: Some(lsm_dir(self.aux.path())),
            write_back_bytes: self.write_back_bytes,
            ..Default::default()
        }
    }

    pub fn open(&self) -> Result<Device> {
        self.open_with(false)
    }

    pub fn open_with(&self, accept_unclean: bool) -> Result<Device> {
        self.open_opts(OpenOptions {
            accept_unclean,
            ..self.options()
        })
    }

    /// Open the two memory disks with these options.
    pub fn open_opts(&self, opts: OpenOptions) -> Result<Device> {
        Device::open(
            Box::new(self.data.clone()) as Box<dyn BlockFile>,
            Box::new(self.meta.clone()),
            &opts,
            None,
        )
    }

    /// Open through arbitrary wrappers of the two memory devices.
    pub fn open_on(&self, data: Box<dyn BlockFile>, meta: Box<dyn BlockFile>) -> Result<Device> {
        Device::open(data, meta, &self.options(), None)
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
            accept_stale,
            ..self.options()
        };
        Device::open(Box::new(data), Box::new(meta), &opts, None)
    }
}

/// A device configuration for tests. `backend` is a `--backend` name,
/// optionally "name/codec" for a compression and "@N" for an index memory
/// (the "@N" is read by the caller's `BackendParams`, not here).
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
    let backend = backend.split_once('@').map_or(backend, |(v, _)| v);
    let (backend, compression) = match backend.split_once('/') {
        Some((name, codec)) => (
            name,
            Compression::parse(codec).expect("a test names a known codec"),
        ),
        None if kinds::kind(backend).is_some_and(|k| k.placement == PlacementKind::Thin) => {
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

/// Where lsm keeps its files in a scratch directory.
pub fn lsm_dir(aux: &Path) -> PathBuf {
    aux.join("meta.lsm")
}

/// A scratch directory for lsm's files: in RAM when the machine has
/// /dev/shm (these are the simulated disks' companions, not a durability
/// test), which keeps fjall's syncs from dominating the test's time.
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory")
}
