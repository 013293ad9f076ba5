//! The one writing process of a repository, until writers need no lock.
//!
//! In a directory, the writer holds an `flock` on the config object: the
//! kernel drops it when the process dies, so it is never stale. A bucket
//! has no such thing, so there the writer creates the object
//! `locks/writer` (create-only: of two writers, one gets it) naming its
//! host, process and a random token, and deletes it when it closes.
//!
//! A killed writer leaves the object behind. On the same host a dead
//! process is recognised and its lock taken over; a lock from another
//! host is never guessed stale (no clock is trusted to say how old it is):
//! the error names the holder and `dedup store unlock REPO` removes it
//! once the user has made sure that process is gone.

use std::sync::Arc;

use dedup_common::lock::DeviceLock;

use crate::config::CONFIG_OBJECT;
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo_location::RepoLocation;

/// The lock object of a repository in a bucket.
pub const LOCK_OBJECT: &str = "locks/writer";

pub(crate) enum WriterLock {
    Flock(#[allow(dead_code)] DeviceLock),
    Object {
        store: Arc<dyn ObjectStore>,
        bytes: Vec<u8>,
    },
}

impl WriterLock {
    pub(crate) fn acquire(
        location: &RepoLocation,
        store: &Arc<dyn ObjectStore>,
    ) -> RepoResult<WriterLock> {
        if let Some(dir) = location.dir() {
            return DeviceLock::acquire(&dir.join(CONFIG_OBJECT))
                .map(WriterLock::Flock)
                .map_err(|e| match e {
                    dedup_common::Error::Locked { .. } => RepoError::InUse {
                        repo: location.to_string(),
                        holder: None,
                    },
                    other => RepoError::Io {
                        context: format!("locking {location}"),
                        cause: std::io::Error::other(other.to_string()),
                    },
                });
        }
        let bytes = Holder::me()?.encode();
        for _ in 0..2 {
            match store.put(LOCK_OBJECT, &bytes) {
                Ok(()) => {
                    return Ok(WriterLock::Object {
                        store: store.clone(),
                        bytes,
                    })
                }
                Err(Error::Exists { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let there = match store.get(LOCK_OBJECT) {
                Ok(there) => there,
                Err(Error::NotFound { .. }) => continue, // released meanwhile
                Err(e) => return Err(e.into()),
            };
            let holder = Holder::decode(&there);
            if !holder.as_ref().is_some_and(Holder::is_dead_here) {
                return Err(RepoError::InUse {
                    repo: location.to_string(),
                    holder: Some(holder.map_or_else(
                        || format!("an unreadable {LOCK_OBJECT} object"),
                        |h| h.describe(),
                    )),
                });
            }
            // A dead process on this host: its lock is stale.
            match store.delete(LOCK_OBJECT) {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(RepoError::InUse {
            repo: location.to_string(),
            holder: Some("another process that took the lock as this one did".into()),
        })
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        if let WriterLock::Object { store, bytes } = self {
            // Only our own lock: one broken by `unlock` and taken by
            // another writer is theirs.
            if store.get(LOCK_OBJECT).is_ok_and(|there| there == *bytes) {
                let _ = store.delete(LOCK_OBJECT);
            }
        }
    }
}

/// Who holds a lock object.
#[derive(Debug, PartialEq)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    pub token: String,
}

impl Holder {
    fn me() -> RepoResult<Holder> {
        let token: [u8; 16] = crate::repo::random_bytes()?;
        Ok(Holder {
            host: hostname(),
            pid: std::process::id(),
            token: token.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    fn encode(&self) -> Vec<u8> {
        format!(
            "dedup writer lock\nhost {}\npid {}\ntoken {}\n",
            self.host, self.pid, self.token
        )
        .into_bytes()
    }

    /// `None` for bytes no writer wrote.
    pub fn decode(bytes: &[u8]) -> Option<Holder> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != "dedup writer lock" {
            return None;
        }
        let mut field = |key: &str| {
            lines
                .next()?
                .strip_prefix(key)?
                .strip_prefix(' ')
                .map(str::to_string)
        };
        Some(Holder {
            host: field("host")?,
            pid: field("pid")?.parse().ok()?,
            token: field("token")?,
        })
    }

    pub fn describe(&self) -> String {
        format!("process {} on host {}", self.pid, self.host)
    }

    /// A process of this host that no longer runs.
    fn is_dead_here(&self) -> bool {
        if self.host != hostname() {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: signal 0 checks only whether the process exists.
        (unsafe { libc::kill(pid, 0) }) == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer and its length are valid; the result is checked.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_round_trips_and_junk_is_nobody() {
        let me = Holder::me().unwrap();
        assert_eq!(Holder::decode(&me.encode()), Some(me));
        for junk in [
            &b""[..],
            b"dedup writer lock\nhost h\npid x\ntoken t\n",
            b"\xff\xfe",
        ] {
            assert_eq!(Holder::decode(junk), None);
        }
    }

    #[test]
    fn only_a_dead_process_of_this_host_is_stale() {
        let mut me = Holder::me().unwrap();
        assert!(!me.is_dead_here(), "this process runs");
        me.pid = u32::MAX - 1; // no such process
        assert!(!me.is_dead_here(), "out of pid_t range: never guessed");
        me.pid = 4_000_000; // past pid_max's limit: no such process
        assert!(me.is_dead_here());
        me.host = format!("{}-elsewhere", me.host);
        assert!(
            !me.is_dead_here(),
            "another host's process is never guessed dead"
        );
    }
}
