//! `dedup gc REPO` through the binary: it recognises a backup repository,
//! reclaims a deleted backup's containers, reports JSON, reuses the marks
//! of unchanged groups the second time, and refuses (naming the server)
//! while another process writes to the repository.

mod support;

use support::dedup;

fn ok_json(args: &[&str], stdin: Option<&[u8]>) -> serde_json::Value {
    let out = dedup(args, stdin);
    assert!(
        out.status.success(),
        "dedup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `len` bytes that do not repeat (an LCG from `seed`).
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) as u8
        })
        .collect()
}

#[test]
fn gc_of_a_repository_reclaims_a_deleted_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok_json(&["store", "init", r, "--json"], None);
    // two shares one's first 256 KiB, so one's container stays, mostly
    // dead once one is deleted: compacted, not deleted.
    let one = data(1, 2 << 20);
    let mut two = one[..256 << 10].to_vec();
    two.extend_from_slice(&data(2, 1 << 20));
    ok_json(&["backup", r, "one", "--stdin", "--json"], Some(&one));
    ok_json(
        &["backup", r, "two", "--stdin", "--group", "g", "--json"],
        Some(&two),
    );
    ok_json(&["delete", r, "one", "--json"], None);

    let gc = ok_json(&["gc", r, "--json"], None);
    assert_eq!(gc["backups"], 1);
    assert_eq!(gc["groups_remarked"], 1);
    assert_eq!(gc["recipes_read"], 1);
    assert_eq!(gc["containers_swept"], 0, "{gc}");
    assert_eq!(gc["containers_compacted"], 1, "{gc}");
    assert!(gc["bytes_reclaimed"].as_u64().unwrap() > 3 << 19, "{gc}");
    assert!(gc["seconds"].is_number());
    let restored = dedup(&["restore", r, "two", "-"], None);
    assert!(restored.status.success() && restored.stdout == two);

    let again = ok_json(&["gc", r, "--json", "--compact-below", "30"], None);
    assert_eq!(again["groups_reused"], 1);
    assert_eq!(again["recipes_read"], 0);
    assert_eq!(again["containers_swept"], 0);

    let text = dedup(&["gc", r], None);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("0 containers deleted and 0 compacted"));

    // Deleting the last backup frees its containers whole.
    ok_json(&["delete", r, "two", "--json"], None);
    let last = ok_json(&["gc", r, "--json"], None);
    assert!(last["containers_swept"].as_u64().unwrap() >= 2, "{last}");
    assert_eq!(last["groups_dropped"], 1);
    let stats = ok_json(&["store", "stats", r, "--json"], None);
    assert_eq!(stats["bytes_stored"], 0);

    // The threshold is a percentage, and only for repositories.
    let bad = dedup(&["gc", r, "--compact-below", "150"], None);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a percentage"));
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let dev = dedup(
        &["gc", empty.to_str().unwrap(), "--compact-below", "30"],
        None,
    );
    assert!(!dev.status.success());
    assert!(String::from_utf8_lossy(&dev.stderr).contains("for backup repositories"));

    // Another process writes: no lock, the collection runs beside it
    // and keeps what its running backup holds.
    let writer = dedup_store::Repository::open(&repo).unwrap();
    let mut running = writer.begin_backup("running", "g").unwrap();
    running.append(&vec![9u8; 100_000]).unwrap();
    let out = ok_json(&["gc", r, "--json"], None);
    assert_eq!(out["backups"], 0);
    running.commit().unwrap();
    let mut back = Vec::new();
    writer.restore("running", &mut back).unwrap();
    assert_eq!(back, vec![9u8; 100_000]);
    drop(writer);
}

/// A repository whose config is damaged is still named a repository, and
/// the config as what is damaged (not "not a dedup device directory").
#[test]
fn gc_of_a_repository_with_a_damaged_config_names_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok_json(&["store", "init", r, "--json"], None);
    let mut config = std::fs::read(repo.join("config")).unwrap();
    config[20] ^= 1;
    std::fs::write(repo.join("config"), config).unwrap();
    support::refused(&["gc", r], "config object");
    let out = dedup(&["gc", r], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is damaged") && !err.contains("device"),
        "{err}"
    );
}

/// `dedup list` beside a damaged backup object: the others listed (in
/// JSON too), the damaged one named on stderr, exit status 1.
#[test]
fn list_names_a_damaged_backup_and_lists_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    ok_json(&["store", "init", r, "--json"], None);
    for name in ["a", "b"] {
        support::ok(&["backup", r, name, "--stdin"], Some(name.as_bytes()));
    }
    let mut object = std::fs::read(repo.join("backups/a")).unwrap();
    object[40] ^= 1;
    std::fs::write(repo.join("backups/a"), object).unwrap();
    for json in [false, true] {
        let args: &[&str] = if json {
            &["list", r, "--json"]
        } else {
            &["list", r]
        };
        let out = dedup(args, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("backup a cannot be listed"), "{err}");
        let text = String::from_utf8_lossy(&out.stdout);
        if json {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v.as_array().unwrap().len(), 1, "{text}");
            assert_eq!(v[0]["name"], "b");
        } else {
            assert!(text.lines().any(|l| l.starts_with("b ")), "{text}");
        }
    }
}

/// `store remote gc --compact-below` takes a percent, as `dedup gc` does;
/// a bare number above 0 and at most 1 (a fraction before) is refused as
/// ambiguous, before anything connects.
#[test]
fn store_remote_gc_takes_a_percent_and_refuses_an_ambiguous_fraction() {
    let gc = |below: &str| {
        let server = "unix:/nonexistent/dedup.sock";
        dedup(
            &[
                "store",
                "remote",
                "--server",
                server,
                "gc",
                "--compact-below",
                below,
            ],
            None,
        )
    };
    let out = gc("0.5");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("ambiguous") && err.contains("50"),
        "{err}"
    );
    for below in ["50", "0", "0.5%", "100"] {
        let out = gc(below);
        let err = String::from_utf8_lossy(&out.stderr);
        // Taken: it gets as far as connecting.
        assert!(!err.contains("compact-below"), "{below}: {err}");
    }
}
