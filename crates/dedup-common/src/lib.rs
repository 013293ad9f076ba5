//! dedup-common: what the block device (dedup-core) and the backup store
//! (dedup-store) share, and nothing else: chunk fingerprints and the
//! BLAKE3 batch hasher, the compression codecs, owner-only files and
//! sockets, the exclusive lock, byte sizes as people type them, and the
//! reproducible test data. It depends on no other dedup crate, so the
//! store builds without the device's metadata stores (redb, fjall).
//!
//! dedup-core re-exports each module at its old path
//! (`dedup_core::fingerprint`, ...), so the device's code did not change.

pub mod blake3_batch;
pub mod compress;
pub mod error;
pub mod fingerprint;
pub mod lock;
pub mod perms;
pub mod size;
pub mod testdata;

pub use error::{Error, Result};
