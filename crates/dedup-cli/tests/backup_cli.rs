//! The backup commands end to end through the `dedup` binary: init, a
//! backup from stdin (twice: the second all duplicate), list --json,
//! restore to a file and to stdout, refusals, delete.

mod support;

use support::{json, ok, refused, spawn};

use std::path::Path;

/// 3 MiB that do not repeat within themselves (a simple LCG).
fn data() -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..3 << 20)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) as u8
        })
        .collect()
}

/// A stream larger than the restore's 4 MiB direct-write chunks, with an
/// unaligned tail: restored to a new file and over an old one (--force),
/// byte for byte.
#[test]
fn a_stream_of_several_chunks_restores_whole_to_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("repo");
    let r = r.to_str().unwrap();
    let mut big = data();
    big.extend(data().iter().rev());
    big.extend(&data()[..(3 << 20) - 4095]);
    ok(&["store", "init", r], None);
    ok(&["backup", r, "big", "--stdin"], Some(&big));
    let target = tmp.path().join("big.out");
    let t = target.to_str().unwrap();
    ok(&["restore", r, "big", t], None);
    assert!(std::fs::read(&target).unwrap() == big);
    std::fs::write(&target, b"old").unwrap();
    ok(&["restore", r, "big", t, "--force"], None);
    assert!(std::fs::read(&target).unwrap() == big);
    // A character device is written as it comes, with nothing to sync
    // (fsync on /dev/null answers EINVAL, which failed the restore).
    refused(&["restore", r, "big", "/dev/null"], "use --force");
    ok(&["restore", r, "big", "/dev/null", "--force"], None);
}

/// A fifo is written as it is read: a restore waits, saying so, for
/// something to read it, and stops at one SIGTERM while it waits (a
/// plain open waited in the kernel, past the first signal); one whose
/// reader stops early fails with what reached the fifo counted.
#[test]
fn a_restore_into_a_fifo_waits_for_a_reader_and_says_how_far_it_got() {
    use std::io::Read;
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("repo");
    let r = r.to_str().unwrap();
    ok(&["store", "init", r], None);
    ok(&["backup", r, "big", "--stdin"], Some(&data()));
    let fifo = tmp.path().join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo touches nothing else.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let f = fifo.to_str().unwrap();

    let mut waiting = spawn(&["restore", r, "big", f, "--force"], false);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(waiting.try_wait().unwrap().is_none(), "it waits");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(waiting.id() as i32, libc::SIGTERM) };
    let status = waiting.wait().unwrap();
    let mut err = String::new();
    waiting
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("waiting for something to read the fifo"),
        "{err}"
    );
    assert!(err.contains("stopped by a signal while waiting"), "{err}");

    // A reader that takes 100,000 bytes and goes (into a file: a pipe
    // nobody drains would stop it before it goes), started after the
    // restore.
    let restore = spawn(&["restore", r, "big", f, "--force"], false);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let got = tmp.path().join("got");
    let mut reader = std::process::Command::new("head")
        .args(["-c", "100000", f])
        .stdout(std::fs::File::create(&got).unwrap())
        .spawn()
        .unwrap();
    let out = restore.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the whole stream went through head");
    assert!(err.contains("at most the stream's first"), "{err}");
    assert!(reader.wait().unwrap().success());
    assert!(std::fs::read(&got).unwrap()[..] == data()[..100_000]);
}

#[test]
fn init_backup_list_restore_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let data = data();

    // New repositories cut FastCDC segments unless told otherwise; this
    // one is fixed, so every segment of the repeat is a known 4 KiB.
    let other = tmp.path().join("default");
    let init = json(&ok(
        &["store", "init", other.to_str().unwrap(), "--json"],
        None,
    ));
    assert!(
        init["segments"].as_str().unwrap().starts_with("FastCDC"),
        "{init}"
    );
    let init = json(&ok(
        &["store", "init", r, "--segments", "fixed", "--json"],
        None,
    ));
    assert_eq!(init["segments"], "fixed 4.0 KiB");

    let first = json(&ok(&["backup", r, "one", "--stdin", "--json"], Some(&data)));
    assert_eq!(first["bytes_in"], data.len() as u64);
    assert_eq!(first["bytes_new"], data.len() as u64);
    assert_eq!(first["dedup_ratio"], 1.0);
    let second = json(&ok(
        &["backup", r, "two", "--stdin", "--group", "g", "--json"],
        Some(&data),
    ));
    assert_eq!(second["bytes_new"], 0);
    assert_eq!(second["segments_duplicate"], 768);
    assert!(second["dedup_ratio"].is_null());

    let list = json(&ok(&["list", r, "--json"], None));
    let names: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap(), b["group"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("one", "default"), ("two", "g")]);

    let target = tmp.path().join("restored");
    let t = target.to_str().unwrap();
    ok(&["restore", r, "two", t], None);
    assert!(std::fs::read(&target).unwrap() == data);
    assert!(ok(&["restore", r, "one", "-"], None) == data);
    refused(&["restore", r, "one", t], "already exists");
    refused(&["restore", r, "nosuch", "-"], "no backup named nosuch");
    refused(&["backup", r, "x", "/etc", "--stdin"], "not both");

    let stats = json(&ok(&["store", "stats", r, "--json"], None));
    assert_eq!(stats["backups"], 2);
    assert_eq!(stats["logical_bytes"], 2 * data.len() as u64);

    let deleted = json(&ok(&["delete", r, "one", "--json"], None));
    assert_eq!(deleted["deleted"], "one");
    let list = json(&ok(&["list", r, "--json"], None));
    assert_eq!(list.as_array().unwrap().len(), 1);
    refused(&["delete", r, "one"], "no backup named one");
    // The containers stay: the remaining backup still restores.
    assert!(ok(&["restore", r, "two", "-"], None) == data);
    assert!(Path::new(&repo).join("config").exists());
}

/// A repository in a temporary directory holding `data()` as backup "one".
fn repo_with_one() -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let data = data();
    ok(&["store", "init", r], None);
    ok(&["backup", r, "one", "--stdin"], Some(&data));
    (tmp, repo, data)
}

/// A stream restored with --force over an existing file replaces it only
/// once the whole restore has succeeded: one that fails (its recipe
/// damaged: nothing of the stream can be found) leaves the old file as it
/// was, and no temporary file.
#[test]
fn a_failed_restore_over_a_file_leaves_the_file_as_it_was() {
    let (tmp, repo, data) = repo_with_one();
    let r = repo.to_str().unwrap();
    let out = tmp.path().join("out");
    let old = b"the file that was here".to_vec();
    std::fs::write(&out, &old).unwrap();
    let o = out.to_str().unwrap();

    let victim = std::fs::read_dir(repo.join("recipes"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let good = std::fs::read(&victim).unwrap();
    let mut bad = good.clone();
    bad[20] ^= 0x55;
    std::fs::write(&victim, &bad).unwrap();

    refused(&["restore", r, "one", o, "--force"], "as it was");
    assert_eq!(std::fs::read(&out).unwrap(), old);
    let fresh = tmp.path().join("fresh");
    refused(&["restore", r, "one", fresh.to_str().unwrap()], "as it was");
    assert!(!fresh.exists());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        left.iter().all(|n| !n.starts_with(".dedup-restore-")),
        "{left:?}"
    );

    // Repaired, the same restore replaces the file, and makes a new one
    // private (0600).
    std::fs::write(&victim, &good).unwrap();
    ok(&["restore", r, "one", o, "--force"], None);
    assert!(std::fs::read(&out).unwrap() == data);
    ok(&["restore", r, "one", fresh.to_str().unwrap()], None);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    refused(
        &["restore", r, "one", tmp.path().to_str().unwrap(), "--force"],
        "is a directory",
    );
}

/// `--force` over a file keeps that file's mode (a new file is 0600); a
/// symlink, to a file or to nothing, is refused without --force and with
/// it replaced itself by a new file, never written through.
#[test]
fn a_replaced_file_keeps_its_mode_and_a_symlink_is_replaced_never_written_through() {
    use std::os::unix::fs::PermissionsExt;
    let (tmp, repo, data) = repo_with_one();
    let r = repo.to_str().unwrap();
    let out = tmp.path().join("shared.img");
    std::fs::write(&out, b"old").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
    ok(
        &["restore", r, "one", out.to_str().unwrap(), "--force"],
        None,
    );
    assert!(std::fs::read(&out).unwrap() == data);
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);

    let pointed = tmp.path().join("pointed");
    std::fs::write(&pointed, b"not to be written").unwrap();
    for to in [pointed.clone(), tmp.path().join("nothing")] {
        let link = tmp.path().join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&to, &link).unwrap();
        let l = link.to_str().unwrap();
        refused(&["restore", r, "one", l], "a symbolic link");
        assert!(std::fs::read_link(&link).unwrap() == to);
        ok(&["restore", r, "one", l, "--force"], None);
        let m = std::fs::symlink_metadata(&link).unwrap();
        assert!(m.file_type().is_file(), "the link itself is replaced");
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read(&link).unwrap() == data);
    }
    assert_eq!(std::fs::read(&pointed).unwrap(), b"not to be written");
    assert!(!tmp.path().join("nothing").exists());
}

/// One damaged frame of a stream costs only its byte ranges: the restore
/// writes every other byte where it belongs, zeros in the damaged ranges,
/// names them with their offsets (text and JSON), and exits 1; to
/// standard output the same.
#[test]
fn a_damaged_frame_costs_a_stream_only_its_ranges_which_are_named() {
    let (tmp, repo, data) = repo_with_one();
    let r = repo.to_str().unwrap();
    let mut containers: Vec<_> = std::fs::read_dir(repo.join("containers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    containers.sort();
    let victim = containers[0].clone();
    let mut bad = std::fs::read(&victim).unwrap();
    // In the first frame, which starts after the 32-byte header.
    bad[40] ^= 0x55;
    std::fs::write(&victim, &bad).unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let got = support::dedup(&["restore", r, "one", o, "--json"], None);
    assert_eq!(got.status.code(), Some(1), "{got:?}");
    let err = String::from_utf8_lossy(&got.stderr);
    assert!(
        err.contains("damaged: bytes 0..") && err.contains("containers/0"),
        "{err}"
    );
    let report = support::json(&got.stdout);
    let damaged = report["damaged"].as_array().unwrap();
    assert!(!damaged.is_empty(), "{report}");
    let restored = std::fs::read(&out).unwrap();
    assert_eq!(restored.len(), data.len());
    let mut lost = 0;
    for (i, (&have, &want)) in restored.iter().zip(&data).enumerate() {
        let i = i as u64;
        let hit = damaged.iter().any(|d| {
            let (at, len) = (d["offset"].as_u64().unwrap(), d["len"].as_u64().unwrap());
            (at..at + len).contains(&i)
        });
        assert_eq!(have, if hit { 0 } else { want }, "byte {i}");
        lost += u64::from(hit);
    }
    assert!(
        lost > 0 && lost < data.len() as u64 / 2,
        "{lost} bytes lost"
    );
    let got = support::dedup(&["restore", r, "one", "-"], None);
    assert_eq!(got.status.code(), Some(1));
    assert!(got.stdout == restored);
}

/// SIGTERM mid-restore: the restore stops at its next write and removes
/// its temporary copy, leaving the target as it was (absent here), or it
/// had already finished and the target is whole. Never a half-written
/// target or a stray `.dedup-restore-*` file. A SIGINT ignored when the
/// restore started (a background job of a script) stays ignored.
#[test]
fn a_restore_stopped_by_a_signal_leaves_no_temporary_file() {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("repo");
    let r = r.to_str().unwrap();
    ok(&["store", "init", r, "--compression", "none"], None);
    let stream = dedup_core::testdata::noise(7, 256 << 20);
    ok(&["backup", r, "big", "--stdin"], Some(&stream));
    for delay_ms in [50, 150, 400] {
        let target = tmp.path().join("big.out");
        let t = target.to_str().unwrap();
        let mut child = spawn(&["restore", r, "big", t], false);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let status = child.wait().unwrap();
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".dedup-restore-"))
            .collect();
        assert!(left.is_empty(), "after {delay_ms} ms: {left:?}");
        if status.success() {
            assert!(
                std::fs::read(&target).unwrap() == stream,
                "after {delay_ms} ms"
            );
            std::fs::remove_file(&target).unwrap();
        } else {
            assert!(
                !target.exists(),
                "after {delay_ms} ms: a failed restore made {t}"
            );
        }
    }
}
