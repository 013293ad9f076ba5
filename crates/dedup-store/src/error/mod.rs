//! Errors of the store, as kinds a caller can match (the object-store model
//! test and a later S3 implementation need `Exists` and `NotFound` apart from
//! I/O), each naming the object or container that is wrong.
//!
//! Nothing here panics on bytes read back from a store: bad bytes become
//! `Corrupt`.

use std::io;

pub mod repo;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An object name outside the safe alphabet or shape (see `name.rs`).
    #[error("invalid object name {name:?}: {reason}")]
    BadName { name: String, reason: String },

    /// `put` of a name that is already stored: objects are immutable.
    #[error("object {name} already exists: objects are immutable and never overwritten")]
    Exists { name: String },

    #[error("object {name} does not exist")]
    NotFound { name: String },

    /// A ranged read that reaches past the end of the object.
    #[error("object {name}: range {offset}+{len} reaches past its end ({size} bytes)")]
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },

    /// An I/O error, with what we were doing when it happened.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },

    /// A container (or a sealed object) failed a check: magic, version,
    /// checksum, bounds, authentication tag.
    #[error("corrupt object {container}: {detail}")]
    Corrupt { container: String, detail: String },

    /// A caller's value is out of bounds (a segment too large, a full writer).
    #[error("{0}")]
    InvalidArgument(String),
}

impl Error {
    pub fn io(context: impl Into<String>, cause: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            cause,
        }
    }

    pub fn out_of_range(name: &str, offset: u64, len: u64, size: u64) -> Error {
        Error::OutOfRange {
            name: name.to_string(),
            offset,
            len,
            size,
        }
    }

    pub fn corrupt(container: impl Into<String>, detail: impl Into<String>) -> Error {
        Error::Corrupt {
            container: container.into(),
            detail: detail.into(),
        }
    }
}
