//! Temporary files (`.tmp-<process>.*`) that killed writers left (a
//! backup or a server killed mid-`put`) are removed when the repository is
//! next opened to write; those of live processes (other writers putting
//! now) and those whose writer cannot be told stay.

use std::path::Path;

use dedup_store::Repository;

fn temporary(dir: &Path, at: &str) -> std::path::PathBuf {
    let path = dir.join(at);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
    path
}

#[test]
fn temporaries_of_dead_writers_go_at_the_next_writable_open_and_live_ones_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let repo = Repository::init(&dir).unwrap();
    repo.backup_stream("a", "g", &vec![1u8; 100_000][..])
        .unwrap();
    // This process's tag, and one of a pid that no longer runs here.
    let me = dedup_store::process::tag();
    let (machine, rest) = me.split_once('-').unwrap();
    let start = rest.split_once('-').unwrap().1;
    let dead = format!("{machine}-4000000-{start}");
    let live = [
        temporary(&dir, &format!("containers/.tmp-{me}.abc")),
        temporary(&dir, ".tmp-0123456789abcdef-4000000-5.abc"),
        temporary(&dir, "recipes/.tmp-old"),
    ];
    let stale = [
        temporary(&dir, &format!(".tmp-{dead}.root")),
        temporary(&dir, &format!("recipes/.tmp-{dead}.recipe")),
    ];
    drop(Repository::open_read_only(&dir).unwrap());
    assert!(stale.iter().all(|p| p.exists()), "a reader removed some");
    let second = Repository::open(&dir).unwrap();
    for p in &stale {
        assert!(!p.exists(), "{} left", p.display());
    }
    for p in &live {
        assert!(p.exists(), "{} removed", p.display());
    }
    let mut out = Vec::new();
    second.restore("a", &mut out).unwrap();
    assert_eq!(out, vec![1u8; 100_000]);
    drop(repo);
}
