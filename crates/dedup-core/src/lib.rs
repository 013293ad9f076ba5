//! dedup-core: an inline, block-level deduplication engine after Dmdedup
//! (Tarasov et al.): chunking, fingerprints, the write path of Figure 2,
//! pluggable metadata stores and data placements, garbage collection, statistics, checking.
//!
//! This crate knows nothing of NBD or of the command line; `dedup-nbd` and
//! `dedup-cli` sit on top of [`engine::Device`].

pub mod backend;
pub mod backends;
pub mod blake3_batch;
pub mod blockfile;
mod codec;
pub mod compress;
pub mod config;
pub mod control;
pub mod engine;
pub mod error;
pub mod fingerprint;
#[doc(hidden)]
pub mod fuzzing;
pub mod generation;
pub mod grow;
pub mod guard;
pub mod kinds;
pub mod layout;
pub mod lock;
pub mod options;
pub mod pack;
pub mod perms;
pub mod placement;
pub mod record;
pub mod registry;
pub mod size;
pub mod stats;
pub mod superblock;
pub mod testdata;
#[cfg(any(test, feature = "test-rig"))]
pub mod testrig;
pub mod zeroed;

pub use backends::OpenOptions;
pub use engine::Device;
pub use error::{Error, Result};
