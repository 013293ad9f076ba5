//! `dedup store check` through the binary: exit 0 on a clean repository
//! (garbage included), 1 with the damaged object and the backups it costs
//! named in text and JSON, 2 when there is no repository to check.

mod support;

use support::dedup;

use std::fs;

/// Run `dedup args`, expecting exit code `code`; its stdout.
fn exits(code: i32, args: &[&str]) -> String {
    let out = dedup(args, None);
    assert_eq!(
        out.status.code(),
        Some(code),
        "dedup {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

/// Bytes that do not repeat within themselves (a simple LCG).
fn data(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (x >> 33) as u8
        })
        .collect()
}

fn backup(repo: &str, name: &str, bytes: &[u8]) {
    let out = dedup(&["backup", repo, name, "--stdin"], Some(bytes));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn store_check_exit_codes_text_and_json() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    exits(0, &["store", "init", r]);
    let one = data(200 << 10, 1);
    backup(r, "one", &one);
    backup(r, "two", &[&one[..], &data(8192, 2)].concat());

    let clean = json(&exits(0, &["store", "check", r, "--data", "--json"]));
    assert_eq!(clean["problems"], serde_json::json!([]));
    assert_eq!(clean["data_verified"], true);
    assert_eq!(clean["counts"]["backups"], 2);
    assert!(exits(0, &["store", "check", r]).contains("No damage found"));

    // Garbage is not damage: a recipe whose backup object is gone.
    let saved_two = fs::read(repo.join("backups/two")).unwrap();
    fs::remove_file(repo.join("backups/two")).unwrap();
    let garbage = json(&exits(0, &["store", "check", r, "--json"]));
    assert_eq!(garbage["garbage"].as_array().unwrap().len(), 2, "{garbage}");
    fs::write(repo.join("backups/two"), saved_two).unwrap();

    // A flipped byte in the first segment's body: only --data sees it.
    let c0 = repo.join("containers/0000000000000000");
    let mut bytes = fs::read(&c0).unwrap();
    bytes[100] ^= 1;
    fs::write(&c0, &bytes).unwrap();
    exits(0, &["store", "check", r]);
    let damaged = json(&exits(1, &["store", "check", r, "--data", "--json"]));
    let p = &damaged["problems"][0];
    assert_eq!(p["object"], "containers/0000000000000000");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("catalog entry 0:"),
        "{p}"
    );
    assert_eq!(
        damaged["affected_backups"],
        serde_json::json!(["one", "two"])
    );
    let text = exits(1, &["store", "check", r, "--data"]);
    assert!(
        text.contains("containers/0000000000000000: catalog entry 0"),
        "{text}"
    );
    assert!(
        text.contains("cannot be fully restored: one, two"),
        "{text}"
    );

    // No repository: could not run, and nothing created.
    let absent = tmp.path().join("absent");
    exits(2, &["store", "check", absent.to_str().unwrap()]);
    assert!(!absent.exists());
    let empty = tmp.path().join("empty");
    fs::create_dir(&empty).unwrap();
    exits(2, &["store", "check", empty.to_str().unwrap()]);

    let help = exits(0, &["store", "check", "--help"]);
    assert!(
        help.contains("Examples:") && help.contains("--data"),
        "{help}"
    );
}
