//! Errors of the engine, as kinds a caller can match, each with a message that
//! names the thing that is wrong and, where there is one, the fix.
//!
//! Nothing in this crate panics on data that came from disk or from a client:
//! such problems become `Corrupt`, `Foreign`, `OutOfRange` or `InvalidArgument`.

use std::io;
use std::path::{Path, PathBuf};

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error, with what we were doing when it happened. (The cause
    /// is part of the message, not a separate source, so it prints once.)
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },

    /// A user-supplied option or value is wrong.
    #[error("{0}")]
    InvalidArgument(String),

    /// A request reaches past the end of the device.
    #[error(
        "I/O beyond the end of the device: offset {offset} + length {len} > device size {size}"
    )]
    OutOfRange { offset: u64, len: u64, size: u64 },

    /// The data device has no free chunk left, even after garbage collection.
    #[error(
        "no space left on the data device: all {total_chunks} chunks hold live data; \
         free space by deleting files (with TRIM/discard enabled, e.g. `fstrim`) and run `dedup gc`, \
         or create a device with a larger --physical-size"
    )]
    NoSpace { total_chunks: u64 },

    /// A metadata structure failed a check (magic, checksum, bounds, invariant).
    #[error("corrupt metadata in {structure}: {detail}")]
    Corrupt { structure: String, detail: String },

    /// A file belongs to another device or is not a dedup file at all.
    #[error("{path}: {detail}")]
    Foreign { path: PathBuf, detail: String },

    /// The device is already open in another process.
    #[error(
        "device {path} is in use by another process (a running `dedup serve`?); \
         stop it first, or talk to it with `dedup status` / `dedup gc`"
    )]
    Locked { path: PathBuf },

    /// The previous run did not shut down cleanly and this backend cannot recover.
    #[error(
        "device {path} was not shut down cleanly and its {backend} metadata was only saved at the last \
         clean stop, so mappings written since then are lost. Refusing to serve stale mappings. \
         To roll back to the last clean stop (every chunk is verified against its fingerprint; \
         chunks that no longer match read as zeros), open it with --accept-unclean \
         (nbdkit key accept_unclean=true)"
    )]
    Unclean { path: PathBuf, backend: String },

    /// The metadata is older than the data device says it should be: a copy
    /// put back from a backup, or the newest superblock slot damaged.
    #[error(
        "{meta} holds metadata generation {meta_generation}, but the data device {data} was last \
         written with generation {data_generation}: {}. Serving it would return another time's \
         data. Put back the metadata that belongs with this data device; or, to keep this older \
         metadata, run `dedup check --repair --data DIR`, which verifies every stored chunk \
         against its fingerprint and unmaps the blocks whose chunks changed since",
        if *repair_stopped { "an earlier `dedup check --repair --data` that keeps older metadata stopped before it had verified every chunk: run it again" }
        else if *damaged_slot { "the newest superblock slot is damaged and only the older one could be read" }
        else { "the metadata is older than the data (restored from a backup or copied from another time?)" }
    )]
    Stale {
        meta: PathBuf,
        data: PathBuf,
        meta_generation: u64,
        data_generation: u64,
        damaged_slot: bool,
        /// The data's record is `generation::REPAIRING`: a repair that
        /// keeps older metadata stopped half-way. Carried here so the
        /// message needs nothing from the module that writes the record.
        repair_stopped: bool,
    },

    /// The metadata has the data device's generation but stops at an older
    /// commit: a copy of the metadata taken while the device was served,
    /// put back after a crash (`generation.rs`).
    #[error(
        "{meta} stops at commit {meta_commit}, but the data device {data} records commit {data_commit} \
         of the same generation: this metadata is older than its data (a copy taken while the device \
         was served, put back?). Serving it would return another time's data. Put back the metadata \
         that belongs with this data device; or, to keep this older metadata, run \
         `dedup check --repair --data DIR`, which verifies every stored chunk against its fingerprint \
         and unmaps the blocks whose chunks changed since"
    )]
    StaleCommit {
        meta: PathBuf,
        data: PathBuf,
        meta_commit: u64,
        data_commit: u64,
    },

    /// A stop gave up acknowledged writes it could not apply (write-back).
    #[error(
        "{count} acknowledged writes could not be applied and are lost ({why}); the metadata is saved \
         and consistent, and the blocks they covered read as before them. The device is left marked \
         as not stopped cleanly: find the cause above (a damaged table block: `dedup check --repair DIR`; \
         a full or failing disk: fix it), and tell the users of the device that writes were lost"
    )]
    WritesLost { count: u64, why: String },

    /// `create` was pointed at a place that already holds a device.
    #[error("{path} already holds a dedup device; pick another directory or remove it first")]
    Exists { path: PathBuf },

    /// The device was closed; no more I/O is accepted.
    #[error("the device has been closed")]
    Closed,

    /// The caller asked for something this backend or device cannot do.
    #[error("{0}")]
    Unsupported(String),

    /// A table the device needs does not fit in this machine's memory.
    #[error(
        "not enough memory for {what} ({bytes} bytes); the inram backend keeps all metadata in RAM: \
         use a machine with more memory, a larger --chunk-size, or a smaller device"
    )]
    OutOfMemory { what: String, bytes: u64 },

    /// The process serving the device reported an error for a control request.
    #[error("the serving process reported: {0}")]
    Remote(String),
}

impl Error {
    /// The errno an NBD server should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { cause, .. } => cause.raw_os_error().unwrap_or(libc::EIO),
            Error::InvalidArgument(_) | Error::OutOfRange { .. } => libc::EINVAL,
            Error::NoSpace { .. } => libc::ENOSPC,
            Error::Locked { .. } => libc::EBUSY,
            Error::Exists { .. } => libc::EEXIST,
            Error::Closed => libc::ESHUTDOWN,
            Error::OutOfMemory { .. } => libc::ENOMEM,
            Error::Unsupported(_) => libc::ENOTSUP,
            Error::Corrupt { .. }
            | Error::Foreign { .. }
            | Error::Unclean { .. }
            | Error::Stale { .. }
            | Error::StaleCommit { .. }
            | Error::WritesLost { .. }
            | Error::Remote(_) => libc::EIO,
        }
    }

    pub fn corrupt(structure: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::Corrupt {
            structure: structure.into(),
            detail: detail.into(),
        }
    }

    pub fn io(context: impl Into<String>, cause: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            cause,
        }
    }

    pub fn foreign(path: &Path, detail: impl Into<String>) -> Error {
        Error::Foreign {
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

/// The errors of the modules shared with the backup store (dedup-common),
/// kind for kind: the same message, and the same errno for NBD.
impl From<dedup_common::Error> for Error {
    fn from(e: dedup_common::Error) -> Error {
        match e {
            dedup_common::Error::Io { context, cause } => Error::Io { context, cause },
            dedup_common::Error::InvalidArgument(s) => Error::InvalidArgument(s),
            dedup_common::Error::Corrupt { structure, detail } => {
                Error::Corrupt { structure, detail }
            }
            dedup_common::Error::Locked { path } => Error::Locked { path },
        }
    }
}

/// Attach "what we were doing" to an `io::Result`.
pub trait IoContext<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(what(), e))
    }
}

/// What a caught panic said, if it said it with a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}
