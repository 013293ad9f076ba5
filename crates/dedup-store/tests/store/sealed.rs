//! `SealedStore`: the object-store seam with every object sealed behaves
//! like the store under it (the seam's model), ranged reads and tails of
//! objects of many frames agree with the plain bytes, through stores that
//! answer `get_upto` and `get_tail_sized` in one request and through ones
//! that fall back to the seam's defaults; and the store below holds no
//! plain byte.

use std::collections::BTreeMap;
use std::sync::Arc;

use dedup_store::config::KeyedOf;
use dedup_store::crypto::sealed::FRAME;
use dedup_store::crypto::{MasterKey, SealedStore};
use dedup_store::{Error, LocalDir, ObjectStore, Result};
use proptest::prelude::*;

use crate::object_model;
use object_model::{model_step, op, store_step};

/// A store that answers only the seam's required operations, so the
/// sealed store's ranged reads go through the default `get_upto` and
/// `get_tail_sized`.
struct Basic(LocalDir);

impl ObjectStore for Basic {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.0.put(name, bytes)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.0.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.0.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.0.get_tail(name, len)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.list(prefix)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.0.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.0.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.0.segment_hash()
    }
}

fn sealed(dir: &std::path::Path, basic: bool) -> SealedStore {
    let local = LocalDir::open(dir).unwrap();
    let inner: Arc<dyn ObjectStore> = if basic {
        Arc::new(Basic(local))
    } else {
        Arc::new(local)
    };
    SealedStore::new(inner, &MasterKey::random().unwrap(), KeyedOf::PlainDigest)
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_sealed_store_behaves_like_a_map(ops in prop::collection::vec(op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        let store = sealed(tmp.path(), false);
        let mut model = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let expected = model_step(&mut model, op, true);
            let got = store_step(&store, op);
            prop_assert_eq!(got, expected, "step {}: {:?}", i, op);
        }
    }

    #[test]
    fn ranges_and_tails_of_many_frames_read_the_plain_bytes(
        len in 0..(3 * FRAME as usize + 300),
        reads in prop::collection::vec((0..4 * FRAME, 0..2 * FRAME + 10), 1..12),
        basic in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let store = sealed(tmp.path(), basic);
        let plain = bytes(len, 3);
        store.put("containers/0000000000000001", &plain).unwrap();
        let name = "containers/0000000000000001";
        let size = len as u64;
        prop_assert_eq!(store.size(name).unwrap(), size);
        prop_assert_eq!(store.list_sized("containers/").unwrap(), vec![(name.to_string(), size)]);
        for (offset, n) in reads {
            match store.get_range(name, offset, n) {
                Ok(got) => {
                    prop_assert!(offset + n <= size);
                    prop_assert_eq!(&got[..], &plain[offset as usize..(offset + n) as usize]);
                }
                Err(Error::OutOfRange { size: s, .. }) => {
                    prop_assert!(offset + n > size);
                    prop_assert_eq!(s, size);
                }
                Err(e) => panic!("{e}"),
            }
            let (upto, s) = match store.get_upto(name, offset, n) {
                Ok(got) => got,
                Err(Error::OutOfRange { .. }) => {
                    prop_assert!(offset > size);
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            prop_assert_eq!(s, size);
            let end = (offset + n).min(size) as usize;
            prop_assert_eq!(&upto[..], &plain[offset as usize..end]);
            let (tail, s) = store.get_tail_sized(name, n).unwrap();
            prop_assert_eq!(s, size);
            prop_assert_eq!(&tail[..], &plain[len - (n as usize).min(len)..]);
        }
        prop_assert_eq!(store.get(name).unwrap(), plain);
    }
}

#[test]
fn no_plain_byte_reaches_the_store_below_and_a_flip_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let store = sealed(tmp.path(), false);
    let plain = b"a well-known line of a well-known file\n".repeat(5000);
    store.put("recipes/x", &plain).unwrap();
    let on_disk = std::fs::read(tmp.path().join("recipes/x")).unwrap();
    assert!(!on_disk.windows(16).any(|w| w == &plain[..16]));
    let mut bad = on_disk.clone();
    bad[on_disk.len() / 2] ^= 4;
    std::fs::remove_file(tmp.path().join("recipes/x")).unwrap();
    LocalDir::open(tmp.path())
        .unwrap()
        .put("recipes/x", &bad)
        .unwrap();
    let e = store.get("recipes/x").unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("recipes/x"), "{e}");
    assert!(e.to_string().contains("authentication"), "{e}");
    // A range in an intact frame still reads; one in the damaged frame is refused.
    assert_eq!(store.get_range("recipes/x", 0, 100).unwrap(), &plain[..100]);
    let mid = plain.len() as u64 / 2;
    assert!(store.get_range("recipes/x", mid, 10).is_err());
    // An object moved to another name does not open there.
    LocalDir::open(tmp.path())
        .unwrap()
        .put("recipes/y", &on_disk)
        .unwrap();
    let e = store.get("recipes/y").unwrap_err();
    assert!(e.to_string().contains("recipes/y"), "{e}");
}

/// A store below that answers ranged reads with fewer bytes than the size
/// it gives (a broken or hostile S3 service).
struct Lying(LocalDir);

impl ObjectStore for Lying {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.0.put(name, bytes)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.0.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.0.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.0.get_tail(name, len)
    }
    fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
        let (mut bytes, size) = self.0.get_upto(name, offset, len)?;
        bytes.truncate(bytes.len() / 3);
        Ok((bytes, size))
    }
    fn get_tail_sized(&self, name: &str, len: u64) -> Result<(Vec<u8>, u64)> {
        let (bytes, size) = self.0.get_tail_sized(name, len)?;
        Ok((bytes[..bytes.len() / 3].to_vec(), size / 4))
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.list(prefix)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.0.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.0.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.0.segment_hash()
    }
}

#[test]
fn a_store_below_that_sends_too_few_bytes_is_refused_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let inner = Arc::new(Lying(LocalDir::open(tmp.path()).unwrap()));
    let store = SealedStore::new(inner, &MasterKey::random().unwrap(), KeyedOf::PlainDigest);
    let plain = bytes(3 * FRAME as usize + 10, 9);
    store.put("containers/0000000000000002", &plain).unwrap();
    let name = "containers/0000000000000002";
    for (offset, n) in [(0, 10), (FRAME, 2 * FRAME), (3 * FRAME, 10)] {
        let e = store.get_range(name, offset, n).unwrap_err();
        assert!(e.to_string().contains(name), "{e}");
    }
    for n in [10, FRAME, 3 * FRAME] {
        assert!(store.get_tail(name, n).is_err());
    }
}
