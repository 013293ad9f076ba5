//! The registry of metadata backends: the one place that maps a backend's
//! name to its code. The engine only ever sees `Box<dyn MetadataBackend>`.

pub mod inram;

use crate::backend::MetadataBackend;
use crate::blockfile::BlockFile;
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::superblock::Superblock;

/// Backends users can pick with `dedup create --backend`.
pub const NAMES: &[&str] = &[inram::NAME];
pub const DEFAULT: &str = inram::NAME;

#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Open for serving (false: inspect only, write nothing).
    pub writable: bool,
    /// Accept a roll-back to the last saved state after an unclean stop.
    pub accept_unclean: bool,
}

pub struct Opened {
    pub backend: Box<dyn MetadataBackend>,
    /// The backend rolled back to older metadata after an unclean stop; the
    /// engine must verify stored chunks before serving.
    pub rolled_back: bool,
}

pub fn check_name(name: &str) -> Result<()> {
    if NAMES.contains(&name) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "unknown backend {name:?}: choose one of {}",
            NAMES.join(", ")
        )))
    }
}

/// Bytes the metadata device needs for this device.
pub fn metadata_device_len(cfg: &DeviceConfig) -> Result<u64> {
    check_name(&cfg.backend)?;
    Ok(inram::metadata_device_len(cfg))
}

/// Write an empty metadata layout (superblock included) for a new device.
pub fn format(cfg: &DeviceConfig, meta: &dyn BlockFile) -> Result<()> {
    check_name(&cfg.backend)?;
    inram::format(cfg, meta)
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    match superblock.config.backend.as_str() {
        inram::NAME => inram::open(superblock, meta, opts),
        other => Err(Error::Unsupported(format!(
            "this metadata uses the {other:?} backend, which this dedup does not have (it has {})",
            NAMES.join(", ")
        ))),
    }
}
