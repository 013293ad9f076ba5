//! Backup records read once per handle while the bucket's listing tags
//! them the same (ETag), and read again when a name is taken by a new
//! backup; a new handle finds them in this machine's cache. Its own test
//! binary: it counts the process's S3 requests, and points the machine's
//! cache at a directory of its own.

use std::io::Cursor;

use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::crypto::KdfParams;
use dedup_store::s3::requests_sent;
use dedup_store::{RepoOptions, Repository};

#[path = "store/s3_support/mod.rs"]
mod s3_support;
use s3_support::bucket_prefix;

/// GETs and LISTs sent while `f` ran.
fn sent(f: impl FnOnce()) -> (u64, u64) {
    let before = requests_sent();
    f();
    let after = requests_sent();
    (after.get - before.get, after.list - before.list)
}

/// This binary's cache directory, set once before any handle is made
/// (the tests share it, and the process, so they run one after another).
fn own_cache() -> std::sync::MutexGuard<'static, std::path::PathBuf> {
    static CACHE: std::sync::OnceLock<std::sync::Mutex<std::path::PathBuf>> =
        std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dedup-s3-records-{}", std::process::id()));
        std::env::set_var("XDG_CACHE_HOME", &dir);
        std::sync::Mutex::new(dir)
    });
    cache.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn backup_records_are_read_again_only_when_their_objects_change() {
    let cache = own_cache();
    let Some(location) = bucket_prefix("records") else {
        return;
    };
    let repo = Repository::init(&location).unwrap();
    for (name, byte) in [("a", 1u8), ("b", 2), ("c", 3)] {
        repo.backup_stream(name, "g", Cursor::new(vec![byte; 100_000]))
            .unwrap();
    }
    let reader = Repository::open_read_only(&location).unwrap();
    let mut first = Vec::new();
    assert_eq!(
        sent(|| first = reader.list_backups_all().unwrap().backups),
        (3, 1),
        "every record read once"
    );
    let mut again = Vec::new();
    assert_eq!(
        sent(|| again = reader.list_backups_all().unwrap().backups),
        (0, 1),
        "nothing read again"
    );
    assert_eq!(first, again);

    // Another process takes the name "b" again, for other data in
    // another group: the listing's tag changes, and the record is read.
    repo.delete_backup("b").unwrap();
    repo.backup_stream("b", "h", Cursor::new(vec![9u8; 50_000]))
        .unwrap();
    let mut now = Vec::new();
    assert_eq!(
        sent(|| now = reader.list_backups_all().unwrap().backups),
        (1, 1),
        "the new b read, a and c not"
    );
    let b = now.iter().find(|r| r.name == "b").unwrap();
    assert_eq!((b.group.as_str(), b.report.bytes_in), ("h", 50_000));
    assert_eq!(b, &repo.backup("b").unwrap());

    repo.delete_backup("c").unwrap();
    let names: Vec<String> = reader
        .list_backups_all()
        .unwrap()
        .backups
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["a", "b"], "a deleted backup is not kept");
    let _ = std::fs::remove_dir_all(&*cache);
}

/// A new handle (a new `dedup backup`, say) reads no record this machine
/// read before under the same tag; a damaged or lost copy is read again.
#[test]
fn a_new_handle_finds_the_records_in_the_machines_cache() {
    new_handle_finds_the_records(false);
}

/// The same with the records sealed: the copies kept are the sealed
/// bytes, opened as a read would.
#[test]
fn a_new_handle_finds_sealed_records_in_the_machines_cache() {
    new_handle_finds_the_records(true);
}

fn new_handle_finds_the_records(sealed: bool) {
    let cache = own_cache();
    let Some(location) = bucket_prefix("records-new-handle") else {
        return;
    };
    // Only this test's copies from here on.
    let _ = std::fs::remove_dir_all(&*cache);
    let _passphrase = sealed.then(|| for_this_thread(b"records in a bucket"));
    let repo = Repository::init_with(
        &location,
        RepoOptions {
            encryption: sealed.then_some(KdfParams::FOR_TESTS),
            ..RepoOptions::default()
        },
    )
    .unwrap();
    assert_eq!(repo.is_encrypted(), sealed);
    for (name, byte) in [("a", 1u8), ("b", 2), ("c", 3)] {
        repo.backup_stream(name, "g", Cursor::new(vec![byte; 100_000]))
            .unwrap();
    }
    let list = |expect_gets: u64, why: &str| {
        let handle = Repository::open_read_only(&location).unwrap();
        let mut got = Vec::new();
        assert_eq!(
            sent(|| got = handle.list_backups_all().unwrap().backups).0,
            expect_gets,
            "{why}"
        );
        got
    };
    let first = list(3, "a first handle reads every record");
    assert_eq!(list(0, "a second handle reads none"), first);

    // Every copy damaged: each is refused and read again.
    let kept = cached_files(&cache);
    assert_eq!(kept.len(), 3, "one copy per record");
    for path in &kept {
        let mut bytes = std::fs::read(path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(path, bytes).unwrap();
    }
    assert_eq!(list(3, "damaged copies are read again"), first);
    assert_eq!(list(0, "and kept again"), first);

    // Copies whole by their digest whose records do not open (what a bad
    // answer kept before it was checked would look like): dropped and
    // read again, then kept again.
    for path in cached_files(&cache) {
        let garbage = b"not a backup record".to_vec();
        let mut entry = blake3::hash(&garbage).as_bytes().to_vec();
        entry.extend_from_slice(&garbage);
        std::fs::write(path, entry).unwrap();
    }
    assert_eq!(list(3, "copies that do not open are read again"), first);
    assert_eq!(list(0, "and kept again, whole"), first);

    // The machine's cache lost: read again, never wrong.
    std::fs::remove_dir_all(&*cache).unwrap();
    assert_eq!(list(3, "a lost cache is read again"), first);
    let _ = std::fs::remove_dir_all(&*cache);
}

/// The files of the machine's cache of listed objects.
fn cached_files(cache: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for service in std::fs::read_dir(cache.join("dedup/listed")).unwrap() {
        for entry in std::fs::read_dir(service.unwrap().path()).unwrap() {
            out.push(entry.unwrap().path());
        }
    }
    out
}
