//! Backups of files and directories through the `dedup` binary: back up a
//! tree with odd modes, times, symlinks and hard links (twice: the second
//! all duplicate), list shows it as files, restore it whole and in part,
//! and the refusals.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, UNIX_EPOCH};

fn dedup(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run dedup")
}

fn ok(args: &[&str]) -> serde_json::Value {
    let out = dedup(args);
    assert!(
        out.status.success(),
        "dedup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn refused(args: &[&str], says: &str) {
    let out = dedup(args);
    assert!(!out.status.success(), "dedup {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(says),
        "dedup {args:?} said {err:?}, not {says:?}"
    );
}

fn build(d: &Path) {
    fs::create_dir_all(d.join("sub/deeper")).unwrap();
    fs::create_dir(d.join("empty")).unwrap();
    fs::write(d.join("sub/deeper/big"), vec![7u8; 1 << 20]).unwrap();
    fs::write(d.join("sub/text"), b"hello\n").unwrap();
    fs::write(d.join("zero"), b"").unwrap();
    fs::write(d.join("suid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(d.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::hard_link(d.join("sub/text"), d.join("text-again")).unwrap();
    symlink("sub/text", d.join("link")).unwrap();
    symlink("/no/such/file", d.join("dangling")).unwrap();
    // Times after contents: files, then directories deepest first.
    let mut t = 1_500_000_000;
    for p in [
        "sub/deeper/big",
        "sub/text",
        "zero",
        "suid",
        "sub/deeper",
        "sub",
        "empty",
        "",
    ] {
        t += 1;
        let when = UNIX_EPOCH + Duration::new(t, 987_654_321);
        fs::File::open(d.join(p))
            .unwrap()
            .set_modified(when)
            .unwrap();
    }
    fs::set_permissions(d.join("sub"), fs::Permissions::from_mode(0o1750)).unwrap();
}

/// (path, mode, mtime s, ns, size, symlink target, contents) of every
/// entry, and the paths sharing an inode.
type Row = (
    PathBuf,
    u32,
    i64,
    i64,
    u64,
    Option<PathBuf>,
    Option<Vec<u8>>,
);

fn rows(root: &Path) -> (Vec<Row>, Vec<Vec<PathBuf>>) {
    let mut out = Vec::new();
    let mut inodes = std::collections::BTreeMap::<u64, Vec<PathBuf>>::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let m = fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        } else {
            inodes.entry(m.ino()).or_default().push(rel.clone());
        }
        let link = m.is_symlink().then(|| fs::read_link(&p).unwrap());
        let data = m.is_file().then(|| fs::read(&p).unwrap());
        let size = if m.is_dir() { 0 } else { m.size() };
        out.push((rel, m.mode(), m.mtime(), m.mtime_nsec(), size, link, data));
    }
    out.sort();
    let mut links: Vec<_> = inodes.into_values().filter(|v| v.len() > 1).collect();
    links.iter_mut().for_each(|v| v.sort());
    links.sort();
    (out, links)
}

#[test]
fn back_up_a_tree_list_restore_whole_and_in_part() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let src = tmp.path().join("src");
    build(&src);
    let s = src.to_str().unwrap();
    ok(&["store", "init", r, "--json"]);

    let one = ok(&["backup", r, "one", s, "--json"]);
    assert_eq!(one["files"], 4, "{one}");
    assert_eq!(
        one["dirs"].as_u64().unwrap(),
        4 + src.components().count() as u64 - 2
    );
    assert_eq!(
        (one["symlinks"].as_u64(), one["hard_links"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(one["bytes_in"], (1 << 20) + 6 + 10);
    let two = ok(&["backup", r, "two", s, "--group", "g", "--json"]);
    assert_eq!(two["bytes_new"], 0, "{two}");
    ok(&["backup", r, "stream", "--stdin", "--json"]);

    let list = ok(&["list", r, "--json"]);
    let kinds: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["files", "stream", "files"]);

    let target = tmp.path().join("restored");
    let t = target.to_str().unwrap();
    let rr = ok(&["restore", r, "two", t, "--json"]);
    assert_eq!(
        (rr["files"].as_u64(), rr["hard_links"].as_u64()),
        (Some(4), Some(1))
    );
    let restored = target.join(src.strip_prefix("/").unwrap());
    assert_eq!(rows(&src), rows(&restored));

    let part = tmp.path().join("part");
    let p = part.to_str().unwrap();
    let inc = format!("{}/sub/deeper", s.trim_start_matches('/'));
    ok(&["restore", r, "one", p, "--include", &inc, "--json"]);
    let partial = part.join(src.strip_prefix("/").unwrap());
    assert!(partial.join("sub/deeper/big").is_file());
    assert!(!partial.join("sub/text").exists() && !partial.join("zero").exists());

    refused(&["restore", r, "one", t], "not empty");
    ok(&["restore", r, "one", t, "--force", "--json"]);
    assert_eq!(rows(&src), rows(&restored));
    refused(&["restore", r, "one", "-"], "restore it into a directory");
    refused(
        &["restore", r, "one", p, "--include", "nope"],
        "nothing in backup one",
    );
    refused(
        &["restore", r, "stream", "-", "--include", "x"],
        "is a stream",
    );
    refused(&["backup", r, "x", s, "--stdin"], "not both");
    refused(&["backup", r, "x", "/no/such/dir"], "/no/such/dir");
    refused(&["backup", r, "x", s, &format!("{s}/sub")], "overlap");
    refused(&["backup", r, "x"], "nothing to back up");
}

/// One flipped byte in the frames of one file: the restore makes every
/// other file byte for byte, names the damaged one (stderr and JSON) with
/// the range it lost, and exits 1, for each backup sharing the frame;
/// `--include` of an intact file reads no damaged frame and exits 0.
#[test]
fn a_damaged_frame_costs_only_its_file_which_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    // Random bytes: frames stored as they are, in stream order (a, b).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (x >> 33) as u8
            })
            .collect()
    };
    let (a, b) = (random(3_000_000), random(3_000_000));
    fs::write(src.join("a"), &a).unwrap();
    fs::write(src.join("b"), &b).unwrap();
    let s = src.to_str().unwrap();
    ok(&["store", "init", r, "--json"]);
    ok(&["backup", r, "one", s, "--json"]);
    ok(&["backup", r, "two", s, "--json"]);
    let container = fs::read_dir(repo.join("containers"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = fs::read(&container).unwrap();
    // In a's second frame (1 MiB raw, zstd's target, stored as is).
    bytes[32 + 1_500_000] ^= 0x55;
    fs::write(&container, bytes).unwrap();

    let rel = src.strip_prefix("/").unwrap();
    for name in ["one", "two"] {
        let target = tmp.path().join(format!("out-{name}"));
        let t = target.to_str().unwrap();
        let got = dedup(&["restore", r, name, t, "--json"]);
        assert_eq!(got.status.code(), Some(1), "{got:?}");
        let err = String::from_utf8_lossy(&got.stderr);
        let named = format!("{}: bytes ", target.join(rel).join("a").display());
        assert!(
            err.contains(&named) && err.contains("1 file of backup"),
            "{err}"
        );
        let report: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
        let damaged = report["damaged"].as_array().unwrap();
        assert_eq!(damaged.len(), 1, "{report}");
        assert!(damaged[0]["path"].as_str().unwrap().ends_with("/a"));
        let range = &damaged[0]["ranges"][0];
        let (at, len) = (
            range["offset"].as_u64().unwrap(),
            range["len"].as_u64().unwrap(),
        );
        assert!(
            at <= 1_500_000 && 1_500_000 < at + len && len <= 1 << 20,
            "{range}"
        );
        assert!(fs::read(target.join(rel).join("b")).unwrap() == b);
        let have = fs::read(target.join(rel).join("a")).unwrap();
        assert_eq!(have.len(), a.len());
        assert!(have[..at as usize] == a[..at as usize]);
        assert!(have[(at + len) as usize..] == a[(at + len) as usize..]);
    }
    let part = tmp.path().join("part");
    let inc = format!("{}/b", s.trim_start_matches('/'));
    ok(&[
        "restore",
        r,
        "one",
        part.to_str().unwrap(),
        "--include",
        &inc,
        "--json",
    ]);
    assert!(fs::read(part.join(rel).join("b")).unwrap() == b);
}

/// The report names what the walk found on its first line and the sizes
/// on the next, whole: a line of 200 columns used to wrap in a terminal
/// just before "; 4.1 GiB in" (issue 35, item 12).
#[test]
fn the_report_puts_the_counts_and_the_sizes_on_lines_of_their_own() {
    let tmp = tempfile::tempdir().unwrap();
    let (repo, data) = (tmp.path().join("r"), tmp.path().join("d"));
    fs::create_dir(&data).unwrap();
    fs::write(data.join("f"), vec![7u8; 100_000]).unwrap();
    let (repo_s, data_s) = (repo.to_str().unwrap(), data.to_str().unwrap());
    let out = dedup(&["store", "init", repo_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = dedup(&["backup", repo_s, "one", data_s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("Backed up one into") && lines[0].ends_with("0 special files."),
        "{text}"
    );
    assert!(
        lines[1].contains(" in, ") && !lines[1].starts_with(';') && lines[1].len() < 120,
        "{text}"
    );
}
