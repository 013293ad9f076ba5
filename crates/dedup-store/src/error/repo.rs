//! Errors of the repository layer (backups, recipes, restores), each naming
//! the directory, backup or object that is wrong. Container and object-store
//! errors pass through as `Store`, which already name their object.

use std::io;
use std::path::PathBuf;

pub type RepoResult<T> = std::result::Result<T, RepoError>;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error(transparent)]
    Store(#[from] crate::error::Error),

    /// `init` of a directory or bucket prefix that already holds something.
    /// (`repo`s are `RepoLocation`s as text.)
    #[error("{repo}: not empty; refusing to create a repository over it (use force)")]
    NotEmpty { repo: String },

    /// `open` of a directory or bucket prefix that is not a repository.
    #[error("{repo}: not a dedup repository: {detail}")]
    NotARepository { repo: String, detail: String },

    /// A repository object (config, recipe, backup) failed a check.
    #[error("corrupt object {object}: {detail}")]
    Corrupt { object: String, detail: String },

    #[error("invalid backup or group name {name:?}: {reason}")]
    BadName { name: String, reason: String },

    #[error("backup {name} already exists")]
    BackupExists { name: String },

    #[error("no backup named {name}")]
    NoSuchBackup { name: String },

    /// An encrypted repository opened without a passphrase.
    #[error("{repo}: the repository is encrypted; give its passphrase in DEDUP_PASSWORD, or in a file with --password-file FILE or DEDUP_PASSWORD_FILE")]
    NeedsPassphrase { repo: String },

    /// No key object of an encrypted repository opens with the passphrase.
    #[error("{repo}: the passphrase opens none of the repository's {keys} key(s); check DEDUP_PASSWORD or the --password-file given")]
    WrongPassphrase { repo: String, keys: usize },

    /// A backup that reuses data a collection in another process condemned
    /// (a backup deleted while it ran), which a later collection may have
    /// deleted: it stopped before committing.
    #[error("backup {name} was stopped before committing: a garbage collection running beside it condemned data it reuses (a backup deleted while it ran); nothing was committed, run it again")]
    Overtaken { name: String },

    /// A backup asked to commit after one of its containers failed to be
    /// written: what it references is not all stored.
    #[error("backup {name} cannot be committed: writing one of its containers failed earlier ({detail}); nothing was committed, run it again")]
    Incomplete { name: String, detail: String },

    /// A backup whose backup object was put, but the look at the epochs
    /// that confirms it failed: it is listed, and almost surely whole.
    #[error("backup {name} was committed but could not be confirmed ({detail}): a garbage collection running beside it may have removed data it reuses; `dedup store check` tells, or delete it and run it again")]
    Unconfirmed { name: String, detail: String },

    /// `gc` while another GC runs on the same handle, or one in another
    /// process began the same epoch first.
    #[error("a garbage collection is already running (in this process, or another process began the same collection first); the running one frees what is unreferenced, run gc again once it is done")]
    GcRunning,

    /// A write through a handle opened with `open_read_only`.
    #[error("the repository was opened read-only")]
    ReadOnly,

    /// A restore of files into a directory that already holds something.
    #[error("{}: not empty; refusing to restore into it (use force to restore over what is there)", .dir.display())]
    TargetNotEmpty { dir: PathBuf },

    /// A restore of files from a backup of a stream, or the reverse.
    #[error("backup {name} {detail}")]
    WrongKind { name: String, detail: String },

    /// A path to restore that the backup does not hold.
    #[error("nothing in backup {name} is at or under {path}")]
    NoSuchPath { name: String, path: String },

    /// A backup by fingerprint read a block whose bytes do not match the
    /// fingerprint its device recorded for it.
    #[error("backup {name} stopped: {what}; nothing was stored under that fingerprint and nothing was committed")]
    SourceMismatch { name: String, what: String },

    /// Reading the stream to back up, or writing a restore, failed.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

impl RepoError {
    pub fn corrupt(object: impl Into<String>, detail: impl Into<String>) -> RepoError {
        RepoError::Corrupt {
            object: object.into(),
            detail: detail.into(),
        }
    }
}
