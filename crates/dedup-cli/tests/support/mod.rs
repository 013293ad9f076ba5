//! Running the `dedup` binary from the backup store's CLI tests.
#![allow(dead_code)] // each test file uses its own part

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};

/// Start `dedup ARGS` with stdout and stderr piped, and stdin piped or
/// /dev/null.
pub fn spawn(args: &[&str], piped_stdin: bool) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(args)
        .stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dedup")
}

/// Run `dedup ARGS`, feeding `stdin` if given (else /dev/null).
///
/// A child that exits without reading its input closes the pipe under us:
/// that broken pipe is not the test's failure, so it is let pass and the
/// child's exit status and stderr say what happened.
pub fn dedup(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = spawn(args, stdin.is_some());
    if let Some(data) = stdin {
        match child.stdin.take().unwrap().write_all(data) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                panic!("feeding dedup {args:?}: {e}")
            }
            _ => {}
        }
    }
    child.wait_with_output().unwrap()
}

/// `dedup ARGS`'s stdout; it must succeed.
pub fn ok(args: &[&str], stdin: Option<&[u8]>) -> Vec<u8> {
    let out = dedup(args, stdin);
    assert!(
        out.status.success(),
        "dedup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `dedup ARGS` (fed `stdin`) must fail, saying `says` on stderr.
pub fn refused_fed(args: &[&str], stdin: Option<&[u8]>, says: &str) {
    let out = dedup(args, stdin);
    assert!(!out.status.success(), "dedup {args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(says),
        "dedup {args:?} said {err:?}, not {says:?}"
    );
}

/// `dedup ARGS` must fail, saying `says` on stderr.
pub fn refused(args: &[&str], says: &str) {
    refused_fed(args, None, says)
}

pub fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).expect("JSON")
}
