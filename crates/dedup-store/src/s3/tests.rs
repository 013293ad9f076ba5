//! `S3Store` over the `object_store` crate's in-memory store, behind a
//! layer that loses put answers or fails puts: the ambiguous outcomes a
//! real service produces under timeouts and 5xx.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

use super::*;

/// What the next puts do, in order; after the script, puts pass.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The object is stored but the answer is lost (a timeout).
    LoseAnswer,
    /// The service fails before storing anything (a 5xx after retries).
    FailBefore,
}

#[derive(Debug)]
struct Faulty {
    inner: InMemory,
    script: Mutex<Vec<Fault>>,
    puts: AtomicUsize,
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

fn lost(path: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "Faulty",
        source: format!("the answer to the put of {path} was lost").into(),
    }
}

#[async_trait]
impl object_store::ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        let fault = {
            let mut script = self.script.lock().unwrap();
            (!script.is_empty()).then(|| script.remove(0))
        };
        match fault {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::LoseAnswer) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(lost(location))
            }
            Some(Fault::FailBefore) => Err(lost(location)),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn faulty(script: &[Fault]) -> (S3Store, Arc<Faulty>) {
    let layer = Arc::new(Faulty {
        inner: InMemory::new(),
        script: Mutex::new(script.to_vec()),
        puts: AtomicUsize::new(0),
    });
    let store = S3Store::over(layer.clone(), "repo/x", "s3://test/repo/x".into()).unwrap();
    (store, layer)
}

#[test]
fn a_put_whose_answer_was_lost_is_found_to_have_landed() {
    let (store, layer) = faulty(&[Fault::LoseAnswer]);
    store.put("containers/a", b"ours").unwrap();
    assert_eq!(store.get("containers/a").unwrap(), b"ours");
    assert_eq!(layer.puts.load(Ordering::SeqCst), 1, "not put twice");
}

#[test]
fn a_put_that_failed_before_storing_is_tried_again() {
    let (store, layer) = faulty(&[Fault::FailBefore, Fault::FailBefore]);
    store.put("containers/a", b"ours").unwrap();
    assert_eq!(store.get("containers/a").unwrap(), b"ours");
    assert_eq!(layer.puts.load(Ordering::SeqCst), 3);
}

#[test]
fn a_put_that_never_lands_fails_naming_the_object_and_the_bucket() {
    let (store, _) = faulty(&[Fault::FailBefore; PUT_TRIES as usize]);
    let e = store.put("containers/a", b"ours").unwrap_err().to_string();
    assert!(
        e.contains("containers/a") && e.contains("s3://test/repo/x"),
        "{e}"
    );
    assert!(matches!(
        store.get("containers/a"),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn a_put_over_another_writers_object_is_refused_even_when_its_answer_is_lost() {
    let (store, layer) = faulty(&[]);
    store.put("backups/b", b"theirs").unwrap();
    assert!(matches!(
        store.put("backups/b", b"ours"),
        Err(Error::Exists { .. })
    ));
    // Our put fails with no answer; the object is then found holding
    // another writer's bytes.
    layer.script.lock().unwrap().push(Fault::FailBefore);
    assert!(matches!(
        store.put("backups/b", b"ours"),
        Err(Error::Exists { .. })
    ));
    assert_eq!(store.get("backups/b").unwrap(), b"theirs");
}

#[test]
fn objects_live_under_the_prefix_and_strangers_are_not_listed() {
    let (store, layer) = faulty(&[]);
    store.put("containers/a", b"1").unwrap();
    store.put("containers/b", b"22").unwrap();
    store.put("config", b"c").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let put = |key: &str| {
        rt.block_on(
            layer
                .inner
                .put(&Path::from(key), PutPayload::from_static(b"x")),
        )
        .unwrap();
    };
    put("repo/x/containers/NOTES.txt~"); // another tool's key
    put("repo/xy/containers/c"); // a sibling prefix
    put("repo/other"); // outside the prefix
    assert_eq!(
        store.list("").unwrap(),
        ["config", "containers/a", "containers/b"]
    );
    assert_eq!(
        store.list("containers/").unwrap(),
        ["containers/a", "containers/b"]
    );
    assert_eq!(
        store.list("cont").unwrap(),
        ["containers/a", "containers/b"]
    );
    assert_eq!(
        store.list_sized("containers/").unwrap(),
        [
            ("containers/a".to_string(), 1),
            ("containers/b".to_string(), 2)
        ]
    );
    assert_eq!(store.size("containers/b").unwrap(), 2);
    assert!(matches!(
        store.size("containers/z"),
        Err(Error::NotFound { .. })
    ));
    let meta = rt.block_on(layer.inner.head(&Path::from("repo/x/containers/a")));
    assert!(meta.is_ok(), "stored under the prefix");
}

#[test]
fn ranges_and_tails_follow_the_seam() {
    let (store, _) = faulty(&[]);
    store.put("o", b"0123456789").unwrap();
    store.put("empty", b"").unwrap();
    assert_eq!(store.get_range("o", 2, 3).unwrap(), b"234");
    assert_eq!(store.get_range("o", 10, 0).unwrap(), b"");
    assert_eq!(store.get_tail("o", 4).unwrap(), b"6789");
    assert_eq!(store.get_tail("o", 40).unwrap(), b"0123456789");
    assert_eq!(store.get_tail("o", 0).unwrap(), b"");
    assert_eq!(store.get_tail("empty", 4).unwrap(), b"");
    for (offset, len) in [(8, 3), (11, 0), (20, 5), (u64::MAX, 2)] {
        let e = store.get_range("o", offset, len).unwrap_err();
        assert!(
            matches!(e, Error::OutOfRange { size: 10, .. }),
            "{offset}+{len}: {e}"
        );
    }
    assert!(matches!(
        store.get_tail("none", 4),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.get_range("none", 0, 4),
        Err(Error::NotFound { .. })
    ));
    store.delete("o").unwrap();
    store.delete("o").unwrap(); // S3 cannot tell: Ok
    assert!(matches!(store.get("o"), Err(Error::NotFound { .. })));
}

#[test]
fn requests_are_counted_by_kind() {
    let (store, _) = faulty(&[]);
    store.put("a", b"1").unwrap();
    store.get("a").unwrap();
    store.get_tail("a", 1).unwrap();
    store.list("").unwrap();
    store.delete("a").unwrap();
    let want = RequestCounts {
        put: 1,
        get: 2,
        head: 0,
        list: 1,
        delete: 1,
    };
    assert_eq!(store.requests().counts(), want);
    let sent = requests_sent();
    assert!(sent.put >= 1 && sent.get >= 2 && sent.list >= 1, "{sent:?}");
}

/// A catalog comes with its trailer in one GET when it fits in the tail
/// read (`container.rs`, `CATALOG_READ`), in two when it does not; both
/// read the same catalog a directory reads. Plain and sealed.
#[test]
fn a_catalog_is_read_in_one_request_when_it_fits_the_tail() {
    use crate::container::Catalog;
    use crate::crypto::sealed_store::SealedStore;
    use crate::writer::ContainerWriter;
    let container = |id: u64, segments: u64| {
        let mut w = ContainerWriter::new(id);
        for i in 0..segments {
            w.add(&(id << 32 | i).to_le_bytes()).unwrap();
        }
        w.seal()
    };
    let dir = tempfile::tempdir().unwrap();
    let local = crate::LocalDir::open(dir.path()).unwrap();
    let s3 =
        Arc::new(S3Store::over(Arc::new(InMemory::new()), "p", "s3://memory/p".into()).unwrap());
    let key = crate::crypto::keys::MasterKey::random().unwrap();
    let sealed = SealedStore::new(s3.clone(), &key, crate::config::KeyedOf::PlainDigest);
    // 40 segments: a catalog of a few KiB; 12,000: over 256 KiB (32
    // bytes of fingerprint each do not compress).
    for (id, segments, gets) in [(1, 40, 1), (2, 12_000, 2)] {
        let bytes = container(id, segments);
        local.put(&crate::container_name(id), &bytes).unwrap();
        s3.put(&crate::container_name(id), &bytes).unwrap();
        let expected = Catalog::read(&local, id).unwrap();
        let before = s3.requests().counts().get;
        let got = Catalog::read(&*s3, id).unwrap();
        assert_eq!(
            s3.requests().counts().get - before,
            gets,
            "{segments} segments"
        );
        assert_eq!(got.entries(), expected.entries());
        // Sealed: under another id's name, so both live in one bucket.
        let id = id + 100;
        let bytes = container(id, segments);
        local.put(&crate::container_name(id), &bytes).unwrap();
        sealed.put(&crate::container_name(id), &bytes).unwrap();
        let before = s3.requests().counts().get;
        let got = Catalog::read(&sealed, id).unwrap();
        assert_eq!(
            s3.requests().counts().get - before,
            gets,
            "sealed, {segments} segments"
        );
        assert_eq!(got.entries(), Catalog::read(&local, id).unwrap().entries());
    }
}

#[test]
fn bodies_go_unsigned_over_tls_only() {
    for (endpoint, unsigned) in [
        ("AWS", true),
        ("https://s3.example.net", true),
        ("HTTPS://s3.example.net:9000", true),
        ("http://127.0.0.1:9000", false),
        ("HTTP://localhost", false),
    ] {
        assert_eq!(
            payload_unsigned_by_default(endpoint),
            unsigned,
            "{endpoint}"
        );
    }
}
