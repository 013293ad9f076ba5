//! Temporary files (`.tmp-*`) that killed writers left (a backup or a
//! server killed mid-`put`) are removed when the repository is next
//! opened to write, and only then: the writer's lock is held by every
//! process that puts, so no live writer's file is touched.

use std::path::Path;

use dedup_store::{RepoError, Repository};

fn temporary(dir: &Path, at: &str) -> std::path::PathBuf {
    let path = dir.join(at);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    path
}

#[test]
fn temporaries_of_killed_writers_go_at_the_next_writable_open_and_a_live_writers_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let repo = Repository::init(&dir).unwrap();
    repo.backup_stream("a", "g", &vec![1u8; 100_000][..])
        .unwrap();
    // Another process writing: its put in flight.
    let live = temporary(&dir, "containers/.tmp-live");
    assert!(matches!(
        Repository::open(&dir),
        Err(RepoError::InUse { .. })
    ));
    drop(Repository::open_read_only(&dir).unwrap());
    assert!(live.exists(), "a live writer's temporary was removed");
    // Killed: its lock is gone, its temporaries stay behind.
    drop(repo);
    let stale = [
        live,
        temporary(&dir, ".tmp-root"),
        temporary(&dir, "recipes/.tmp-recipe"),
    ];
    drop(Repository::open_read_only(&dir).unwrap());
    assert!(stale.iter().all(|p| p.exists()), "a reader removed some");
    let repo = Repository::open(&dir).unwrap();
    for p in &stale {
        assert!(!p.exists(), "{} left", p.display());
    }
    let mut out = Vec::new();
    repo.restore("a", &mut out).unwrap();
    assert_eq!(out, vec![1u8; 100_000]);
}
