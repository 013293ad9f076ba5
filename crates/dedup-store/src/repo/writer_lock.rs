//! The one writing process of a repository, until writers need no lock.
//!
//! In a directory, the writer holds an `flock` on the config object: the
//! kernel drops it when the process dies, so it is never stale. A bucket
//! has no such thing, so there the writer creates the object
//! `locks/writer` (create-only: of two writers, one gets it) naming its
//! host and process, and deletes it when it closes.
//!
//! A killed writer leaves the object behind. A process is known dead only
//! on its own machine and in its own process namespace, since the same
//! number means another process elsewhere: the lock records the kernel's
//! boot id, the pid namespace and the process's start time beside its
//! pid, and it is stale only when the first two are ours and that pid
//! no longer runs with that start time. Taking a stale lock over is
//! itself create-only (`locks/takeover-<token>`, never deleted), so two
//! processes that both find the same dead holder cannot both take over.
//! Any other lock is never guessed stale (no clock is trusted to say how
//! old it is): the error names the holder and `dedup store unlock REPO`
//! removes it once the user has made sure that process is gone.

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
        probe_create_only(location, store)?;
        let bytes = Holder::me()?.encode();
        for _ in 0..3 {
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
            let Some(dead) = holder.as_ref().filter(|h| h.is_dead_here()) else {
                return Err(in_use(location, holder.as_ref()));
            };
            // Only the process that creates the takeover marker for this
            // dead holder removes its lock; another one that found it too
            // starts over and finds the winner's lock.
            match store.put(&takeover_name(&dead.token), &bytes) {
                Ok(()) => {}
                Err(Error::Exists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            remove_lock_holding(&**store, &there)?;
        }
        Err(RepoError::InUse {
            repo: location.to_string(),
            holder: Some("another process that took the lock as this one did".into()),
        })
    }
}

/// Refuse a service that overwrites where a create-only put should be
/// refused (one that ignores `If-None-Match: *`): every object, the lock
/// among them, relies on it. Two puts of one fresh name, then its delete.
fn probe_create_only(location: &RepoLocation, store: &Arc<dyn ObjectStore>) -> RepoResult<()> {
    let name = format!("locks/probe-{}", random_token()?);
    store.put(&name, b"first")?;
    let second = store.put(&name, b"second");
    match store.delete(&name) {
        Ok(()) | Err(Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    match second {
        Err(Error::Exists { .. }) => Ok(()),
        Ok(()) => Err(Error::InvalidArgument(format!(
            "{location}: the service overwrote an object that a create-only put (If-None-Match: *) should have left alone; dedup keeps repositories only where objects are never overwritten (S3, SeaweedFS, MinIO and Ceph honour it; check the service's version and AWS_CONDITIONAL_PUT)"
        ))
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// The marker whose creation decides who takes over the lock of the dead
/// holder whose token is `token`.
fn takeover_name(token: &str) -> String {
    let token: String = token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(64)
        .collect();
    format!("locks/takeover-{token}")
}

fn in_use(location: &RepoLocation, holder: Option<&Holder>) -> RepoError {
    RepoError::InUse {
        repo: location.to_string(),
        holder: Some(describe_holder(holder)),
    }
}

/// Who holds the lock whose bytes decoded to `holder`, in words.
pub fn describe_holder(holder: Option<&Holder>) -> String {
    holder.map_or_else(
        || format!("an unreadable {LOCK_OBJECT} object"),
        Holder::describe,
    )
}

/// Delete the lock object if it still holds `bytes`: one taken meanwhile
/// (after a takeover or an `unlock`) is another writer's. Whether it was
/// deleted.
pub fn remove_lock_holding(store: &dyn ObjectStore, bytes: &[u8]) -> crate::Result<bool> {
    if !store.get(LOCK_OBJECT).is_ok_and(|now| now == bytes) {
        return Ok(false);
    }
    match store.delete(LOCK_OBJECT) {
        Ok(()) | Err(Error::NotFound { .. }) => Ok(true),
        Err(e) => Err(e),
    }
}

/// 32 random hex digits.
fn random_token() -> RepoResult<String> {
    let token: [u8; 16] = crate::crypto::random::random_bytes()?;
    Ok(token.iter().map(|b| format!("{b:02x}")).collect())
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        if let WriterLock::Object { store, bytes } = self {
            let _ = remove_lock_holding(&**store, bytes);
        }
    }
}

/// Who holds a lock object: enough to tell, on the holder's own machine
/// and namespace, whether it still runs.
#[derive(Debug, PartialEq)]
pub struct Holder {
    pub host: String,
    /// The kernel's boot id: another machine, or this one rebooted.
    pub boot: String,
    /// The pid namespace (`/proc/self/ns/pid`): another container.
    pub pidns: String,
    pub pid: u32,
    /// The process's start time in clock ticks since boot: a pid reused.
    pub start: u64,
    pub token: String,
}

impl Holder {
    fn me() -> RepoResult<Holder> {
        let pid = std::process::id();
        Ok(Holder {
            host: hostname(),
            boot: boot_id(),
            pidns: pid_namespace(),
            pid,
            start: start_time(pid).unwrap_or(0),
            token: random_token()?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        format!(
            "dedup writer lock\nhost {}\nboot {}\npidns {}\npid {}\nstart {}\ntoken {}\n",
            self.host, self.boot, self.pidns, self.pid, self.start, self.token
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
            boot: field("boot")?,
            pidns: field("pidns")?,
            pid: field("pid")?.parse().ok()?,
            start: field("start")?.parse().ok()?,
            token: field("token")?,
        })
    }

    pub fn describe(&self) -> String {
        format!("process {} on host {}", self.pid, self.host)
    }

    /// A process of this machine and pid namespace that still runs: its
    /// lock is not to be removed by hand either.
    pub fn is_alive_here(&self) -> bool {
        self.boot == boot_id()
            && self.pidns == pid_namespace()
            && start_time(self.pid) == Some(self.start)
    }

    /// A process of this machine (same boot) and pid namespace that no
    /// longer runs, or whose pid now belongs to a process started at
    /// another time. Anything unknown is alive.
    pub fn is_dead_here(&self) -> bool {
        let known = |v: &str| !v.is_empty() && v != "unknown";
        if !(known(&self.boot) && known(&self.pidns))
            || self.boot != boot_id()
            || self.pidns != pid_namespace()
        {
            return false;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // SAFETY: signal 0 checks only whether the process exists.
        let gone = (unsafe { libc::kill(pid, 0) }) == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        gone || start_time(self.pid).is_some_and(|start| start != self.start)
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().replace(|c: char| c.is_whitespace(), ""))
        .unwrap_or_else(|_| "unknown".into())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// since boot. `None` if it cannot be read (no such process).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
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
            b"dedup writer lock\nhost h\nboot b\npidns n\npid x\nstart 1\ntoken t\n",
            b"dedup writer lock\nhost h\npid 1\ntoken t\n",
            b"\xff\xfe",
        ] {
            assert_eq!(Holder::decode(junk), None);
        }
    }

    #[test]
    fn only_a_dead_process_of_this_boot_and_namespace_is_stale() {
        let me = Holder::me().unwrap();
        assert!(me.start > 0, "start time read");
        assert!(!me.is_dead_here(), "this process runs");
        let dead = |f: &dyn Fn(&mut Holder)| {
            let mut h = Holder::me().unwrap();
            f(&mut h);
            h.is_dead_here()
        };
        assert!(dead(&|h| h.pid = 4_000_000), "no such process");
        assert!(dead(&|h| h.start += 1), "the pid reused by a later process");
        assert!(
            !dead(&|h| h.pid = u32::MAX - 1),
            "out of pid_t's range: never guessed"
        );
        for other in [
            &(|h: &mut Holder| h.boot = "another-boot".into()) as &dyn Fn(&mut Holder),
            &|h: &mut Holder| h.pidns = "pid:[1]".into(),
            &|h: &mut Holder| h.boot = "unknown".into(),
        ] {
            assert!(
                !dead(&|h| {
                    h.pid = 4_000_000;
                    other(h)
                }),
                "another machine or namespace is never guessed dead"
            );
        }
    }

    /// Reads of the lock object wait for each other until `first` of them
    /// have arrived: two processes that both found the same dead holder.
    struct Together {
        inner: crate::local::LocalDir,
        reads: std::sync::atomic::AtomicUsize,
        first: usize,
        barrier: std::sync::Barrier,
    }

    impl ObjectStore for Together {
        fn put(&self, name: &str, bytes: &[u8]) -> crate::Result<()> {
            self.inner.put(name, bytes)
        }
        fn get(&self, name: &str) -> crate::Result<Vec<u8>> {
            let got = self.inner.get(name);
            if name == LOCK_OBJECT
                && self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < self.first
            {
                self.barrier.wait();
            }
            got
        }
        fn get_range(&self, name: &str, offset: u64, len: u64) -> crate::Result<Vec<u8>> {
            self.inner.get_range(name, offset, len)
        }
        fn get_tail(&self, name: &str, len: u64) -> crate::Result<Vec<u8>> {
            self.inner.get_tail(name, len)
        }
        fn list(&self, prefix: &str) -> crate::Result<Vec<String>> {
            self.inner.list(prefix)
        }
        fn size(&self, name: &str) -> crate::Result<u64> {
            self.inner.size(name)
        }
        fn delete(&self, name: &str) -> crate::Result<()> {
            self.inner.delete(name)
        }
        fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
            self.inner.segment_hash()
        }
    }

    #[test]
    fn two_processes_that_find_one_dead_holder_do_not_both_take_over() {
        let tmp = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(Together {
            inner: crate::local::LocalDir::open(tmp.path()).unwrap(),
            reads: Default::default(),
            first: 2,
            barrier: std::sync::Barrier::new(2),
        });
        let dead = Holder {
            pid: 4_000_000,
            ..Holder::me().unwrap()
        };
        store.put(LOCK_OBJECT, &dead.encode()).unwrap();
        let bucket = RepoLocation::S3 {
            bucket: "test".into(),
            prefix: "repo".into(),
        };
        let taken: Vec<RepoResult<WriterLock>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| s.spawn(|| WriterLock::acquire(&bucket, &store)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let holders = taken.iter().filter(|t| t.is_ok()).count();
        assert_eq!(holders, 1, "both took the dead holder's lock over");
        for e in taken.iter().filter_map(|t| t.as_ref().err()) {
            assert!(matches!(e, RepoError::InUse { .. }), "{e}");
        }
    }

    #[test]
    fn a_dead_holders_lock_is_left_to_whoever_created_its_takeover_marker() {
        let tmp = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(crate::local::LocalDir::open(tmp.path()).unwrap());
        let dead = Holder {
            pid: 4_000_000,
            ..Holder::me().unwrap()
        };
        store.put(LOCK_OBJECT, &dead.encode()).unwrap();
        // Another process found the same dead holder first and is taking
        // its lock over: this one must not delete the lock it reads.
        store.put(&takeover_name(&dead.token), b"theirs").unwrap();
        let bucket = RepoLocation::S3 {
            bucket: "test".into(),
            prefix: "repo".into(),
        };
        let e = WriterLock::acquire(&bucket, &store)
            .err()
            .expect("not taken");
        assert!(matches!(e, RepoError::InUse { .. }), "{e}");
        assert_eq!(store.get(LOCK_OBJECT).unwrap(), dead.encode());
    }

    #[test]
    fn takeover_markers_are_valid_names() {
        crate::name::validate(&takeover_name("00ff")).unwrap();
        crate::name::validate(&takeover_name("../x y")).unwrap();
    }
}
