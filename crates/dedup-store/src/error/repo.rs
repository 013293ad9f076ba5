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

    /// A second process opened the repository to write. `holder` names
    /// the writer of a repository in a bucket, whose lock a dead process
    /// can leave behind.
    #[error("{repo}: the repository is in use by {} that writes to it; back up through that process (dedup store serve) or wait for it to finish{}", in_use_by(.holder), unlock_hint(.repo, .holder))]
    InUse {
        repo: String,
        holder: Option<String>,
    },

    /// An encrypted repository opened without a passphrase.
    #[error("{repo}: the repository is encrypted; give its passphrase in DEDUP_PASSWORD, or in a file with --password-file FILE or DEDUP_PASSWORD_FILE")]
    NeedsPassphrase { repo: String },

    /// No key object of an encrypted repository opens with the passphrase.
    #[error("{repo}: the passphrase opens none of the repository's {keys} key(s); check DEDUP_PASSWORD or the --password-file given")]
    WrongPassphrase { repo: String, keys: usize },

    /// `gc` while another GC runs on the same handle.
    #[error("a garbage collection is already running")]
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

    /// Reading the stream to back up, or writing a restore, failed.
    #[error("{context}: {cause}")]
    Io { context: String, cause: io::Error },
}

/// Who writes to a repository that is in use, in words.
pub fn in_use_by(holder: &Option<String>) -> &str {
    holder.as_deref().unwrap_or("another process")
}

/// How to remove the lock of a named holder (one in a bucket, which a
/// dead process can leave behind); nothing for a directory's.
pub fn unlock_hint(repo: &str, holder: &Option<String>) -> String {
    holder
        .as_ref()
        .map(|_| {
            format!("; if that process is gone, remove its lock with `dedup store unlock {repo}`")
        })
        .unwrap_or_default()
}

impl RepoError {
    pub fn corrupt(object: impl Into<String>, detail: impl Into<String>) -> RepoError {
        RepoError::Corrupt {
            object: object.into(),
            detail: detail.into(),
        }
    }
}
