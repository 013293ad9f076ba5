//! A server given a key (`dedup store serve --psk FILE`): only clients
//! that prove they hold the same key get anything, over TCP and Unix
//! sockets alike, and a client holding a key sends nothing to a server
//! that cannot prove it holds the same one (an impostor on the port).

use crate::rpc_support;
use rpc_support::Running;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dedup_common::testdata::noise;
use dedup_store::rpc::auth::Proved;
use dedup_store::rpc::protocol::{
    Call, ErrorKind, Reply, Request, Response, WireSegmenting, PROTOCOL_VERSION,
};
use dedup_store::rpc::{BackupOptions, Client, ClientError, Endpoint, Key, ServerLimits};
use dedup_store::Repository;

/// A new repository served at `at` (a TCP port 0 is resolved) with `key`.
fn serve(dir: &Path, at: Endpoint, key: Option<Key>) -> Running {
    serve_with(dir, at, key, ServerLimits::default())
}

fn serve_with(dir: &Path, at: Endpoint, key: Option<Key>, limits: ServerLimits) -> Running {
    let repo = Repository::init(dir.join("repo")).unwrap();
    Running::bound(repo, &at, limits, key)
}

fn tcp() -> Endpoint {
    Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
}

fn connect(at: &Endpoint, key: Option<&Key>) -> Result<Client, ClientError> {
    Client::connect_with_key(at, None, key)
}

/// Why connecting failed (it must).
fn refused(at: &Endpoint, key: Option<&Key>) -> ClientError {
    match connect(at, key) {
        Ok(_) => panic!("connected to {at} with key {key:?}"),
        Err(e) => e,
    }
}

fn backup(c: &Client, name: &str, bytes: &[u8]) {
    c.backup_stream(name, "g", bytes, None, &BackupOptions::default(), &|_| {})
        .unwrap();
}

/// A raw connection (TLS, as every TCP connection is: the plain end of
/// its pump) whose reads fail instead of hanging if the server neither
/// answers nor closes.
fn dial(addr: std::net::SocketAddr) -> UnixStream {
    dial_bound(addr).0
}

/// `dial`, with the TLS session's binding that key proofs cover.
fn dial_bound(addr: std::net::SocketAddr) -> (UnixStream, [u8; 32]) {
    let tcp = TcpStream::connect(addr).unwrap();
    let (s, binding) = dedup_store::rpc::tls::connect(tcp).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    (s, binding)
}

fn frame(id: u64, call: Call) -> Vec<u8> {
    let body = postcard::to_allocvec(&Request { id, call }).unwrap();
    [&(body.len() as u32).to_be_bytes()[..], &body].concat()
}

/// Read one answer from `s`; `None` if the connection closed.
fn answer(s: &mut UnixStream) -> Option<Response> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => panic!("no answer and not closed"),
        Err(_) => return None,
    }
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(postcard::from_bytes(&body).unwrap())
}

/// Send one raw request on `s` and read its answer; `None` if the
/// connection is closed (sending may then fail too).
fn raw_call(s: &mut UnixStream, id: u64, call: Call) -> Option<Response> {
    s.write_all(&frame(id, call)).ok()?;
    answer(s)
}

/// `call` on `s` is answered `Unauthorized`, and the connection closed.
fn refused_then_closed(s: &mut UnixStream, call: Call) {
    let r = raw_call(s, 7, call).expect("an answer");
    assert_eq!(r.reply.unwrap_err().kind, ErrorKind::Unauthorized);
    assert!(answer(s).is_none(), "closed after refusing");
}

/// Say `Hello` on `s`; the server's challenge.
fn challenge(s: &mut UnixStream) -> [u8; 32] {
    let hello = Call::Hello {
        protocol: PROTOCOL_VERSION,
    };
    match raw_call(s, 1, hello).expect("an answer").reply {
        Ok(Reply::Hello {
            challenge: Some(c), ..
        }) => c,
        other => panic!("no challenge: {other:?}"),
    }
}

#[test]
fn a_client_with_the_key_backs_up_and_restores_over_tcp_and_unix_sockets() {
    let key = Key::derive(b"the key");
    for at in [tcp(), Endpoint::Unix("s.sock".into())] {
        let dir = tempfile::tempdir().unwrap();
        let at = match at {
            Endpoint::Unix(p) => Endpoint::Unix(dir.path().join(p)),
            tcp => tcp,
        };
        let server = serve(dir.path(), at, Some(key.clone()));
        let c = connect(&server.at, Some(&key)).unwrap();
        let bytes = noise(1, 700_000);
        backup(&c, "b", &bytes);
        let mut out = Vec::new();
        c.restore("b", &mut out).unwrap();
        assert!(out == bytes);
        assert_eq!(c.list().unwrap().len(), 1);
    }
}

/// A server on TCP holding `the key`, whose repository holds backup
/// `kept`.
fn keyed_with_a_backup() -> (tempfile::TempDir, Key, Running) {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let server = serve(dir.path(), tcp(), Some(key.clone()));
    backup(
        &connect(&server.at, Some(&key)).unwrap(),
        "kept",
        &noise(2, 100_000),
    );
    (dir, key, server)
}

#[test]
fn no_key_or_another_key_gets_nothing_and_changes_nothing() {
    let (dir, key, server) = keyed_with_a_backup();

    let e = refused(&server.at, None);
    assert!(matches!(e, ClientError::Auth(_)), "{e}");
    assert!(e.to_string().contains("--psk"), "{e}");
    let e = refused(&server.at, Some(&Key::derive(b"the kez")));
    assert!(matches!(e, ClientError::Auth(_)), "{e}");
    assert!(e.to_string().contains("does not match"), "{e}");

    // A peer that skips the handshake: every call, a restore included, is
    // refused as unauthorized and the connection closed.
    let Endpoint::Tcp(addr) = server.at else {
        unreachable!()
    };
    for call in [
        Call::List,
        Call::Restore {
            name: "kept".into(),
        },
        Call::Delete {
            name: "kept".into(),
        },
        Call::BeginBackup {
            name: "x".into(),
            group: "g".into(),
        },
        Call::Gc {
            compact_below: None,
        },
    ] {
        refused_then_closed(&mut dial(addr), call);
    }

    // A wrong proof after a real challenge: refused, then closed.
    let (mut s, binding) = dial_bound(addr);
    let c = challenge(&mut s);
    let wrong = Key::derive(b"guess");
    let nonce = [9u8; 32];
    let proved = |challenge, binding| Proved {
        challenge,
        nonce: &nonce,
        binding,
    };
    let call = Call::Authenticate {
        nonce,
        proof: wrong.client_proof(&proved(&c, &binding)),
    };
    refused_then_closed(&mut s, call);

    // A proof made for one connection's challenge is worth nothing on
    // the next (its challenge is new).
    let (mut first, b1) = dial_bound(addr);
    let c1 = challenge(&mut first);
    let proof = key.client_proof(&proved(&c1, &b1));
    let mut second = dial(addr);
    let c2 = challenge(&mut second);
    assert_ne!(c1, c2, "challenges are fresh");
    let r = raw_call(&mut second, 2, Call::Authenticate { nonce, proof }).unwrap();
    assert_eq!(r.reply.unwrap_err().kind, ErrorKind::Unauthorized);
    // The first connection, answering its own challenge, gets in.
    let r = raw_call(&mut first, 2, Call::Authenticate { nonce, proof }).unwrap();
    let Ok(Reply::Authenticated { proof: theirs }) = r.reply else {
        panic!("authenticated");
    };
    assert!(key.is_server_proof(&proved(&c1, &b1), &theirs));
    let r = raw_call(&mut first, 3, Call::List).unwrap();
    assert!(matches!(r.reply, Ok(Reply::Backups(b)) if b.len() == 1));

    drop(server);
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    let names: Vec<_> = repo
        .list_backups()
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["kept"], "nothing but the keyed backup");
}

#[test]
fn calls_pipelined_behind_the_handshake_or_a_second_hello_or_a_large_frame_get_nothing() {
    let (dir, _key, server) = keyed_with_a_backup();
    let Endpoint::Tcp(addr) = server.at else {
        unreachable!()
    };
    let hello = || Call::Hello {
        protocol: PROTOCOL_VERSION,
    };
    let delete = || Call::Delete {
        name: "kept".into(),
    };

    // Hello, then a delete and a restore before any answer is read: the
    // hello is answered, the delete refused, and the connection closed.
    let mut s = dial(addr);
    let calls = [
        frame(1, hello()),
        frame(2, delete()),
        frame(
            3,
            Call::Restore {
                name: "kept".into(),
            },
        ),
    ];
    s.write_all(&calls.concat()).unwrap();
    assert!(matches!(
        answer(&mut s).unwrap().reply,
        Ok(Reply::Hello { .. })
    ));
    let r = answer(&mut s).unwrap();
    assert_eq!(
        (r.id, r.reply.unwrap_err().kind),
        (2, ErrorKind::Unauthorized)
    );
    assert!(answer(&mut s).is_none(), "closed");

    // A second Hello (a fresh challenge to guess against) is refused.
    let mut s = dial(addr);
    challenge(&mut s);
    refused_then_closed(&mut s, hello());

    // A frame larger than any handshake is refused before it is read.
    let mut s = dial(addr);
    s.write_all(&(1u32 << 20).to_be_bytes()).unwrap();
    let r = answer(&mut s).unwrap();
    assert_eq!(r.reply.unwrap_err().kind, ErrorKind::BadRequest);
    assert!(answer(&mut s).is_none(), "closed");

    drop(server);
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    assert_eq!(repo.list_backups().unwrap().len(), 1, "nothing was deleted");
}

#[test]
fn a_server_without_a_key_serves_keyless_clients_and_is_refused_by_keyed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), tcp(), None);
    backup(
        &connect(&server.at, None).unwrap(),
        "open",
        &noise(3, 50_000),
    );
    let e = refused(&server.at, Some(&Key::derive(b"k")));
    assert!(matches!(e, ClientError::Auth(_)), "{e}");
    assert!(e.to_string().contains("nothing was sent"), "{e}");
}

/// A process on the port that is not the server: it answers `Hello`
/// with `challenge`, and `Authenticate` with `proof`. Returns the port
/// and a thread that gives back every call it was sent.
fn impostor(challenge: Option<[u8; 32]>, proof: [u8; 32]) -> (Endpoint, JoinHandle<Vec<Call>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = Endpoint::Tcp(l.local_addr().unwrap());
    let t = std::thread::spawn(move || {
        let (tcp, _) = l.accept().unwrap();
        // It speaks TLS, as anything on a server's port must to be
        // mistaken for one.
        let config = dedup_store::rpc::tls::server_config().unwrap();
        let (mut s, _binding) = dedup_store::rpc::tls::accept(tcp, config).unwrap();
        let mut calls = Vec::new();
        loop {
            let mut len = [0u8; 4];
            if s.read_exact(&mut len).is_err() {
                return calls;
            }
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            s.read_exact(&mut body).unwrap();
            let req: Request = postcard::from_bytes(&body).unwrap();
            let reply = match &req.call {
                Call::Hello { .. } => Reply::Hello {
                    protocol: PROTOCOL_VERSION,
                    segmenting: WireSegmenting::Fixed { size: 4096 },
                    challenge,
                },
                Call::Authenticate { .. } => Reply::Authenticated { proof },
                _ => Reply::Deleted,
            };
            calls.push(req.call);
            let body = postcard::to_allocvec(&Response {
                id: req.id,
                reply: Ok(reply),
            })
            .unwrap();
            s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
            s.write_all(&body).unwrap();
        }
    });
    (at, t)
}

#[test]
fn a_client_with_a_key_sends_nothing_to_a_server_that_cannot_prove_it() {
    let key = Key::derive(b"the key");
    // One that asks for no key, and one that answers with a made-up proof.
    for (challenge, proof) in [(None, [0u8; 32]), (Some([5u8; 32]), [6u8; 32])] {
        let (at, t) = impostor(challenge, proof);
        let e = refused(&at, Some(&key));
        assert!(matches!(e, ClientError::Auth(_)), "{e}");
        assert!(e.to_string().contains("nothing was sent"), "{e}");
        let calls = t.join().unwrap();
        assert!(
            calls
                .iter()
                .all(|c| matches!(c, Call::Hello { .. } | Call::Authenticate { .. })),
            "only the handshake reached it: {calls:?}"
        );
    }
}

/// The handshake has a deadline as a whole, not only a limit on each
/// silence: a peer that trickles a frame a byte at a time, each byte well
/// within the limit, is cut off once the deadline passes (here the idle
/// timeout, 1 s, shorter than the usual 10 s), and a client holding the key
/// still gets in.
#[test]
fn a_handshake_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let limits = ServerLimits {
        idle_timeout: Some(std::time::Duration::from_secs(1)),
        ..ServerLimits::default()
    };
    let server = serve_with(dir.path(), tcp(), Some(key.clone()), limits);
    let Endpoint::Tcp(addr) = server.at else {
        unreachable!()
    };
    let mut s = dial(addr);
    let start = std::time::Instant::now();
    // A frame of 200 bytes (allowed before the handshake), then its body a
    // byte every 300 ms: it would take a minute to arrive.
    s.write_all(&200u32.to_be_bytes()).unwrap();
    let mut cut = None;
    for _ in 0..30 {
        if s.write_all(&[0]).is_err() {
            cut = Some(start.elapsed());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        // Closed: a read sees the end (or a reset) at once.
        s.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let closed = match s.read(&mut byte) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        s.set_nonblocking(false).unwrap();
        if closed {
            cut = Some(start.elapsed());
            break;
        }
    }
    let cut = cut.expect("the trickling peer was never cut off");
    assert!(
        cut < std::time::Duration::from_secs(3),
        "cut off after {cut:?}"
    );
    let c = connect(&server.at, Some(&key)).unwrap();
    assert!(c.list().unwrap().is_empty());
}

/// Peers without the key that hold every slot do not keep out a client
/// that has it: a new connection closes the oldest that has not proved
/// the key. Connections that proved it are never closed for room.
#[test]
fn peers_without_the_key_holding_every_slot_cannot_keep_a_client_with_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let key = Key::derive(b"the key");
    let limits = ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    };
    let server = serve_with(dir.path(), tcp(), Some(key.clone()), limits);
    let Endpoint::Tcp(addr) = server.at else {
        unreachable!("served on TCP")
    };
    // Two peers greeted (so the server has taken them) that go no further.
    let mut squatters: Vec<UnixStream> = (0..2).map(|_| dial(addr)).collect();
    for s in &mut squatters {
        challenge(s);
        // Well within the server's 10 s for a handshake: closed before
        // that is closed for room.
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    }
    let start = Instant::now();
    let first = connect(&server.at, Some(&key)).unwrap();
    backup(&first, "first", &noise(1, 100_000));
    // The oldest one was closed for it; the other still waits.
    assert!(closed(&mut squatters[0]), "the oldest is closed");
    squatters[1]
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(!closed(&mut squatters[1]), "the other still waits");
    squatters[1]
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let second = connect(&server.at, Some(&key)).unwrap();
    backup(&second, "second", &noise(2, 100_000));
    assert!(closed(&mut squatters[1]), "closed for the second");
    assert!(
        start.elapsed() < Duration::from_secs(9),
        "not by its deadline"
    );
    // Both slots hold clients that proved the key: nobody else gets in,
    // with the key or without.
    for k in [Some(&key), None] {
        let e = refused(&server.at, k);
        assert!(e.to_string().contains("too many connections"), "{e}");
    }
    assert_eq!(first.list().unwrap().len(), 2);
    assert_eq!(second.list().unwrap().len(), 2);
}

/// Whether the server closed `s` (end of stream) rather than leaving it
/// open with nothing to say (a read timeout).
fn closed(s: &mut UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => panic!("the server said something unasked"),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            false
        }
        Err(_) => true,
    }
}
