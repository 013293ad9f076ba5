//! Every object of a repository relies on create-only puts (an object is
//! never overwritten; of two writers creating one name, one wins): the
//! many-writers protocol (`epochs/`) above all. A service that ignores
//! `If-None-Match: *` is refused before anything is written.
//!
//! The probe costs four requests, which every command that writes paid (a
//! fifth of an unchanged backup's). A service that passed it is
//! remembered on this machine (`local_cache.rs`, by endpoint and bucket
//! URL) and not probed again from here; a new endpoint is probed anew.

use std::path::Path;
use std::sync::Arc;

use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo_location::RepoLocation;

/// Probe `store` unless a mark in this machine's cache says it passed
/// before; leave the mark when it passes.
pub(crate) fn probe_create_only(
    location: &RepoLocation,
    store: &Arc<dyn ObjectStore>,
) -> RepoResult<()> {
    let marks = crate::local_cache::dir("create-only");
    probe_remembered(location, store, marks.as_deref())
}

/// `probe_create_only` with its marks in `marks` (`None`: none kept).
fn probe_remembered(
    location: &RepoLocation,
    store: &Arc<dyn ObjectStore>,
    marks: Option<&Path>,
) -> RepoResult<()> {
    let mark = store
        .service()
        .zip(marks)
        .map(|(service, dir)| dir.join(blake3::hash(service.as_bytes()).to_hex().as_str()));
    if mark.as_ref().is_some_and(|m| m.exists()) {
        return Ok(());
    }
    probe(location, store)?;
    if let Some(mark) = mark {
        let _ = std::fs::write(mark, b"");
    }
    Ok(())
}

/// Two puts of one fresh name under `probes/`, then its delete: the second
/// must be refused.
fn probe(location: &RepoLocation, store: &Arc<dyn ObjectStore>) -> RepoResult<()> {
    let token: [u8; 16] = crate::crypto::random::random_bytes()?;
    let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("probes/{token}");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment_hash::SegmentHash;
    use crate::LocalDir;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A directory seen as a service named `service`, that overwrites on
    /// put if `overwrites`, counting puts.
    struct Service {
        dir: LocalDir,
        service: Option<String>,
        overwrites: bool,
        puts: AtomicU64,
    }

    impl ObjectStore for Service {
        fn put(&self, name: &str, bytes: &[u8]) -> crate::error::Result<()> {
            self.puts.fetch_add(1, Ordering::SeqCst);
            if self.overwrites {
                let _ = self.dir.delete(name);
            }
            self.dir.put(name, bytes)
        }
        fn get(&self, name: &str) -> crate::error::Result<Vec<u8>> {
            self.dir.get(name)
        }
        fn get_range(&self, name: &str, offset: u64, len: u64) -> crate::error::Result<Vec<u8>> {
            self.dir.get_range(name, offset, len)
        }
        fn get_tail(&self, name: &str, len: u64) -> crate::error::Result<Vec<u8>> {
            self.dir.get_tail(name, len)
        }
        fn list(&self, prefix: &str) -> crate::error::Result<Vec<String>> {
            self.dir.list(prefix)
        }
        fn size(&self, name: &str) -> crate::error::Result<u64> {
            self.dir.size(name)
        }
        fn segment_hash(&self) -> SegmentHash {
            SegmentHash::PLAIN
        }
        fn service(&self) -> Option<String> {
            self.service.clone()
        }
        fn delete(&self, name: &str) -> crate::error::Result<()> {
            self.dir.delete(name)
        }
    }

    fn service(root: &Path, name: Option<&str>, overwrites: bool) -> Arc<Service> {
        Arc::new(Service {
            dir: LocalDir::open(root).unwrap(),
            service: name.map(str::to_string),
            overwrites,
            puts: AtomicU64::new(0),
        })
    }

    #[test]
    fn a_service_that_passed_is_not_probed_again_from_here() {
        let (root, marks) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let location = "s3://bucket/p".parse::<RepoLocation>().unwrap();
        let a = service(root.path(), Some("http://a s3://bucket/p"), false);
        let store: Arc<dyn ObjectStore> = a.clone();
        probe_remembered(&location, &store, Some(marks.path())).unwrap();
        assert_eq!(a.puts.load(Ordering::SeqCst), 2);
        probe_remembered(&location, &store, Some(marks.path())).unwrap();
        assert_eq!(a.puts.load(Ordering::SeqCst), 2, "probed again");
        // Another endpoint for the same bucket is probed.
        let b = service(root.path(), Some("http://b s3://bucket/p"), false);
        let store: Arc<dyn ObjectStore> = b.clone();
        probe_remembered(&location, &store, Some(marks.path())).unwrap();
        assert_eq!(b.puts.load(Ordering::SeqCst), 2);
        // A store that names no service, or no cache: every time.
        let c = service(root.path(), None, false);
        let store: Arc<dyn ObjectStore> = c.clone();
        probe_remembered(&location, &store, Some(marks.path())).unwrap();
        probe_remembered(&location, &store, None).unwrap();
        assert_eq!(c.puts.load(Ordering::SeqCst), 4);
        assert!(root.path().read_dir().unwrap().all(|e| {
            let e = e.unwrap();
            e.file_name() != "probes" || e.path().read_dir().unwrap().next().is_none()
        }));
    }

    #[test]
    fn a_service_that_overwrites_is_refused_and_not_remembered() {
        let (root, marks) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let location = "s3://bucket/p".parse::<RepoLocation>().unwrap();
        let bad = service(root.path(), Some("http://bad s3://bucket/p"), true);
        let store: Arc<dyn ObjectStore> = bad.clone();
        for _ in 0..2 {
            let e = probe_remembered(&location, &store, Some(marks.path()))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("s3://bucket/p") && e.contains("If-None-Match"),
                "{e}"
            );
        }
        assert_eq!(bad.puts.load(Ordering::SeqCst), 4, "probed each time");
        assert!(marks.path().read_dir().unwrap().next().is_none());
    }
}
