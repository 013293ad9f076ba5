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
