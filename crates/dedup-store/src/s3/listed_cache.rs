//! This machine's copies of small objects read by the tag a listing gave
//! them (S3's ETag), kept across processes: how a new handle finds every
//! backup's record without a GET per backup.
//!
//! A backup of files reads every backup object to find its parent, and
//! `dedup backup` is a new process each time, so the in-process cache by
//! tag (`repo/listing.rs`) started empty every time: a repository of 10
//! backups cost 10 GETs per backup before its first container (restic
//! keeps its snapshots in `~/.cache/restic` for the same reason).
//!
//! What is kept is exactly the bytes the bucket answered for that name
//! and tag, sealed (encrypted, authenticated) where the repository is.
//! It is trusted only for the tag it was read under, and kept only when
//! that answer proves itself: its own tag is the listed one (the object
//! may be replaced between the listing and the read) and the tag is the
//! MD5 of the bytes, as S3's ETag of an object put whole is (a bad answer
//! on the way, which S3 clients do not check against it, is not kept; a
//! service whose tags are not MD5s keeps nothing here). A name whose tag
//! changes is read again. Each entry carries the BLAKE3 digest of its
//! bytes; an entry that does not match it (a bad disk, a torn copy) is
//! removed and the object read again, and so is one whose record does not
//! open (`forget`). Losing the cache costs requests, never data. It lives
//! in the user's private cache directory (`local_cache.rs`), one directory
//! per service and bucket URL, entries of at most `MAX_BYTES`; past
//! `MAX_ENTRIES`, a process that opens it removes the least recently used
//! half.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use md5::{Digest, Md5};

/// Entries kept per service and bucket; past it, the older half (by last
/// use) is removed.
const MAX_ENTRIES: usize = 4096;
/// Objects larger than this are not kept (records are a few KiB).
const MAX_BYTES: usize = 1 << 20;
/// Bytes of the digest in front of each entry.
const DIGEST: usize = 32;

pub(crate) struct ListedCache {
    dir: PathBuf,
}

impl ListedCache {
    /// The cache for objects of `service` (`ObjectStore::service`), or
    /// `None` where this machine has no cache directory.
    pub(crate) fn open(service: &str) -> Option<ListedCache> {
        let id = blake3::hash(service.as_bytes()).to_hex();
        let dir = crate::local_cache::dir(&format!("listed/{}", &id.as_str()[..32]))?;
        let cache = ListedCache { dir };
        // Once a process, not at every put: a first listing of a large
        // repository puts one entry per backup.
        cache.prune();
        Some(cache)
    }

    /// Within a cache directory `dir` (tests).
    #[cfg(test)]
    pub(crate) fn at(dir: PathBuf) -> ListedCache {
        ListedCache { dir }
    }

    fn path(&self, name: &str, tag: &str) -> PathBuf {
        let mut h = blake3::Hasher::new();
        h.update(name.as_bytes())
            .update(&[0])
            .update(tag.as_bytes());
        self.dir.join(&h.finalize().to_hex().as_str()[..32])
    }

    /// The bytes kept for `name` under `tag`, if any are and are whole.
    pub(crate) fn get(&self, name: &str, tag: &str) -> Option<Vec<u8>> {
        let path = self.path(name, tag);
        let mut kept = fs::read(&path).ok()?;
        if kept.len() < DIGEST || blake3::hash(&kept[DIGEST..]).as_bytes()[..] != kept[..DIGEST] {
            let _ = fs::remove_file(&path);
            return None;
        }
        // Its last use, for pruning (a failure only makes it look older).
        if let Ok(f) = fs::File::options().write(true).open(&path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        kept.drain(..DIGEST);
        Some(kept)
    }

    /// Drop the entry for `name` under `tag`, if any.
    pub(crate) fn forget(&self, name: &str, tag: &str) {
        let _ = fs::remove_file(self.path(name, tag));
    }

    /// Keep `bytes` as `name`'s under `tag` (best effort: a failure keeps
    /// nothing). Written to a new temporary name of this process and
    /// thread (never through a link found there) and renamed, so a reader
    /// sees a whole entry or none.
    pub(crate) fn put(&self, name: &str, tag: &str, bytes: &[u8]) {
        static TEMPORARIES: AtomicU64 = AtomicU64::new(0);
        if bytes.len() > MAX_BYTES {
            return;
        }
        let path = self.path(name, tag);
        let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
        let written = fs::File::options()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(blake3::hash(bytes).as_bytes())?;
                f.write_all(bytes)
            })
            .and_then(|()| fs::rename(&tmp, &path));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }

    /// Past `MAX_ENTRIES`, remove the older entries by last use, keeping
    /// half.
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut all: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                Some((e.metadata().ok()?.modified().ok()?, e.path()))
            })
            .collect();
        if all.len() <= MAX_ENTRIES {
            return;
        }
        all.sort_unstable();
        for (_, path) in &all[..all.len() - MAX_ENTRIES / 2] {
            let _ = fs::remove_file(path);
        }
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        fs::read_dir(&self.dir).map(|d| d.count()).unwrap_or(0)
    }
}

/// Whether `tag` (an ETag, quoted or not) is the MD5 of `bytes` in hex.
pub(crate) fn is_md5_of(tag: &str, bytes: &[u8]) -> bool {
    let hex = tag.trim_matches('"');
    hex.len() == 32 && hex.eq_ignore_ascii_case(&format!("{:032x}", Md5::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_found_by_name_and_tag_only() {
        let dir = tempfile::tempdir().unwrap();
        let c = ListedCache::at(dir.path().to_path_buf());
        c.put("backups/a", "\"t1\"", b"record a");
        assert_eq!(
            c.get("backups/a", "\"t1\"").as_deref(),
            Some(&b"record a"[..])
        );
        assert_eq!(c.get("backups/a", "\"t2\""), None, "another tag");
        assert_eq!(c.get("backups/b", "\"t1\""), None, "another name");
        // A name taken again under a new tag is a new entry.
        c.put("backups/a", "\"t2\"", b"record a again");
        assert_eq!(
            c.get("backups/a", "\"t2\"").as_deref(),
            Some(&b"record a again"[..])
        );
        assert_eq!(
            c.get("backups/a", "\"t1\"").as_deref(),
            Some(&b"record a"[..])
        );
        // Too large to keep.
        c.put("backups/big", "\"t\"", &vec![0u8; MAX_BYTES + 1]);
        assert_eq!(c.get("backups/big", "\"t\""), None);
    }

    /// Every flipped byte and every truncation of an entry is refused
    /// and the entry removed, never handed out.
    #[test]
    fn a_damaged_entry_is_refused_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let c = ListedCache::at(dir.path().to_path_buf());
        let bytes = b"a small sealed record".to_vec();
        let path = c.path("backups/a", "t");
        c.put("backups/a", "t", &bytes);
        let whole = fs::read(&path).unwrap();
        for i in 0..whole.len() {
            let mut bad = whole.clone();
            bad[i] ^= 0x20;
            fs::write(&path, &bad).unwrap();
            assert_eq!(c.get("backups/a", "t"), None, "byte {i} flipped");
            assert!(!path.exists(), "byte {i}: the bad entry stays");
        }
        for len in 0..whole.len() {
            fs::write(&path, &whole[..len]).unwrap();
            assert_eq!(c.get("backups/a", "t"), None, "cut to {len}");
            assert!(!path.exists(), "cut to {len}: the bad entry stays");
        }
        fs::write(&path, &whole).unwrap();
        assert_eq!(c.get("backups/a", "t"), Some(bytes));
    }

    /// Only an answer whose tag is its MD5 proves itself.
    #[test]
    fn a_tag_is_checked_as_the_md5_of_the_bytes() {
        // MD5("abc"), as S3 quotes it.
        let tag = "\"900150983cd24fb0d6963f7d28e17f72\"";
        assert!(is_md5_of(tag, b"abc"));
        assert!(is_md5_of(&tag.to_uppercase(), b"abc"));
        assert!(!is_md5_of(tag, b"abd"), "other bytes");
        assert!(
            !is_md5_of("W/\"900150983cd24fb0d6963f7d28e17f72\"", b"abc"),
            "weak"
        );
        assert!(
            !is_md5_of("\"900150983cd24fb0d6963f7d28e17f72-2\"", b"abc"),
            "multipart"
        );
        assert!(!is_md5_of("\"\"", b""), "empty");
    }

    #[test]
    fn an_entry_forgotten_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let c = ListedCache::at(dir.path().to_path_buf());
        c.put("backups/a", "t", b"bad answer");
        c.forget("backups/a", "t");
        assert_eq!(c.get("backups/a", "t"), None);
        assert_eq!(c.entries(), 0, "no temporary left either");
    }

    #[test]
    fn past_the_limit_a_prune_keeps_the_most_recently_used_half() {
        let dir = tempfile::tempdir().unwrap();
        let c = ListedCache::at(dir.path().to_path_buf());
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for i in 0..MAX_ENTRIES {
            let name = format!("backups/{i}");
            c.put(&name, "t", name.as_bytes());
            // All but the first look an hour old.
            if i > 0 {
                let f = fs::File::options()
                    .write(true)
                    .open(c.path(&name, "t"))
                    .unwrap();
                f.set_modified(old).unwrap();
            }
        }
        c.prune();
        assert_eq!(c.entries(), MAX_ENTRIES, "not past the limit");
        c.put("backups/new", "t", b"new");
        c.prune();
        assert_eq!(c.entries(), MAX_ENTRIES / 2);
        assert!(c.get("backups/0", "t").is_some(), "used lately: kept");
        assert!(c.get("backups/new", "t").is_some(), "just put: kept");
    }
}
