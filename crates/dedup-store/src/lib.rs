//! The start of dedup's deduplicating backup store (issue 17), after Guo &
//! Efstathopoulos, "Building a High-performance Deduplication System"
//! (USENIX ATC 2011), §3.1: segments are stored in large *containers*, each
//! a run of compressed segments followed by a *catalog* of their
//! fingerprints and locations, and all container I/O goes through a narrow
//! object-store seam so the store can live in a local directory now and on
//! an S3-like service later.
//!
//! Built so far: the seam ([`ObjectStore`], [`LocalDir`]), object names,
//! and the container format ([`ContainerWriter`], [`Container`],
//! [`Catalog`]); `FORMATS.md` gives the bytes.
//!
//! Not built yet: the fingerprint index (the paper's sampled index and
//! catalog-prefetch cache), the Segment Manager that fills and seals
//! containers for concurrent backups, the File Manager (files, backups,
//! backup groups), chunking of backup streams, reference tracking and
//! grouped mark-and-sweep, and an S3 implementation of the seam.

pub mod backup;
mod backup_stream;
pub mod config;
pub mod container;
pub mod error;
pub mod format;
mod framed;
pub mod local;
pub mod name;
pub mod objects;
pub mod recipe;
pub mod repo;
pub mod repo_error;
mod restore;
pub mod segment_index;
pub mod segmenter;
pub mod writer;

pub use container::{container_name, Catalog, Container};
pub use error::{Error, Result};
pub use format::{Entry, Location};
pub use local::LocalDir;
pub use objects::ObjectStore;
pub use writer::ContainerWriter;

pub use backup::{BackupRecord, BackupReport};
pub use config::RepoConfig;
pub use recipe::{Recipe, SegmentRef};
pub use repo::{RepoOptions, Repository};
pub use repo_error::{RepoError, RepoResult};
pub use segment_index::{ExactIndex, SegmentIndex};
pub use segmenter::Segmenting;
