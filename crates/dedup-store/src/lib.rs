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

pub mod container;
pub mod error;
pub mod format;
pub mod index;
pub mod local;
pub mod name;
pub mod objects;
pub mod writer;

pub use container::{container_name, Catalog, Container};
pub use error::{Error, Result};
pub use format::{Entry, Location};
pub use index::{Advice, Eviction, Index, IndexConfig, SamplingRate};
pub use local::LocalDir;
pub use objects::ObjectStore;
pub use writer::ContainerWriter;
