//! Backup records read once per handle while the bucket's listing tags
//! them the same (ETag), and read again when a name is taken by a new
//! backup. Its own test binary: it counts the process's S3 requests.

use std::io::Cursor;

use dedup_store::s3::requests_sent;
use dedup_store::Repository;

mod s3_support;
use s3_support::bucket_prefix;

/// GETs and LISTs sent while `f` ran.
fn sent(f: impl FnOnce()) -> (u64, u64) {
    let before = requests_sent();
    f();
    let after = requests_sent();
    (after.get - before.get, after.list - before.list)
}

#[test]
fn backup_records_are_read_again_only_when_their_objects_change() {
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
}
