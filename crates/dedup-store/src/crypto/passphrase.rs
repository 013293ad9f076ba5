//! Where an encrypted repository's passphrase comes from, in order: a
//! file named on the command line (`--password-file`), the environment
//! (`DEDUP_PASSWORD`, as restic's `RESTIC_PASSWORD`, unless empty, or
//! `DEDUP_PASSWORD_FILE`), or nothing. Never from a prompt: backups run
//! unattended, and a hung prompt is a missed backup.
//!
//! A file's passphrase is its contents less one trailing newline, so
//! `echo secret > file` works and a key file of random bytes works as is.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use zeroize::Zeroizing;

use crate::error::repo::{RepoError, RepoResult};

pub type Passphrase = Zeroizing<Vec<u8>>;

static PASSWORD_FILE: OnceLock<PathBuf> = OnceLock::new();

thread_local! {
    static FOR_THIS_THREAD: RefCell<Option<Passphrase>> = const { RefCell::new(None) };
}

/// The command line's `--password-file`, for every repository this
/// process opens.
pub fn set_password_file(path: &Path) {
    let _ = PASSWORD_FILE.set(path.to_path_buf());
}

/// The passphrase of repositories this thread opens until the guard is
/// dropped: for tests, which run side by side in one process.
#[doc(hidden)]
pub fn for_this_thread(passphrase: &[u8]) -> impl Drop {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FOR_THIS_THREAD.with(|p| *p.borrow_mut() = None);
        }
    }
    FOR_THIS_THREAD.with(|p| *p.borrow_mut() = Some(Zeroizing::new(passphrase.to_vec())));
    Reset
}

fn read_file(path: &Path) -> RepoResult<Passphrase> {
    let mut bytes = Zeroizing::new(std::fs::read(path).map_err(|cause| RepoError::Io {
        context: format!("reading the passphrase from {}", path.display()),
        cause,
    })?);
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    Ok(bytes)
}

/// The passphrase, if one was given.
pub fn given() -> RepoResult<Option<Passphrase>> {
    if let Some(p) = FOR_THIS_THREAD.with(|p| p.borrow().clone()) {
        return Ok(Some(p));
    }
    if let Some(path) = PASSWORD_FILE.get() {
        return read_file(path).map(Some);
    }
    // Empty is unset: `DEDUP_PASSWORD= dedup ...` reaches a repository in
    // the clear from a shell that exports one.
    if let Some(p) = std::env::var_os("DEDUP_PASSWORD").filter(|p| !p.is_empty()) {
        use std::os::unix::ffi::OsStringExt;
        return Ok(Some(Zeroizing::new(p.into_vec())));
    }
    if let Some(path) = std::env::var_os("DEDUP_PASSWORD_FILE") {
        return read_file(Path::new(&path)).map(Some);
    }
    Ok(None)
}

/// `given`, or an error saying how to give one.
pub fn required(repo: &str) -> RepoResult<Passphrase> {
    given()?.ok_or_else(|| RepoError::NeedsPassphrase {
        repo: repo.to_string(),
    })
}
