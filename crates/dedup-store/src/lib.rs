//! The start of dedup's deduplicating backup store (issue 17), after Guo &
//! Efstathopoulos, "Building a High-performance Deduplication System"
//! (USENIX ATC 2011), §3.1: segments are stored in large *containers*, each
//! a run of frames (consecutive segments compressed together) followed by
//! a *catalog* of their fingerprints and locations, and all container I/O goes through a narrow
//! object-store seam so the store can live in a local directory now and on
//! an S3-like service later.
//!
//! Built so far: the seam ([`ObjectStore`], [`LocalDir`]), object names,
//! the container format ([`ContainerWriter`], [`Container`], [`Catalog`]),
//! and a [`Repository`] that backs up and restores streams (§3.1's File
//! Manager, single-process): a checksummed config, streams cut into fixed
//! 4 KiB or FastCDC segments ([`Segmenting`]), dedup through the
//! [`SegmentIndex`] seam (an exact in-RAM [`ExactIndex`] rebuilt from the
//! catalogs at open; its hints are always checked against a catalog),
//! recipes that locate every segment so a restore needs no index (written
//! and read in parts, so a stream of any size holds one part in RAM), and
//! backup objects in groups, written last as each backup's commit point.
//! `FORMATS.md` gives the bytes.
//!
//! The store's sampled fingerprint index after §3.2 ([`Index`]: hooks
//! sampled progressively within a memory budget, a catalog-prefetch
//! cache, rebuild from the catalogs and a checkpoint) is built, and wired
//! in behind the [`SegmentIndex`] seam as [`SampledSegmentIndex`], which prefetches
//! catalogs through the repository's object store and answers only with
//! entries it found in a catalog: [`Repository::open_sampled`] opens a
//! repository with it (`open` keeps [`ExactIndex`]).
//!
//! One [`Repository`] handle is shared by every backup of a process
//! (`Send + Sync`, `&self`): each backup is a [`BackupSession`] filling its
//! own container, meeting the others only in short critical sections (the
//! index, a bounded catalog cache, the protection map that keeps GC off
//! what running backups use). One process writes (an exclusive lock on the
//! config object in a directory, a lock object in a bucket); others may
//! open read-only to list, restore and check.
//!
//! [`Repository::open_sampled`] starts from the newest index checkpoint
//! (`index/hooks-*`, left by the last writing handle) and reads only the
//! catalogs of containers sealed after it; the CLI opens with it by
//! default.
//!
//! `store check` ([`check::check`], [`Repository::check`]) verifies a
//! repository without writing to it: the config, every backup object and
//! the recipe (and tree) it names, every container's header, catalog and
//! trailer, and that each recipe reference finds a catalog entry with its
//! fingerprint and length; with `data` it also reads each container whole,
//! once, and verifies every segment's crc32c and its BLAKE3 after
//! decompressing. Each problem names the damaged object and the backups it
//! costs; recipes, trees and containers no committed backup needs are
//! listed as garbage, not damage.
//!
//! Garbage collection is the paper's grouped mark-and-sweep (§3.3,
//! [`Repository::gc`], `gc/`): per-group marks reused while a group is
//! unchanged, containers no marks reference deleted once the protection
//! map condemns them, mostly dead containers compacted in place (same id
//! and entry numbers, dead entries removed), orphan recipes, recipe parts
//! and trees removed.
//!
//! Backups of files and directories ([`Repository::backup_paths`],
//! [`Repository::restore_tree`]) are one stream of the files' contents
//! plus a tree object of their metadata ([`Tree`]; walk in [`TreeWalk`]).
//!
//! [`rpc`] serves one writable repository to many clients at once (§3.4,
//! `dedup store serve`): a pipelined client cuts and hashes its stream,
//! looks fingerprints up in batches with several in flight, and sends only
//! the segments the server lacks, which the server hashes again.
//!
//! A repository lives in a local directory or in an S3 bucket
//! ([`RepoLocation`]; [`s3::S3Store`] implements the seam on the
//! `object_store` crate: create-only puts, retries, request counts). Any
//! number of processes write into one repository at once, with garbage
//! collection beside them and no lock (`epochs/`).
//!
//! Not built yet: an index choice recorded in the repository.

pub mod backup;
pub mod backup_blocks;
mod backup_stream;
pub mod block_map;
pub mod catalog_bytes;
mod catalog_cache;
mod catalog_spill;
pub mod check;
pub mod config;
pub mod container;
pub mod crypto;
pub mod direct_write;
pub mod epochs;
pub mod error;
pub mod format;
mod fp_map;
mod framed;
pub mod fuzzing;
pub mod gc;
pub mod index;
mod inflight;
pub mod local;
mod local_cache;
pub mod name;
pub mod objects;
pub mod parallel_cut;
mod pinning;
pub mod process;
mod protection;
mod read_windows;
pub mod recipe;
pub mod repo;
pub mod repo_location;
mod restore;
pub mod rpc;
pub mod s3;
pub mod segment_blocks;
pub mod segment_hash;
pub mod segmenter;
pub mod session;
pub mod tree;
pub mod writer;

pub use container::{container_name, Catalog, Container};
pub use error::{Error, Result};
pub use format::{Entry, Location};
pub use index::{Advice, Eviction, Index, IndexConfig, SampledSegmentIndex, SamplingRate};
pub use local::LocalDir;
pub use objects::ObjectStore;
pub use repo_location::RepoLocation;
pub use writer::ContainerWriter;

pub use backup::{BackupRecord, BackupReport};
pub use check::{CheckOptions, CheckProgress, CheckReport};
pub use config::RepoConfig;
pub use error::repo::{RepoError, RepoResult};
pub use gc::{GcOptions, GcReport};
pub use index::seam::{ExactIndex, IndexRam, SegmentIndex};
pub use recipe::{Recipe, SegmentRef};
pub use repo::listing::{DamagedBackup, Listing};
pub use repo::{RepoOptions, Repository};
pub use restore::at_offsets::WriteAt;
pub use restore::blocks::{BlockTarget, BlocksRestored, RestorePass};
pub use restore::salvage::{DamagedRange, Salvage};
pub use segmenter::Segmenting;
pub use session::BackupSession;
pub use tree::backup::TreeBackupReport;
pub use tree::restore::{DamagedEntry, RestoreOptions, RestoreReport};
pub use tree::walk::{TreeWalk, WalkCounts};
pub use tree::writer::{EncodedTree, TreeWriter};
pub use tree::Tree;
