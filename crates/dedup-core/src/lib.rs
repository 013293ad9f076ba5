//! dedup-core: an inline, block-level deduplication engine after Dmdedup
//! (Tarasov et al.): chunking, fingerprints, the write path of Figure 2,
//! pluggable metadata stores and data placements, garbage collection, statistics, checking.
//!
//! This crate knows nothing of NBD or of the command line; `dedup-nbd` and
//! `dedup-cli` sit on top of [`engine::Device`].

pub mod backend;
pub mod backends;
pub mod blockfile;
mod change_flags;
pub mod changes;
mod codec;
pub mod config;
pub mod control;
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod generation;
pub mod grow;
pub mod guard;
pub mod kinds;
pub mod layout;
pub mod options;
pub mod pack;
pub mod placement;
pub mod record;
pub mod registry;
pub mod stats;
pub mod superblock;
#[doc(hidden)]
pub mod testrig;
pub mod zeroed;

// What the device shares with the backup store lives in dedup-common;
// re-exported at its old paths, so `crate::fingerprint` and
// `dedup_core::fingerprint` still name it.
pub use dedup_common::{blake3_batch, compress, fingerprint, lock, perms, size, testdata};

pub use backends::OpenOptions;
pub use changes::Changes;
pub use engine::{ChunkState, Device, SnapshotStart};
pub use error::{Error, Result};
