//! `dedup store serve` over TCP is TLS 1.3 with the key proofs bound to
//! the session: a relay in the middle sees no byte of a backup in the
//! clear; one that alters a byte breaks the connection and stores
//! nothing; one that terminates TLS itself on both sides (two sessions)
//! cannot pass the key proofs on, so the client refuses the server and
//! the server the client. An encrypted repository is served over TCP.

use crate::rpc_support;
use rpc_support::Running;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::crypto::KdfParams;
use dedup_store::rpc::tls;
use dedup_store::rpc::{BackupOptions, Client, ClientError, Endpoint, Key, ServerLimits};
use dedup_store::{RepoOptions, Repository};

fn serve(repo: Repository, key: Option<Key>) -> Running {
    let at = Endpoint::Tcp("127.0.0.1:0".parse().unwrap());
    Running::bound(repo, &at, ServerLimits::default(), key)
}

/// Bytes to find: a line a backup holds many times.
const MARK: &[u8] = b"the payroll of the quarter, alice 123456.78;";

fn content() -> Vec<u8> {
    MARK.repeat(20_000)
}

/// A relay between a client and `to`: every byte each way is recorded,
/// and the server-bound byte at `flip` (if any) is flipped.
fn relay(to: std::net::SocketAddr, flip: Option<usize>) -> (Endpoint, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = Endpoint::Tcp(l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for client in l.incoming() {
            let client = client.unwrap();
            let server = TcpStream::connect(to).unwrap();
            let copy = |mut from: TcpStream, mut to: TcpStream, flip: Option<usize>| {
                let record = record.clone();
                std::thread::spawn(move || {
                    let (mut buf, mut at) = (vec![0u8; 1 << 16], 0usize);
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        if let Some(f) = flip.filter(|f| (at..at + n).contains(f)) {
                            buf[f - at] ^= 0x40;
                        }
                        at += n;
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                })
            };
            copy(
                client.try_clone().unwrap(),
                server.try_clone().unwrap(),
                flip,
            );
            copy(server, client, None);
        }
    });
    (at, seen)
}

fn backup(c: &Client, name: &str) -> Result<(), ClientError> {
    let opts = BackupOptions::default();
    c.backup_stream(name, "g", &content()[..], None, &opts, &|_| {})
        .map(|_| ())
}

fn addr(at: &Endpoint) -> std::net::SocketAddr {
    let Endpoint::Tcp(a) = at else { unreachable!() };
    *a
}

fn repo(dir: &Path) -> Repository {
    Repository::init(dir.join("repo")).unwrap()
}

#[test]
fn a_relay_in_the_middle_sees_no_byte_of_a_backup_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let server = serve(repo(dir.path()), Some(key.clone()));
    let (at, seen) = relay(addr(&server.at), None);
    let c = Client::connect_with_key(&at, None, Some(&key)).unwrap();
    backup(&c, "through").unwrap();
    let mut out = Vec::new();
    c.restore("through", &mut out).unwrap();
    assert!(out == content());
    drop(c);
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 10_000, "{} bytes relayed", seen.len());
    assert!(
        !seen.windows(16).any(|w| w == &MARK[..16]),
        "a backup's bytes in the clear"
    );
    assert!(
        !seen.windows(7).any(|w| w == b"through"),
        "a backup's name in the clear"
    );
}

#[test]
fn a_byte_altered_in_the_middle_breaks_the_connection_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let server = serve(repo(dir.path()), Some(key.clone()));
    // Past the handshake: somewhere in the backup's records.
    let (at, _) = relay(addr(&server.at), Some(200_000));
    let c = Client::connect_with_key(&at, None, Some(&key)).unwrap();
    // Bytes that do not repeat, so that all of them cross.
    let bytes = dedup_common::testdata::noise(7, 1 << 20);
    let opts = BackupOptions::default();
    let sent = c.backup_stream("altered", "g", &bytes[..], None, &opts, &|_| {});
    assert!(sent.is_err(), "an altered record was taken");
    drop(c);
    // The server lives, and holds no such backup.
    let c = Client::connect_with_key(&server.at, None, Some(&key)).unwrap();
    assert!(c.list().unwrap().iter().all(|b| b.name != "altered"));
    backup(&c, "direct").unwrap();
}

/// A man in the middle that terminates TLS on both sides and relays the
/// plain bytes: two sessions, two exporters.
fn terminating_middle(to: std::net::SocketAddr) -> Endpoint {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = Endpoint::Tcp(l.local_addr().unwrap());
    std::thread::spawn(move || {
        for client in l.incoming() {
            let config = tls::server_config().unwrap();
            let Ok((from_client, _)) = tls::accept(client.unwrap(), config) else {
                continue;
            };
            let (to_server, _) = tls::connect(TcpStream::connect(to).unwrap()).unwrap();
            for (mut a, mut b) in [
                (
                    from_client.try_clone().unwrap(),
                    to_server.try_clone().unwrap(),
                ),
                (to_server, from_client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut a, &mut b);
                    let _ = b.shutdown(Shutdown::Write);
                });
            }
        }
    });
    at
}

#[test]
fn a_middle_that_terminates_tls_cannot_pass_the_key_proofs_on() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let server = serve(repo(dir.path()), Some(key.clone()));
    let at = terminating_middle(addr(&server.at));
    let e = Client::connect_with_key(&at, None, Some(&key))
        .err()
        .expect("refused");
    assert!(matches!(e, ClientError::Auth(_)), "{e}");
    let c = Client::connect_with_key(&server.at, None, Some(&key)).unwrap();
    assert!(
        c.list().unwrap().is_empty(),
        "nothing was sent through the middle"
    );
}

#[test]
fn an_encrypted_repository_is_served_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let _p = for_this_thread(b"served");
    let options = RepoOptions {
        encryption: Some(KdfParams::FOR_TESTS),
        ..RepoOptions::default()
    };
    drop(Repository::init_with(dir.path().join("repo"), options).unwrap());
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    repo.backup_stream("direct", "g", &content()[..]).unwrap();
    let key = Key::derive(b"the key");
    let server = serve(repo, Some(key.clone()));
    let c = Client::connect_with_key(&server.at, None, Some(&key)).unwrap();
    let opts = BackupOptions::default();
    let b = c
        .backup_stream("tcp", "g", &content()[..], None, &opts, &|_| {})
        .unwrap();
    assert_eq!(
        b.report.segments_new, 0,
        "keyed fingerprints over TCP: {b:?}"
    );
    let mut out = Vec::new();
    c.restore("tcp", &mut out).unwrap();
    assert!(out == content());
}
