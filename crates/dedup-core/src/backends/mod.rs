//! The metadata stores (Dmdedup §2.6): one directory each, behind the
//! `MetadataBackend` trait (their create-time parameters are in `options`). Which
//! store a device uses, and with which data placement, is decided in one
//! place: `registry`.

pub mod counts;
pub mod cowbtree;
pub mod disktable;
pub mod inram;
pub mod kv;
pub mod lsm;
pub mod probe;
pub mod skeleton;
pub mod space_map;
pub mod sparse;

use std::path::PathBuf;

use crate::backend::MetadataBackend;

/// What to do about damage inside a store kept in a storage engine's own
/// format or a saved image (inram, cowbtree, lsm), which keep their own
/// checksums: `check --repair` rebuilds only disktable's and sparse's table
/// blocks.
pub(crate) const NOT_REBUILT: &str = "`dedup check --repair` cannot rebuild this store's own format; put back a copy of the metadata taken while the device was stopped";

pub use crate::options::{BackendParams, OpenOptions, WindowParams, MIN_CACHE_BYTES};

/// A store as opened by its `open` function.
pub struct Opened {
    pub backend: Box<dyn MetadataBackend>,
    /// The store rolled back to older metadata after an unclean stop; the
    /// engine must verify stored chunks before serving.
    pub rolled_back: bool,
}

/// Where a backend that keeps files of its own (lsm) puts them: next to the
/// metadata device's path (`DIR/meta` -> `DIR/meta.lsm`).
pub fn aux_dir(meta_path: &std::path::Path) -> PathBuf {
    let mut p = meta_path.as_os_str().to_owned();
    p.push(".lsm");
    PathBuf::from(p)
}
