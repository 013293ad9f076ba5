//! The `LocalDir` object store: a model test against a `BTreeMap`, crash
//! leftovers, modes and names.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use dedup_store::local::TEMP_PREFIX;
use dedup_store::{Error, LocalDir, ObjectStore};
use proptest::prelude::*;

use crate::object_model;
use object_model::{model_step, op, store_step};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn local_dir_behaves_like_a_map(ops in prop::collection::vec(op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        let store = LocalDir::open(tmp.path().join("s")).unwrap();
        let mut model = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let expected = model_step(&mut model, op, true);
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
    // Their writer is dead (a pid no longer running, of this machine).
    let me = dedup_store::process::tag();
    let (machine, rest) = me.split_once('-').unwrap();
    let dead = format!("{machine}-4000000-{}", rest.split_once('-').unwrap().1);
    fs::write(
        root.join(format!("{TEMP_PREFIX}{dead}.abc123")),
        b"half of c",
    )
    .unwrap();
    fs::write(
        root.join(format!("d/{TEMP_PREFIX}{dead}.xyz789")),
        b"half of x",
    )
    .unwrap();

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
