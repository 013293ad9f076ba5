//! The `LocalDir` object store: a model test against a `BTreeMap`, crash
//! leftovers, modes and names.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dedup_store::local::TEMP_PREFIX;
use dedup_store::{Error, LocalDir, ObjectStore};
use proptest::prelude::*;

/// Names chosen so that none is a directory of another (a name cannot be
/// both a file and a directory, in S3's model as in this test's).
const NAMES: [&str; 6] = ["a", "b.1", "d/x", "d/y", "d/e/z", "f-2"];
const PREFIXES: [&str; 8] = ["", "a", "d", "d/", "d/e", "d/e/", "f", "zz/"];

#[derive(Clone, Debug)]
enum Op {
    Put(usize, Vec<u8>),
    Get(usize),
    GetRange(usize, u64, u64),
    GetTail(usize, u64),
    List(usize),
    Delete(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0..NAMES.len();
    prop_oneof![
        3 => (name.clone(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(|(n, b)| Op::Put(n, b)),
        2 => name.clone().prop_map(Op::Get),
        2 => (name.clone(), 0..80u64, 0..80u64).prop_map(|(n, o, l)| Op::GetRange(n, o, l)),
        1 => (name.clone(), 0..80u64).prop_map(|(n, l)| Op::GetTail(n, l)),
        1 => (0..PREFIXES.len()).prop_map(Op::List),
        2 => name.prop_map(Op::Delete),
    ]
}

/// What the store answered, reduced to what the model can predict.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok,
    Bytes(Vec<u8>),
    Names(Vec<String>),
    Exists,
    NotFound,
    OutOfRange { size: u64 },
}

fn outcome<T>(r: dedup_store::Result<T>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(Error::Exists { .. }) => Outcome::Exists,
        Err(Error::NotFound { .. }) => Outcome::NotFound,
        Err(Error::OutOfRange { size, .. }) => Outcome::OutOfRange { size },
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn model_step(model: &mut BTreeMap<String, Vec<u8>>, op: &Op) -> Outcome {
    let get = |n: usize| model.get(NAMES[n]).cloned();
    match op {
        Op::Put(n, bytes) => {
            if model.contains_key(NAMES[*n]) {
                Outcome::Exists
            } else {
                model.insert(NAMES[*n].into(), bytes.clone());
                Outcome::Ok
            }
        }
        Op::Get(n) => get(*n).map_or(Outcome::NotFound, Outcome::Bytes),
        Op::GetRange(n, off, len) => match get(*n) {
            None => Outcome::NotFound,
            Some(b) if off + len > b.len() as u64 => Outcome::OutOfRange {
                size: b.len() as u64,
            },
            Some(b) => Outcome::Bytes(b[*off as usize..(off + len) as usize].to_vec()),
        },
        Op::GetTail(n, len) => match get(*n) {
            None => Outcome::NotFound,
            Some(b) => Outcome::Bytes(b[b.len() - (*len as usize).min(b.len())..].to_vec()),
        },
        Op::List(p) => Outcome::Names(
            model
                .keys()
                .filter(|k| k.starts_with(PREFIXES[*p]))
                .cloned()
                .collect(),
        ),
        Op::Delete(n) => match model.remove(NAMES[*n]) {
            Some(_) => Outcome::Ok,
            None => Outcome::NotFound,
        },
    }
}

fn store_step(store: &LocalDir, op: &Op) -> Outcome {
    match op {
        Op::Put(n, bytes) => outcome(store.put(NAMES[*n], bytes), |()| Outcome::Ok),
        Op::Get(n) => outcome(store.get(NAMES[*n]), Outcome::Bytes),
        Op::GetRange(n, off, len) => {
            outcome(store.get_range(NAMES[*n], *off, *len), Outcome::Bytes)
        }
        Op::GetTail(n, len) => outcome(store.get_tail(NAMES[*n], *len), Outcome::Bytes),
        Op::List(p) => outcome(store.list(PREFIXES[*p]), Outcome::Names),
        Op::Delete(n) => outcome(store.delete(NAMES[*n]), |()| Outcome::Ok),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn local_dir_behaves_like_a_map(ops in prop::collection::vec(op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalDir::open(tmp.path().join("s")).unwrap();
        let mut model = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let expected = model_step(&mut model, op);
            let got = store_step(&store, op);
            prop_assert_eq!(got, expected, "step {}: {:?}", i, op);
        }
        // A store reopened on the same directory holds the same objects.
        let reopened = LocalDir::open(tmp.path().join("s")).unwrap();
        let all: Vec<String> = model.keys().cloned().collect();
        prop_assert_eq!(reopened.list("").unwrap(), all);
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn objects_are_0600_and_directories_0700() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let store = LocalDir::open(&root).unwrap();
    store.put("containers/sub/c1", b"x").unwrap();
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join("containers")), 0o700);
    assert_eq!(mode(&root.join("containers/sub")), 0o700);
    assert_eq!(mode(&root.join("containers/sub/c1")), 0o600);
}

#[test]
fn bad_names_are_refused_by_every_operation_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let store = LocalDir::open(tmp.path().join("s")).unwrap();
    fs::write(tmp.path().join("outside"), b"secret").unwrap();
    for bad in ["../outside", "/etc/passwd", "a/./b", "", "a b"] {
        let errors = [
            store.put(bad, b"x").unwrap_err(),
            store.get(bad).unwrap_err(),
            store.get_range(bad, 0, 1).unwrap_err(),
            store.get_tail(bad, 1).unwrap_err(),
            store.delete(bad).unwrap_err(),
        ];
        for e in errors {
            assert!(matches!(e, Error::BadName { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
    assert!(store.list("").unwrap().is_empty());
    assert_eq!(fs::read(tmp.path().join("outside")).unwrap(), b"secret");
}

#[test]
fn an_interrupted_put_is_invisible_and_the_name_stays_free() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let store = LocalDir::open(&root).unwrap();
    store.put("d/other", b"kept").unwrap();
    // What a crash between writing and renaming leaves: temporaries, in the
    // root and in an object's directory, holding part of the object.
    fs::write(root.join(format!("{TEMP_PREFIX}abc123")), b"half of c").unwrap();
    fs::write(root.join(format!("d/{TEMP_PREFIX}xyz789")), b"half of x").unwrap();

    assert_eq!(store.list("").unwrap(), ["d/other"]);
    assert_eq!(store.list("d/").unwrap(), ["d/other"]);
    assert!(matches!(store.get("c"), Err(Error::NotFound { .. })));
    assert!(matches!(store.get("d/x"), Err(Error::NotFound { .. })));

    store.put("c", b"all of c").unwrap();
    store.put("d/x", b"all of x").unwrap();
    assert_eq!(store.get("c").unwrap(), b"all of c");
    assert_eq!(store.get("d/x").unwrap(), b"all of x");
    assert_eq!(store.list("").unwrap(), ["c", "d/other", "d/x"]);

    assert_eq!(store.sweep_temporaries().unwrap(), 2);
    assert_eq!(store.list("").unwrap(), ["c", "d/other", "d/x"]);
    let leftovers: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_refused_overwrite_keeps_the_first_bytes_and_leaves_no_temporary() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("s");
    let store = LocalDir::open(&root).unwrap();
    store.put("o", b"first").unwrap();
    let e = store.put("o", b"second").unwrap_err();
    assert!(matches!(e, Error::Exists { .. }), "{e}");
    assert!(e.to_string().contains("object o already exists"), "{e}");
    assert_eq!(store.get("o").unwrap(), b"first");
    assert_eq!(store.sweep_temporaries().unwrap(), 0);
}
