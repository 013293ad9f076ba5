//! This machine's cache for the store: `$XDG_CACHE_HOME/dedup`, else
//! `~/.cache/dedup`, private to the user (0700). What is kept there is
//! never needed: losing it costs requests, never data.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

/// The cache directory `sub` inside it, made (0700) if missing; `None` if
/// there is no home to put it in or it cannot be made.
pub(crate) fn dir(sub: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let dir = base.join("dedup").join(sub);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .ok()?;
    Some(dir)
}
