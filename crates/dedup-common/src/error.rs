//! The errors of this crate's modules: the few kinds they can meet (an
//! I/O error, a wrong value, damaged compressed data, a file locked by
//! another process), each worded as dedup-core words the same kind, which
//! converts them into its own `Error` one for one.

use std::io;
use std::path::PathBuf;

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

    /// Stored bytes failed a check (compressed data that does not decode).
    #[error("corrupt metadata in {structure}: {detail}")]
    Corrupt { structure: String, detail: String },

    /// The file is locked by another process ([`crate::lock::DeviceLock`]).
    #[error(
        "device {path} is in use by another process (a running `dedup serve`?); \
         stop it first, or talk to it with `dedup status` / `dedup gc`"
    )]
    Locked { path: PathBuf },
}

impl Error {
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
}
