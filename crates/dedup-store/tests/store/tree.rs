//! Backups of files and directories: every kind of entry and its metadata
//! round trips; a second backup after edits stores only the edits;
//! `include`; refusals; trees from disk that would write outside the
//! target are refused; a walk over files that change or vanish.

use crate::tree_support;

use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use dedup_store::tree::{Kind, Node, Tree};
use dedup_store::{RepoError, Repository, RestoreOptions, TreeWalk};
use tree_support::*;

fn repo(tmp: &Path) -> Repository {
    Repository::init(tmp.join("repo")).unwrap()
}

#[test]
fn every_kind_of_entry_and_its_metadata_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let data = build(tmp.path());
    let before = listing(&data);
    let repo = repo(tmp.path());
    let mut seen = 0;
    let r = repo
        .backup_paths("one", "g", &[&data], |n| seen += n)
        .unwrap();
    assert_eq!(seen, r.backup.bytes_in);
    assert_eq!((r.counts.files, r.counts.symlinks), (11, 3));
    assert_eq!((r.counts.hard_links, r.counts.specials), (1, 1));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // The copy of big is found within the same backup.
    assert!(
        r.backup.bytes_new < r.backup.bytes_in - (3 << 20) + (64 << 10),
        "{r:?}"
    );
    assert_eq!(listing(&data), before, "the backup changed what it read");

    let target = tmp.path().join("restored");
    let rr = repo
        .restore_tree("one", &target, &RestoreOptions::default())
        .unwrap();
    assert_eq!(rr.counts, r.counts, "{rr:?}");
    assert_eq!(rr.bytes, r.backup.bytes_in);
    let restored = in_target(&target, &data);
    assert_same(&before, &listing(&restored));
    // Where the file system keeps user xattrs (ext4, tmpfs since 6.6).
    if let Some(v) = xattr::get(data.join("a/small"), "user.dedup").unwrap() {
        assert_eq!(
            xattr::get(restored.join("a/small"), "user.dedup").unwrap(),
            Some(v)
        );
    }
    // The stream of a files backup is its files' contents.
    let mut stream = Vec::new();
    repo.restore("one", &mut stream).unwrap();
    assert_eq!(stream.len() as u64, r.backup.bytes_in);
}

#[test]
fn a_second_backup_after_edits_stores_only_the_edits_and_both_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let data = build(tmp.path());
    let repo = repo(tmp.path());
    let first = listing(&data);
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(data.join("big"))
        .unwrap();
    std::io::Write::write_all(&mut f, &random(50_000, 9)).unwrap();
    drop(f);
    fs::remove_file(data.join("a/b/c/deep")).unwrap();
    fs::write(data.join("a/new"), b"new file").unwrap();
    let second = listing(&data);
    let r = repo.backup_paths("two", "g", &[&data], |_| {}).unwrap();
    assert!(r.backup.bytes_new < 70_000, "{r:?}");
    assert!(r.backup.bytes_in > 6 << 20, "{r:?}");
    for (name, want) in [("one", &first), ("two", &second)] {
        let target = tmp.path().join(name);
        repo.restore_tree(name, &target, &RestoreOptions::default())
            .unwrap();
        assert_same(want, &listing(&in_target(&target, &data)));
    }
}

#[test]
fn include_restores_only_what_is_asked_for_and_the_directories_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = build(tmp.path());
    let repo = repo(tmp.path());
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    let target = tmp.path().join("part");
    let opts = RestoreOptions {
        include: vec![data.join("a/b"), data.join("hard2")],
        ..RestoreOptions::default()
    };
    let r = repo.restore_tree("one", &target, &opts).unwrap();
    let restored = in_target(&target, &data);
    let got: Vec<_> = listing(&restored).entries.into_keys().collect();
    let want = [
        "",
        "a",
        "a/b",
        "a/b/c",
        "a/b/c/deep",
        "a/b/copy_of_big",
        "hard2",
    ];
    assert_eq!(got, want.map(PathBuf::from));
    // hard2's first name was left out: it gets the contents itself.
    assert_eq!(
        fs::read(restored.join("hard2")).unwrap(),
        b"one inode, two names"
    );
    assert_eq!(r.counts.files, 3);
    let e = repo
        .restore_tree(
            "one",
            &tmp.path().join("none"),
            &RestoreOptions {
                include: vec!["no/such/path".into()],
                ..RestoreOptions::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, RepoError::NoSuchPath { .. }), "{e}");
    assert!(!tmp.path().join("none").exists());
}

#[test]
fn refusals_non_empty_target_stream_backups_overlapping_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let data = build(tmp.path());
    let repo = repo(tmp.path());
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    let target = tmp.path().join("t");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("stray"), b"x").unwrap();
    let e = repo
        .restore_tree("one", &target, &RestoreOptions::default())
        .unwrap_err();
    assert!(matches!(e, RepoError::TargetNotEmpty { .. }), "{e}");

    // With force, over a symlink placed where a directory goes: the
    // symlink is replaced, and nothing is written where it pointed.
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let restored = in_target(&target, &data);
    fs::create_dir_all(restored.parent().unwrap()).unwrap();
    symlink(&outside, &restored).unwrap();
    let force = RestoreOptions {
        force: true,
        ..RestoreOptions::default()
    };
    repo.restore_tree("one", &target, &force).unwrap();
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_same(&listing(&data), &listing(&restored));
    // Again over its own restore.
    repo.restore_tree("one", &target, &force).unwrap();
    assert_same(&listing(&data), &listing(&restored));

    repo.backup_stream("s", "g", &b"a stream"[..]).unwrap();
    let e = repo
        .restore_tree("s", &tmp.path().join("s"), &RestoreOptions::default())
        .unwrap_err();
    assert!(matches!(e, RepoError::WrongKind { .. }), "{e}");
    for bad in [vec![data.clone(), data.join("a")], vec![data.join("../x")]] {
        let e = repo.backup_paths("bad", "g", &bad, |_| {}).unwrap_err();
        assert!(
            e.to_string().contains("overlap") || e.to_string().contains(".."),
            "{e}"
        );
    }
    let e = repo
        .backup_paths("bad", "g", &[tmp.path().join("absent")], |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("absent"), "{e}");
    assert!(
        repo.backup("bad").is_err(),
        "a refused backup was committed"
    );
}

/// Commit a backup of `content` whose tree object is `tree`, as a damaged
/// or hostile store could hold it: a commit checks its tree, so a benign
/// one is committed and the object replaced on disk afterwards.
fn plant(repo: &Repository, name: &str, content: &[u8], tree: &Tree) {
    let mut s = repo.begin_backup(name, "g").unwrap();
    if !content.is_empty() {
        s.append(content).unwrap();
    }
    let benign = Tree {
        stream_len: content.len() as u64,
        nodes: if content.is_empty() {
            vec![]
        } else {
            vec![file("benign", 0, content.len() as u64)]
        },
    };
    let record = s.commit_with_tree(Some(&benign.encode())).unwrap();
    let object = repo
        .dir()
        .expect("a directory")
        .join(record.tree.expect("a tree"));
    fs::remove_file(&object).unwrap();
    fs::write(&object, tree.encode()).unwrap();
}

fn file(path: &str, offset: u64, size: u64) -> Node {
    let mut n = Node::new(path.as_bytes(), Kind::File);
    (n.offset, n.size, n.mode) = (offset, size, 0o644);
    n
}

fn dir(path: &str) -> Node {
    let mut n = Node::new(path.as_bytes(), Kind::Dir);
    n.mode = 0o755;
    n
}

#[test]
fn trees_that_would_write_outside_the_target_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = repo(tmp.path());
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let o = outside.to_str().unwrap();
    let mut escape = Node::new(o.as_bytes(), Kind::Symlink);
    escape.target = o.as_bytes().to_vec();
    escape.path = b"a".to_vec();
    let evil: Vec<(&str, Vec<Node>)> = vec![
        ("dotdot", vec![file("../outside/x", 0, 4)]),
        ("absolute", vec![file(&format!("{o}/x"), 0, 4)]),
        ("inner", vec![dir("a"), file("a/../../outside/x", 0, 4)]),
        ("through-symlink", vec![escape.clone(), file("a/x", 0, 4)]),
        (
            "dir-through-symlink",
            vec![escape, dir("a/d"), file("a/d/x", 0, 4)],
        ),
    ];
    for (name, nodes) in evil {
        let tree = Tree {
            stream_len: 4,
            nodes,
        };
        plant(&repo, name, b"evil", &tree);
        let target = tmp.path().join(format!("t-{name}"));
        let e = repo
            .restore_tree(name, &target, &RestoreOptions::default())
            .expect_err(name);
        assert!(matches!(e, RepoError::Corrupt { .. }), "{name}: {e}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "{name}");
        assert!(!tmp.path().join("x").exists(), "{name}");
    }
    // A tree whose files do not add up to the stream.
    plant(
        &repo,
        "short",
        b"evil",
        &Tree {
            stream_len: 3,
            nodes: vec![file("x", 0, 3)],
        },
    );
    let e = repo
        .restore_tree("short", &tmp.path().join("t"), &RestoreOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("read 4"), "{e}");
}

#[test]
fn a_walk_records_what_it_read_and_skips_what_vanished() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("a"), b"12345").unwrap();
    fs::write(d.join("b"), b"gone").unwrap();
    fs::write(d.join("c"), b"xyz").unwrap();
    std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
    let mut walk = TreeWalk::new(&[&d]).unwrap();
    assert!(walk.next_file().unwrap());
    let mut buf = [0u8; 2];
    assert_eq!(walk.read(&mut buf).unwrap(), 2);
    // `a` grows while it is read, `b` goes before it is reached.
    fs::OpenOptions::new()
        .append(true)
        .open(d.join("a"))
        .unwrap();
    std::io::Write::write_all(
        &mut fs::OpenOptions::new()
            .append(true)
            .open(d.join("a"))
            .unwrap(),
        b"678",
    )
    .unwrap();
    fs::remove_file(d.join("b")).unwrap();
    let mut rest = Vec::new();
    walk.read_to_end(&mut rest).unwrap();
    while walk.next_file().unwrap() {
        walk.read_to_end(&mut rest).unwrap();
    }
    assert_eq!(rest, b"345678xyz");
    let (tree, counts, warnings) = walk.finish();
    let tree = tree.decode().unwrap();
    assert_eq!(counts.files, 2);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("vanished") && warnings[1].contains("socket"),
        "{warnings:?}"
    );
    let files: Vec<_> = tree
        .nodes
        .iter()
        .filter(|n| n.kind == Kind::File)
        .map(|n| {
            (
                n.path.rsplit(|&b| b == b'/').next().unwrap().to_vec(),
                n.offset,
                n.size,
            )
        })
        .collect();
    assert_eq!(files, [(b"a".to_vec(), 0, 8), (b"c".to_vec(), 8, 3)]);
    assert_eq!(tree.stream_len, 11);
    tree.check().unwrap();
}

#[test]
fn without_owners_everything_but_the_owners_is_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let data = build(tmp.path());
    let repo = repo(tmp.path());
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    let target = tmp.path().join("t");
    let opts = RestoreOptions {
        owners: false,
        ..RestoreOptions::default()
    };
    repo.restore_tree("one", &target, &opts).unwrap();
    let me = |mut l: Listing| {
        for e in l.entries.values_mut() {
            (e.uid, e.gid) = (0, 0);
        }
        l
    };
    let restored = listing(&in_target(&target, &data));
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert!(restored.entries.values().all(|e| e.uid == uid));
    assert_same(&me(listing(&data)), &me(restored));
}

/// `ln -s f sl; ln -P sl sl2` (as `cp -al` and rsnapshot make): the two
/// names of the symlink restore as two names of one symlink, never as a
/// link to what it points at, alone (`include`) too.
#[test]
fn a_hard_linked_symlink_restores_as_a_hard_link_to_the_symlink() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    fs::create_dir(&data).unwrap();
    fs::write(data.join("f"), b"pointed at").unwrap();
    symlink("f", data.join("sl")).unwrap();
    // linkat without AT_SYMLINK_FOLLOW: a second name of the symlink.
    fs::hard_link(data.join("sl"), data.join("sl2")).unwrap();
    let m = fs::symlink_metadata(data.join("sl2")).unwrap();
    assert!(m.file_type().is_symlink() && m.nlink() == 2, "{m:?}");
    let repo = repo(tmp.path());
    let r = repo.backup_paths("b", "g", &[&data], |_| {}).unwrap();
    assert_eq!((r.counts.symlinks, r.counts.hard_links), (1, 1));

    let target = tmp.path().join("out");
    let rr = repo
        .restore_tree("b", &target, &RestoreOptions::default())
        .unwrap();
    assert!(rr.warnings.is_empty(), "{:?}", rr.warnings);
    assert_eq!((rr.counts.symlinks, rr.counts.hard_links), (1, 1));
    let out = in_target(&target, &data);
    let (a, b) = (
        fs::symlink_metadata(out.join("sl")).unwrap(),
        fs::symlink_metadata(out.join("sl2")).unwrap(),
    );
    assert!(a.file_type().is_symlink() && b.file_type().is_symlink());
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
    assert_eq!(fs::read_link(out.join("sl2")).unwrap(), Path::new("f"));
    assert_eq!(fs::metadata(out.join("f")).unwrap().nlink(), 1);

    // The second name alone: the symlink is made in its place.
    let part = tmp.path().join("part");
    let options = RestoreOptions {
        include: vec![data.join("sl2")],
        ..RestoreOptions::default()
    };
    let rr = repo.restore_tree("b", &part, &options).unwrap();
    assert!(rr.warnings.is_empty(), "{:?}", rr.warnings);
    let sl2 = in_target(&part, &data).join("sl2");
    assert_eq!(fs::read_link(&sl2).unwrap(), Path::new("f"));
    assert!(!in_target(&part, &data).join("sl").exists());
}
