//! `dedup store serve` through the binary: four `dedup backup --server`
//! processes at once, `store remote`, restores beside the server, the
//! refusals a running server causes, and a clean stop on SIGTERM.

mod support;

use dedup_core::testdata::noise;
use support::{json, ok, refused_fed, spawn};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

fn refused(args: &[&str], says: &str) {
    refused_fed(args, Some(b""), says)
}

/// A server process, killed if the test fails before stopping it.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "no {path:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A new repository in a temporary directory, served on a socket there
/// (the server is up when this returns).
fn serve() -> (tempfile::TempDir, PathBuf, PathBuf, Serving) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let r = repo.to_str().unwrap();
    let sock = tmp.path().join("s.sock");
    // Fixed segments: the shared part alone cuts as it did inside each
    // stream (a FastCDC cut at its end would differ).
    ok(&["store", "init", r, "--segments", "fixed", "--json"], None);
    let serving = Serving(spawn(
        &["store", "serve", r, "--socket", sock.to_str().unwrap()],
        false,
    ));
    wait_for(&sock);
    (tmp, repo, sock, serving)
}

#[test]
fn serve_four_backup_processes_at_once_restore_and_stop_on_sigterm() {
    let (tmp, repo, sock, mut serving) = serve();
    let r = repo.to_str().unwrap();
    let server_arg = format!("unix:{}", sock.display());
    let s = server_arg.as_str();
    let server = &mut serving.0;

    let shared = noise(1, 2 << 20);
    let streams: Vec<Vec<u8>> = (0..4)
        .map(|i| [&shared[..], &noise(10 + i, 1 << 20)[..]].concat())
        .collect();
    let mut clients: Vec<Child> = (0..4)
        .map(|i| {
            spawn(
                &[
                    "backup",
                    "--server",
                    s,
                    &format!("b{i}"),
                    "--stdin",
                    "--json",
                ],
                true,
            )
        })
        .collect();
    for (c, stream) in clients.iter_mut().zip(&streams) {
        c.stdin.take().unwrap().write_all(stream).unwrap();
    }
    for (i, c) in clients.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j = json(&out.stdout);
        assert_eq!(j["name"], format!("b{i}"));
        assert_eq!(j["bytes_in"], streams[i].len() as u64);
        assert_eq!(j["server"], s);
    }
    let list = json(&ok(
        &["store", "remote", "--server", s, "list", "--json"],
        None,
    ));
    assert_eq!(list.as_array().unwrap().len(), 4);
    // Restores read the directory beside the server.
    for (i, stream) in streams.iter().enumerate() {
        assert!(
            ok(&["restore", r, &format!("b{i}"), "-"], None) == *stream,
            "b{i}"
        );
    }
    // And through the server, to stdout and to a file.
    assert!(
        ok(
            &["store", "remote", "--server", s, "restore", "b1", "-"],
            None
        ) == streams[1]
    );
    let t = tmp.path().join("b2.out");
    let t = t.to_str().unwrap();
    ok(
        &["store", "remote", "--server", s, "restore", "b2", t],
        None,
    );
    assert!(std::fs::read(t).unwrap() == streams[2]);
    refused(
        &["store", "remote", "--server", s, "restore", "b2", t],
        "already exists",
    );
    refused(
        &["store", "remote", "--server", s, "restore", "nosuch", "-"],
        "no backup named nosuch",
    );
    // --force replaces a file, whole or not at all: a backup the server
    // does not have leaves it as it was.
    let old = tmp.path().join("old.out");
    std::fs::write(&old, b"old contents").unwrap();
    let old_s = old.to_str().unwrap();
    refused(
        &[
            "store", "remote", "--server", s, "restore", "nosuch", old_s, "--force",
        ],
        "no backup named nosuch",
    );
    assert_eq!(std::fs::read(&old).unwrap(), b"old contents");
    ok(
        &[
            "store", "remote", "--server", s, "restore", "b3", old_s, "--force",
        ],
        None,
    );
    assert!(std::fs::read(&old).unwrap() == streams[3]);
    // A later backup of the shared part sends nothing new.
    let again = json(&ok(
        &["backup", "--server", s, "again", "--stdin", "--json"],
        Some(&shared),
    ));
    assert_eq!(again["bytes_new"], 0);
    let stats = json(&ok(
        &["store", "remote", "--server", s, "stats", "--json"],
        None,
    ));
    assert_eq!(stats["backups"], 5);
    ok(&["store", "remote", "--server", s, "delete", "again"], None);

    // No lock: a backup straight into the repository runs beside the
    // server, and the server's collection sees it.
    ok(&["backup", r, "local", "--stdin"], Some(&shared));
    let gc = json(&ok(
        &["store", "remote", "--server", s, "gc", "--json"],
        None,
    ));
    assert_eq!(gc["backups"], 5);
    refused(
        &["backup", "--server", s, "b0", "--stdin"],
        "backup b0 already exists",
    );
    refused(
        &["backup", "--server", s, "--stdin"],
        "required arguments were not provided",
    );
    refused(
        &["backup", "--server", "nope", "x", "--stdin"],
        "unix:PATH or tcp:HOST:PORT",
    );
    refused(
        &["store", "serve", r, "--listen", "127.0.0.1:0"],
        "--listen needs a key",
    );
    refused(
        &["store", "serve", r, "--listen", "0.0.0.0:0", "--no-auth"],
        "--allow-remote",
    );

    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "the socket is removed at exit");
    let mut err = String::new();
    std::io::Read::read_to_string(server.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("dedup: serving"), "{err}");
    assert!(err.contains("stopped"), "{err}");
    // The repository reopens to write.
    ok(&["backup", r, "after", "--stdin"], Some(b"after"));
}

#[test]
fn sigterm_mid_backup_aborts_it_the_client_fails_and_no_backup_is_left() {
    let (_tmp, repo, sock, mut serving) = serve();
    let r = repo.to_str().unwrap();
    let server_arg = format!("unix:{}", sock.display());
    let s = server_arg.as_str();
    let server = &mut serving.0;
    let mut client = spawn(
        &["backup", "--server", s, "slow", "--stdin", "--json"],
        true,
    );
    let mut input = client.stdin.take().unwrap();
    // Feed it slowly, until it stops taking input.
    let feeder = std::thread::spawn(move || {
        for i in 0..600 {
            if input.write_all(&noise(i, 256 << 10)).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let start = Instant::now();
    loop {
        let stats = json(&ok(
            &["store", "remote", "--server", s, "stats", "--json"],
            None,
        ));
        if stats["running_backups"] == 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    assert!(server.wait().unwrap().success());
    let out = client.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connection to the server was lost"), "{err}");
    feeder.join().unwrap();
    let list = json(&ok(&["list", r, "--json"], None));
    assert_eq!(list.as_array().unwrap().len(), 0, "{list}");
    ok(&["backup", r, "slow", "--stdin"], Some(b"the name is free"));
}

#[test]
fn tcp_needs_a_key_and_only_clients_holding_it_get_in() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let (repo, key, other, not_key) = (p("repo"), p("k.psk"), p("other.psk"), p("not.psk"));
    let r = repo.as_str();
    ok(&["store", "init", r, "--json"], None);
    ok(&["tls-psk", &key], None);
    ok(&["tls-psk", &other], None);
    std::fs::write(&not_key, "just some words\n").unwrap();
    refused(
        &["store", "serve", r, "--listen", "127.0.0.1:0"],
        "--listen needs a key",
    );
    refused(
        &[
            "store",
            "serve",
            r,
            "--listen",
            "127.0.0.1:0",
            "--psk",
            &not_key,
        ],
        "is not a PSK file",
    );

    let mut serving = Serving(spawn(
        &[
            "store",
            "serve",
            r,
            "--listen",
            "127.0.0.1:0",
            "--psk",
            &key,
        ],
        false,
    ));
    let (at, line) = serving_at(&mut serving);
    assert!(line.contains("to clients holding the key"), "{line}");
    let at = at.as_str();

    let data = noise(5, 300_000);
    // Refused backups stop before reading stdin; the support code lets the
    // closed pipe pass when they exit before the feed is written.
    let j = json(&ok(
        &[
            "backup", "--server", at, "--psk", &key, "k1", "--stdin", "--json",
        ],
        Some(&data),
    ));
    assert_eq!(j["bytes_in"], data.len() as u64);
    refused_fed(
        &["backup", "--server", at, "k2", "--stdin"],
        Some(b"refused before it reads"),
        "is TCP: give --psk FILE",
    );
    refused_fed(
        &["backup", "--server", at, "--no-auth", "k2", "--stdin"],
        Some(b"refused before it reads"),
        "asks for its key",
    );
    refused_fed(
        &["backup", "--server", at, "--psk", &other, "k3", "--stdin"],
        Some(b"refused before it reads"),
        "does not match",
    );
    refused(&["store", "remote", "--server", at, "list"], "--psk FILE");
    let list = json(&ok(
        &[
            "store", "remote", "--server", at, "--psk", &key, "list", "--json",
        ],
        None,
    ));
    let names: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].clone())
        .collect();
    assert_eq!(names, ["k1"], "only the keyed backup went in");
    let out = p("k1.out");
    ok(
        &[
            "store", "remote", "--server", at, "--psk", &key, "restore", "k1", &out,
        ],
        None,
    );
    assert!(std::fs::read(&out).unwrap() == data);

    unsafe { libc::kill(serving.0.id() as libc::pid_t, libc::SIGTERM) };
    assert!(serving.0.wait().unwrap().success());

    // Served with --no-auth, a client must say --no-auth too; one with a
    // key refuses it (it cannot prove it holds the key).
    let mut serving = Serving(spawn(
        &["store", "serve", r, "--listen", "127.0.0.1:0", "--no-auth"],
        false,
    ));
    let (at, _) = serving_at(&mut serving);
    ok(
        &["backup", "--server", &at, "--no-auth", "open", "--stdin"],
        Some(&data),
    );
    refused(
        &["store", "remote", "--server", &at, "--psk", &key, "list"],
        "asks for no key",
    );
    unsafe { libc::kill(serving.0.id() as libc::pid_t, libc::SIGTERM) };
    assert!(serving.0.wait().unwrap().success());
}

/// The address a server on TCP took, and its "dedup: serving ... on
/// tcp:ADDR ..." line.
fn serving_at(serving: &mut Serving) -> (String, String) {
    let mut err = std::io::BufReader::new(serving.0.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("dedup: serving") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(n > 0, "the server exited before serving");
    }
    // The rest is drained: a server whose stderr is closed would fail
    // writing its next line.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let at = line
        .split(" on ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert!(at.starts_with("tcp:127.0.0.1:"), "{line}");
    (at.to_string(), line)
}
