//! Backups of files through a server reuse the unchanged files of their
//! parent (the server's newest backup of files in the group) without
//! reading them, as a backup beside the repository does: the client is
//! sent the parent's tree, decides what is unchanged, and sends ranges of
//! the parent's stream, which the server takes segment by segment,
//! confirming each. A parent that cannot be reused whole fails that try
//! and costs a second one that reads every file; requests that name a
//! parent wrongly are refused.

use crate::rpc_support;
use crate::tree_support;

use std::fs;
use std::path::Path;

use dedup_store::recipe::parts::part_name;
use dedup_store::rpc::protocol::{Call, ErrorKind, Item, Reply, WireError};
use dedup_store::rpc::{BackupOptions, Client, ClientError, FilesBackup};
use dedup_store::{CheckOptions, Repository, RestoreOptions};
use rpc_support::{begin, setup, Running};
use tree_support::{assert_same, edit_some, files, in_target, listing, settle, Listing};

/// A served repository and `files` beside it, aged past `settle`.
fn serving_files() -> (tempfile::TempDir, Running, std::path::PathBuf) {
    let (tmp, server) = setup();
    let data = files(tmp.path());
    settle();
    (tmp, server, data)
}

fn backup(c: &Client, name: &str, data: &Path, opts: &BackupOptions) -> FilesBackup {
    c.backup_paths(name, "g", &[data], opts, &|_| {}).unwrap()
}

/// Backup `name` restored from the repository at `dir`, as listed.
fn restored(dir: &Path, name: &str, data: &Path) -> Listing {
    let repo = Repository::open_read_only(dir.join("repo")).unwrap();
    let target = dir.join(format!("restored-{name}"));
    let _ = fs::remove_dir_all(&target);
    repo.restore_tree(name, &target, &RestoreOptions::default())
        .unwrap();
    listing(&in_target(&target, data))
}

#[test]
fn unchanged_files_are_reused_unread_through_the_server_and_changed_ones_are_read() {
    let (tmp, server, data) = serving_files();
    let c = server.client();
    let opts = BackupOptions::default();
    let one = backup(&c, "one", &data, &opts);
    assert_eq!((one.parent.as_deref(), one.files_unchanged), (None, 0));

    let two = backup(&c, "two", &data, &opts);
    assert_eq!(two.parent.as_deref(), Some("one"));
    assert_eq!(two.files_unchanged, 21, "{two:?}");
    assert_eq!(two.bytes_unchanged, one.backup.report.bytes_in);
    assert_eq!(two.backup.report.bytes_new, 0);
    assert_eq!(two.backup.report.bytes_in, one.backup.report.bytes_in);
    assert_eq!(two.parent_refused, None);

    // Three files changed, and one gone between two unchanged ones in
    // the walk's order, whose runs then do not meet in the parent's
    // stream: the unchanged files around them are reused in pieces.
    edit_some(&data);
    fs::remove_file(data.join("sub/f12")).unwrap();
    settle();
    let three = backup(&c, "three", &data, &opts);
    assert_eq!(three.parent.as_deref(), Some("two"));
    assert_eq!(three.files_unchanged, 18, "{three:?}");
    assert!(three.backup.report.bytes_new > 0);
    let snapshot_three = listing(&data);

    // Without a parent, every file is read; nothing new is stored.
    let unread = BackupOptions {
        parent: false,
        ..opts
    };
    let four = backup(&c, "four", &data, &unread);
    assert_eq!((four.parent, four.files_unchanged), (None, 0));
    assert_eq!(four.backup.report.bytes_new, 0);

    // Another group has no parent here.
    let other = c
        .backup_paths("other", "h", &[&data], &opts, &|_| {})
        .unwrap();
    assert_eq!((other.parent, other.files_unchanged), (None, 0));

    // The parents go; what "three" reused from them must stay.
    c.call(Call::Delete { name: "one".into() }).unwrap();
    c.call(Call::Delete { name: "two".into() }).unwrap();
    c.call(Call::Gc {
        compact_below: Some(1.0),
    })
    .unwrap();
    server.shut();
    assert_same(&snapshot_three, &restored(tmp.path(), "three", &data));
    assert_same(&snapshot_three, &restored(tmp.path(), "four", &data));
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let report = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_parent_that_cannot_be_reused_whole_costs_a_second_try_that_reads_every_file() {
    let (tmp, server, data) = serving_files();
    let c = server.client();
    let opts = BackupOptions::default();
    backup(&c, "one", &data, &opts);
    server.shut();
    // The rig's recipes are in parts of 64 segments: lose one of the
    // parent's, as a damaged disk would.
    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    let recipe = repo.backup("one").unwrap().recipe;
    drop(repo);
    fs::remove_file(tmp.path().join("repo").join(part_name(&recipe, 1))).unwrap();
    // Changed files after the run that fails: their lookups reach the
    // server after it ended the session, and answer "no such session";
    // the run's own error must still be the one the client sees.
    edit_some(&data);
    settle();

    let server = Running::with_limits(tmp.path(), Default::default());
    let c = server.client();
    // One try alone fails and leaves nothing.
    let walk = dedup_store::TreeWalk::new(&[&data]).unwrap();
    match c.backup_files("two", "g", walk, &opts, &|_| {}) {
        Err(ClientError::Server(WireError {
            kind: ErrorKind::ParentUnusable,
            message,
        })) => assert!(message.contains("parent backup one"), "{message}"),
        other => panic!("{other:?}"),
    }
    // backup_paths tries again, reading every file.
    let two = backup(&c, "two", &data, &opts);
    assert!(two.parent_refused.is_some(), "{two:?}");
    assert_eq!((two.parent, two.files_unchanged), (None, 0));
    let names: Vec<String> = match c.call(Call::List).unwrap() {
        Reply::Backups(b) => b.into_iter().map(|b| b.name).collect(),
        other => panic!("{other:?}"),
    };
    assert_eq!(names.len(), 2, "{names:?}");
    server.shut();
    assert_same(&listing(&data), &restored(tmp.path(), "two", &data));
}

fn refused(c: &Client, call: Call) -> WireError {
    match c.call(call) {
        Err(ClientError::Server(e)) => e,
        other => panic!("{other:?}"),
    }
}

fn append(session: u64, offset: u64, len: u64) -> Call {
    Call::Append {
        session,
        items: vec![Item::Parent { offset, len }],
    }
}

#[test]
fn parent_requests_that_do_not_fit_are_refused_and_the_server_lives() {
    let (_tmp, server, data) = serving_files();
    let c = server.client();
    // No backup of files yet: no parent, and no parent item.
    let s = begin(&c, "a");
    let none = c.call(Call::ParentTree { session: s, at: 0 }).unwrap();
    assert_eq!(
        none,
        Reply::ParentTree {
            name: None,
            total: 0,
            bytes: Vec::new()
        }
    );
    let e = refused(&c, append(s, 0, 10));
    assert_eq!(e.kind, ErrorKind::BadRequest, "{e:?}");
    backup(&c, "one", &data, &BackupOptions::default());

    // A parent item before the parent was asked for.
    let s = begin(&c, "b");
    assert_eq!(refused(&c, append(s, 0, 10)).kind, ErrorKind::BadRequest);
    let parent_tree = |s: u64, at: u64| c.call(Call::ParentTree { session: s, at });
    let s = begin(&c, "c");
    let Reply::ParentTree { name, total, bytes } = parent_tree(s, 0).unwrap() else {
        panic!()
    };
    assert_eq!((name.as_deref(), bytes.len() as u64), (Some("one"), total));
    // From a later byte, the rest of it.
    let s2 = begin(&c, "c2");
    let Reply::ParentTree { bytes: rest, .. } = parent_tree(s2, 5).unwrap() else {
        panic!()
    };
    assert_eq!(rest, bytes[5..]);
    // Sent to its end, the tree is not kept; past its end is refused.
    let again = parent_tree(s, 0).unwrap_err().to_string();
    assert!(again.contains("already sent"), "{again}");
    assert!(parent_tree(s, total + 1).is_err());
    let stream_len = match c.call(Call::List).unwrap() {
        Reply::Backups(b) => b[0].report.bytes_in,
        other => panic!("{other:?}"),
    };
    for (offset, len) in [(0, 0), (u64::MAX, 2)] {
        let s = begin(&c, "d");
        parent_tree(s, 0).unwrap();
        let e = refused(&c, append(s, offset, len));
        assert_eq!(e.kind, ErrorKind::BadRequest, "{offset} + {len}: {e:?}");
    }
    // Not on the parent's segments, or past its stream: unusable.
    for (offset, len) in [(1, 4096), (0, 1), (1 << 40, 10)] {
        let s = begin(&c, "e");
        parent_tree(s, 0).unwrap();
        let e = refused(&c, append(s, offset, len));
        assert_eq!(e.kind, ErrorKind::ParentUnusable, "{offset} + {len}: {e:?}");
    }
    // The whole parent once, then again: runs only go forward, so a
    // client cannot make the server take the parent over and over.
    let s = begin(&c, "f");
    parent_tree(s, 0).unwrap();
    c.call(append(s, 0, stream_len)).unwrap();
    let e = refused(&c, append(s, 0, stream_len));
    assert_eq!(e.kind, ErrorKind::ParentUnusable, "{e:?}");
    // Every refused session is gone: "c" and "c2" run on.
    let running = |c: &Client| match c.call(Call::Stats).unwrap() {
        Reply::Stats(s) => s.running_backups,
        other => panic!("{other:?}"),
    };
    assert_eq!(running(&c), 2);
    c.call(Call::Abort { session: s2 }).unwrap();
    assert_eq!(running(&c), 1);
    // The server still backs up.
    let two = backup(&c, "two", &data, &BackupOptions::default());
    assert_eq!(two.parent.as_deref(), Some("one"));
    assert_eq!(two.files_unchanged, 21);
    server.shut();
}

#[test]
fn paths_given_in_another_order_are_walked_as_before_and_reused() {
    let (tmp, server) = setup();
    let (a, b) = (files(&tmp.path().join("a")), files(&tmp.path().join("b")));
    settle();
    let c = server.client();
    let opts = BackupOptions::default();
    c.backup_paths("ab", "g", &[&a, &b], &opts, &|_| {})
        .unwrap();
    // The walk sorts the paths it is given, so the runs of unchanged
    // files go forward through the parent's stream as the server asks.
    let ba = c
        .backup_paths("ba", "g", &[&b, &a], &opts, &|_| {})
        .unwrap();
    assert_eq!(
        (ba.files_unchanged, &ba.parent_refused),
        (42, &None),
        "{ba:?}"
    );
    assert_eq!(ba.bytes_unchanged, ba.backup.report.bytes_in);
    server.shut();
    assert_same(&listing(&a), &restored(tmp.path(), "ba", &a));
    assert_same(&listing(&b), &restored(tmp.path(), "ba", &b));
}
