//! A report's reader that goes away (`dedup status DEV --json | head`)
//! costs the rest of the report, never a panic; a standard output that
//! cannot be written (a full disk) fails the command, saying so.

mod support;

use std::process::{Command, Stdio};

use support::dedup;

fn device(tmp: &tempfile::TempDir) -> String {
    let dev = tmp.path().join("dev");
    let dev = dev.to_str().unwrap().to_string();
    let out = dedup(&["create", &dev, "--size", "1G"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dev
}

#[test]
fn a_reader_that_goes_away_ends_the_report_not_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = device(&tmp);
    for args in [
        vec!["status", dev.as_str(), "--json"],
        vec!["status", dev.as_str()],
        vec!["check", dev.as_str(), "--json"],
    ] {
        let mut child = support::spawn(&args, false);
        // Closed before the command writes a byte: its first write finds
        // no reader.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "dedup {args:?}: {stderr}");
        assert!(out.status.success(), "dedup {args:?}: {stderr}");
    }
}

#[test]
fn a_report_that_cannot_be_written_fails_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = device(&tmp);
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(["status", &dev, "--json"])
        .stdin(Stdio::null())
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("writing to standard output") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
