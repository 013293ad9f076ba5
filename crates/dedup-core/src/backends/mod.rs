//! The registry of metadata backends: the one place that maps a backend's
//! name to its code. The engine only ever sees `Box<dyn MetadataBackend>`.

pub mod cowbtree;
pub mod disktable;
pub mod inram;
pub mod kv;
pub mod lsm;
pub mod packed;
pub mod probe;
pub mod space_map;
pub mod thin;

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::MetadataBackend;
use crate::blockfile::BlockFile;
use crate::codec::{Decoder, Encoder};
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::superblock::{Superblock, SUPERBLOCK_AREA};

/// Backends users can pick with `dedup create --backend`.
pub const NAMES: &[&str] = &[
    inram::NAME,
    disktable::NAME,
    cowbtree::NAME,
    lsm::NAME,
    thin::backend::THIN,
    thin::backend::ORDERED,
    thin::backend::IDEAL,
];

/// Every backend the library can format and open (all are offered).
pub const ALL: &[&str] = NAMES;
pub const DEFAULT: &str = inram::NAME;

/// Tunables chosen at create time and recorded in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendParams {
    /// Metadata cache (buffer cache, B-tree cache, LSM block cache) in bytes.
    pub cache_bytes: u64,
    /// Writes per transaction (cowbtree, lsm); 0 = only FLUSH/FUA and cache
    /// pressure end one.
    pub txn_writes: u64,
    /// thin, ordered, ideal: new chunks per window, and the longest a
    /// window stays open (recorded in thin's own header).
    pub window: thin::backend::WindowParams,
}

pub const MIN_CACHE_BYTES: u64 = 256 << 10;

impl Default for BackendParams {
    fn default() -> Self {
        BackendParams {
            cache_bytes: 64 << 20,
            txn_writes: 1000,
            window: Default::default(),
        }
    }
}

const PARAMS_VERSION: u32 = 1;

impl BackendParams {
    pub fn validate(&self) -> Result<()> {
        if self.cache_bytes < MIN_CACHE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "a metadata cache of {} bytes is too small: give at least 256K (e.g. --cache 64M)",
                self.cache_bytes
            )));
        }
        Ok(())
    }

    /// The leading bytes of a persistent backend's superblock area.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u32(PARAMS_VERSION)
            .u64(self.cache_bytes)
            .u64(self.txn_writes);
        e.buf
    }

    pub fn decode(area: &[u8]) -> Result<BackendParams> {
        const S: &str = "backend parameters (superblock backend area)";
        let mut d = Decoder::new(area, S);
        let version = d.u32()?;
        if version != PARAMS_VERSION {
            return Err(Error::corrupt(S, format!("unknown version {version}")));
        }
        let p = BackendParams {
            cache_bytes: d.u64()?,
            txn_writes: d.u64()?,
            window: Default::default(),
        };
        p.validate().map_err(|e| Error::corrupt(S, e.to_string()))?;
        Ok(p)
    }
}

#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Open for serving (false: inspect only, write nothing).
    pub writable: bool,
    /// Accept a roll-back to the last saved state after an unclean stop
    /// (backends that are not crash-safe).
    pub accept_unclean: bool,
    /// Override the metadata cache size recorded at create time.
    pub cache_bytes: Option<u64>,
    /// Directory for a backend that keeps files of its own (lsm); see `aux_dir`.
    pub aux_dir: Option<PathBuf>,
    /// Opened by `check` or `repair`: damage those report and fix (totals
    /// that disagree with the tables, entries naming PBNs beyond the data
    /// device) is logged instead of refusing the open. Never set to serve.
    pub for_check: bool,
    /// Write-back: mutations are acknowledged once queued in RAM, up to
    /// this many bytes of write data, and applied by background threads;
    /// FLUSH and FUA wait for them (see `engine/writeback.rs`). 0: every
    /// request is applied before it is acknowledged.
    pub write_back_bytes: u64,
    /// Writes smaller than this are applied before they are acknowledged
    /// even with write-back on: for them a copy and a hand-over to an
    /// applier cost more than the write (0: every size may be queued).
    pub write_back_from_bytes: u64,
}

pub struct Opened {
    pub backend: Box<dyn MetadataBackend>,
    /// The backend rolled back to older metadata after an unclean stop; the
    /// engine must verify stored chunks before serving.
    pub rolled_back: bool,
}

pub fn check_name(name: &str) -> Result<()> {
    if ALL.contains(&name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "unknown backend {name:?}: choose one of {}",
            NAMES.join(", ")
        )))
    }
}

/// The metadata size benchmarks scale caches by (as Dmdedup §4.1 does):
/// one LBN map entry (8 bytes) per logical chunk, and per physical chunk a
/// reference count (4 bytes) and a hash table slot (40 bytes, 10 % spare).
pub fn metadata_reference_bytes(cfg: &DeviceConfig) -> u64 {
    cfg.logical_chunks() * 8 + cfg.physical_chunks * (4 + 44)
}

/// Whether a backend recovers on its own after a crash (all but INRAM and
/// thin's `ideal` policy, the in-memory upper bound).
pub fn crash_safe(name: &str) -> bool {
    name != inram::NAME && name != thin::backend::IDEAL
}

/// How much metadata device a backend needs at create time.
#[derive(Clone, Copy, Debug)]
pub struct MetaSpace {
    /// Bytes the device must hold now (files may grow later where `grows`).
    pub len: u64,
    /// Whether the metadata grows into a regular file as needed.
    pub grows: bool,
}

pub fn metadata_space(cfg: &DeviceConfig) -> Result<MetaSpace> {
    check_name(&cfg.backend)?;
    Ok(match cfg.backend.as_str() {
        inram::NAME => MetaSpace {
            len: inram::metadata_device_len(cfg),
            grows: false,
        },
        disktable::NAME => MetaSpace {
            len: disktable::metadata_device_len(cfg),
            grows: false,
        },
        thin::backend::THIN | thin::backend::ORDERED | thin::backend::IDEAL => MetaSpace {
            len: thin::backend::metadata_device_len(cfg),
            grows: false,
        },
        lsm::NAME => MetaSpace {
            len: SUPERBLOCK_AREA,
            grows: false,
        },
        _ => MetaSpace {
            len: SUPERBLOCK_AREA + (1 << 20),
            grows: true,
        },
    })
}

/// Bytes the metadata device needs for this device (at create time).
pub fn metadata_device_len(cfg: &DeviceConfig) -> Result<u64> {
    metadata_space(cfg).map(|s| s.len)
}

/// Write an empty metadata layout (superblock included) for a new device.
/// `aux_dir` is where a backend with files of its own (lsm) keeps them.
pub fn format(
    cfg: &DeviceConfig,
    meta: Arc<dyn BlockFile>,
    params: &BackendParams,
    aux_dir: Option<&std::path::Path>,
) -> Result<()> {
    check_name(&cfg.backend)?;
    params.validate()?;
    match cfg.backend.as_str() {
        inram::NAME => inram::format(cfg, meta.as_ref()),
        disktable::NAME => disktable::format(cfg, meta.as_ref(), params),
        cowbtree::NAME => cowbtree::format(cfg, Box::new(meta), params),
        lsm::NAME => lsm::format(cfg, meta, params, aux_dir),
        thin::backend::THIN | thin::backend::ORDERED | thin::backend::IDEAL => {
            thin::backend::format(cfg, meta.as_ref(), params, params.window)
        }
        _ => unreachable!("check_name accepted it"),
    }
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    if let Some(cache) = opts.cache_bytes {
        BackendParams {
            cache_bytes: cache,
            ..BackendParams::default()
        }
        .validate()?;
    }
    let cfg = superblock.config.clone();
    let mut opened = match superblock.config.backend.as_str() {
        inram::NAME => inram::open(superblock, meta, opts),
        disktable::NAME => disktable::open(superblock, meta, opts),
        cowbtree::NAME => cowbtree::open(superblock, meta, opts),
        lsm::NAME => lsm::open(superblock, meta, opts),
        thin::backend::THIN | thin::backend::ORDERED | thin::backend::IDEAL => {
            thin::backend::open(superblock, meta, opts)
        }
        other => Err(Error::Unsupported(format!(
            "this metadata uses the {other:?} backend, which this dedup does not have (it has {})",
            NAMES.join(", ")
        ))),
    }?;
    if cfg.packs() {
        opened.backend = packed::wrap(&cfg, opened.backend, opts.for_check)?;
    }
    Ok(opened)
}

/// Where a backend that keeps files of its own (lsm) puts them: next to the
/// metadata device's path (`DIR/meta` -> `DIR/meta.lsm`).
pub fn aux_dir(meta_path: &std::path::Path) -> PathBuf {
    let mut p = meta_path.as_os_str().to_owned();
    p.push(".lsm");
    PathBuf::from(p)
}
