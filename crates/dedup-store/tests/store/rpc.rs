//! `dedup store serve`'s server and client in one process: a server on a
//! temporary socket, many concurrent clients backing up streams that share
//! content, every backup restored byte for byte; disconnects, shutdown, a
//! second writer, garbage from the network and lying clients.

use crate::rpc_support;
use crate::tree_support;

use dedup_common::testdata::noise;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use dedup_store::rpc::protocol::{Call, ErrorKind, Item, Reply, Request, Response, MAX_BATCH};
use dedup_store::rpc::{BackupOptions, Client, Endpoint, Server, ServerLimits};
use dedup_store::writer::HASH;
use dedup_store::{Repository, RestoreOptions, TreeWalk};
use proptest::prelude::*;
use rpc_support::{begin, copies, restored, setup, setup_with, Running};

fn backup(c: &Client, name: &str, bytes: &[u8]) -> dedup_store::rpc::protocol::WireBackup {
    c.backup_stream(name, "g", bytes, None, &BackupOptions::default(), &|_| {})
        .unwrap()
}

#[test]
fn eight_concurrent_clients_with_shared_content_all_commit_and_restore_byte_exact() {
    let (dir, server) = setup();
    let shared = noise(1, 3 << 20);
    let streams: Vec<Vec<u8>> = (0..8u64)
        .map(|i| {
            let mut s = shared[..(1 << 20) + 4096 * i as usize].to_vec();
            s.extend(noise(100 + i, 1 << 20));
            s.extend(&shared[1 << 20..]);
            s.extend(&noise(200 + i, 777)); // a short last segment
            s
        })
        .collect();
    std::thread::scope(|s| {
        for (i, stream) in streams.iter().enumerate() {
            let server = &server;
            s.spawn(move || {
                let c = server.client();
                let b = backup(&c, &format!("s{i}"), stream);
                assert_eq!(b.report.bytes_in, stream.len() as u64);
            });
        }
    });
    for (i, stream) in streams.iter().enumerate() {
        assert!(restored(dir.path(), &format!("s{i}")) == *stream, "s{i}");
    }
    let stats = server.client().stats().unwrap();
    assert_eq!(stats.backups, 8);
    // Streams running together store their shared content each (the index
    // learns a container only once it is sealed); streams after them
    // find it: a second round stores only its unique megabyte each.
    let round2: Vec<Vec<u8>> = (0..8u64)
        .map(|i| [&shared[..], &noise(300 + i, 1 << 20)[..]].concat())
        .collect();
    let reports: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = round2
            .iter()
            .enumerate()
            .map(|(i, stream)| {
                let server = &server;
                s.spawn(move || backup(&server.client(), &format!("r{i}"), stream))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (r, stream)) in reports.iter().zip(&round2).enumerate() {
        assert_eq!(r.report.bytes_new, 1 << 20, "r{i}: {:?}", r.report);
        assert!(restored(dir.path(), &format!("r{i}")) == *stream, "r{i}");
    }
    // A second backup of a stream sends nothing new.
    let again = backup(&server.client(), "again", &streams[3]);
    assert_eq!(again.report.bytes_new, 0);
    assert!(restored(dir.path(), "again") == streams[3]);
    server.shut();
}

#[test]
fn a_client_that_disconnects_mid_backup_leaves_no_backup_and_the_server_keeps_serving() {
    let (dir, server) = setup();
    let bytes = noise(7, 64 << 10);
    {
        let c = server.client();
        let session = begin(&c, "cut");
        let items = vec![Item::New {
            fingerprint: HASH.fingerprint(&bytes).0,
            data: bytes.clone(),
        }];
        c.call(Call::Append { session, items }).unwrap();
        // Dropped here: the connection closes without a commit.
    }
    let c = server.client();
    assert!(c.list().unwrap().is_empty());
    backup(&c, "cut", &bytes);
    assert!(restored(dir.path(), "cut") == bytes);
    server.shut();
}

#[test]
fn a_writer_works_beside_the_server_and_the_socket_is_private() {
    let (dir, server) = setup();
    let other = Repository::open(dir.path().join("repo")).unwrap();
    other
        .backup_stream("beside", "g", &noise(3, 50_000)[..])
        .unwrap();
    drop(other);
    assert!(server
        .client()
        .list()
        .unwrap()
        .iter()
        .any(|b| b.name == "beside"));
    let sock = dir.path().join("s.sock");
    assert!(sock.exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    server.shut();
    assert!(!sock.exists(), "the socket is removed at exit");
    Repository::open(dir.path().join("repo")).unwrap();
}

#[test]
fn stopping_the_server_aborts_running_backups_which_leave_nothing() {
    let (dir, server) = setup();
    let c = server.client();
    let session = begin(&c, "running");
    let bytes = noise(9, 4096);
    let items = vec![Item::New {
        fingerprint: HASH.fingerprint(&bytes).0,
        data: bytes,
    }];
    c.call(Call::Append { session, items }).unwrap();
    server.shut();
    let e = c.call(Call::Commit {
        session,
        tree: None,
    });
    assert!(e.is_err(), "{e:?}");
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    assert!(repo.list_backups().unwrap().is_empty());
}

#[test]
fn unknown_sessions_oversized_batches_and_gc_get_errors_on_a_live_connection() {
    let (_dir, server) = setup();
    let c = server.client();
    let e = c.call(Call::Lookup {
        session: 999,
        fingerprints: vec![[0; 32]],
    });
    assert_eq!(e.unwrap_err().kind(), Some(ErrorKind::NoSuchSession));
    let e = c.call(Call::Commit {
        session: 999,
        tree: None,
    });
    assert_eq!(e.unwrap_err().kind(), Some(ErrorKind::NoSuchSession));
    let session = begin(&c, "b");
    let e = c.call(Call::Lookup {
        session,
        fingerprints: vec![[0; 32]; MAX_BATCH + 1],
    });
    assert_eq!(e.unwrap_err().kind(), Some(ErrorKind::BadRequest));
    let e = c.call(Call::Append {
        session,
        items: vec![Item::Known {
            fingerprint: [7; 32],
        }],
    });
    let e = e.unwrap_err();
    assert!(e.to_string().contains("send its bytes"), "{e}");
    let e = c.gc(Some(2.0)).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::BadRequest));
    let e = c
        .call(Call::BeginBackup {
            name: "../x".into(),
            group: "g".into(),
        })
        .unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::Repository));
    // The connection still serves.
    backup(&c, "fine", &noise(3, 10_000));
    c.delete("fine").unwrap();
    assert!(c.list().unwrap().is_empty());
    server.shut();
}

/// Send raw bytes; the response frames the server sent before it closed.
fn raw(sock: &Path, bytes: &[u8]) -> Vec<Response> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let mut out = Vec::new();
    let mut rest = &got[..];
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let body = &rest[4..4 + len];
        out.push(postcard::from_bytes(body).expect("the server's frames decode"));
        rest = &rest[4 + len..];
    }
    out
}

fn frame(req: &Request) -> Vec<u8> {
    let body = postcard::to_allocvec(req).unwrap();
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend(body);
    f
}

#[test]
fn garbage_and_oversized_frames_are_answered_with_errors_and_the_server_lives() {
    let (dir, server) = setup();
    let sock = dir.path().join("s.sock");
    let oversized = raw(&sock, &u32::MAX.to_be_bytes());
    assert_eq!(oversized.len(), 1);
    let e = oversized[0].reply.clone().unwrap_err();
    assert_eq!((oversized[0].id, e.kind), (0, ErrorKind::BadRequest));
    assert!(e.message.contains("over the limit"), "{}", e.message);
    let garbage = raw(&sock, &[0, 0, 0, 3, 0xff, 0xff, 0xff]);
    assert_eq!(
        garbage[0].reply.clone().unwrap_err().kind,
        ErrorKind::BadRequest
    );
    // A good request, then garbage: the first is answered, then the error.
    let mut bytes = frame(&Request {
        id: 5,
        call: Call::List,
    });
    bytes.extend([0, 0, 0, 1, 0xee]);
    let both = raw(&sock, &bytes);
    assert_eq!(both.len(), 2);
    assert_eq!(both[0].id, 5);
    assert!(matches!(both[0].reply, Ok(Reply::Backups(_))));
    backup(&server.client(), "after", &noise(4, 50_000));
    server.shut();
}

#[test]
fn random_bytes_from_the_network_never_kill_the_server() {
    let (dir, server) = setup();
    let sock = dir.path().join("s.sock");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    // Random bytes, sometimes behind a plausible small length prefix.
    let input = (any::<bool>(), prop::collection::vec(any::<u8>(), 0..2048));
    runner
        .run(&input, |(prefixed, body)| {
            let mut bytes = Vec::new();
            if prefixed {
                bytes.extend((body.len() as u32).to_be_bytes());
            }
            bytes.extend(&body);
            for r in raw(&sock, &bytes) {
                // Whatever the bytes said, nothing was backed up from them.
                prop_assert!(!matches!(r.reply, Ok(Reply::Committed(_))));
            }
            Ok(())
        })
        .unwrap();
    let bytes = noise(5, 200_000);
    backup(&server.client(), "still", &bytes);
    assert!(restored(dir.path(), "still") == bytes);
    server.shut();
}

#[test]
fn a_fingerprint_that_does_not_match_its_bytes_cannot_store_wrong_data() {
    let (dir, server) = setup();
    let c = server.client();
    let (x, y) = (noise(10, 8192), noise(11, 8192));
    let session = begin(&c, "liar");
    let e = c
        .call(Call::Append {
            session,
            items: vec![Item::New {
                fingerprint: HASH.fingerprint(&x).0,
                data: y.clone(),
            }],
        })
        .unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::BadRequest));
    assert!(e.to_string().contains("backup aborted"), "{e}");
    // The lying session is gone.
    let e = c.call(Call::Commit {
        session,
        tree: None,
    });
    assert_eq!(e.unwrap_err().kind(), Some(ErrorKind::NoSuchSession));
    // X is not known under its fingerprint, and backs up as itself.
    let session = begin(&c, "probe");
    let found = c
        .call(Call::Lookup {
            session,
            fingerprints: vec![HASH.fingerprint(&x).0],
        })
        .unwrap();
    assert_eq!(found, Reply::Found(vec![false]));
    c.call(Call::Abort { session }).unwrap();
    let honest = [x.clone(), y.clone()].concat();
    backup(&c, "honest", &honest);
    assert!(restored(dir.path(), "honest") == honest);
    assert!(c.list().unwrap().iter().all(|b| b.name == "honest"));
    server.shut();
}

/// The server hashes an append's segments all at once: each fingerprint
/// must still go to its own segment, whatever kinds of items lie between
/// (short and long segments, repeats sent as fingerprints), and a false
/// claim late in the append is caught there.
#[test]
fn an_appends_segments_are_each_checked_against_their_own_bytes() {
    let (dir, server) = setup();
    let c = server.client();
    let segs: Vec<Vec<u8>> = [100, 8192, 5000, 1024, 31_000, 1]
        .iter()
        .enumerate()
        .map(|(i, &n)| noise(40 + i as u64, n))
        .collect();
    let fp = |b: &[u8]| HASH.fingerprint(b).0;
    let items = |lie_at: Option<usize>| -> Vec<Item> {
        let mut items = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            items.push(match (i % 2, lie_at == Some(i)) {
                (_, true) => Item::New {
                    fingerprint: fp(&segs[0]),
                    data: s.clone(),
                },
                (0, false) => Item::Unhashed { data: s.clone() },
                _ => Item::New {
                    fingerprint: fp(s),
                    data: s.clone(),
                },
            });
            if i >= 1 {
                items.push(Item::Known {
                    fingerprint: fp(&segs[i - 1]),
                });
            }
        }
        items
    };
    let session = begin(&c, "liar");
    let e = c
        .call(Call::Append {
            session,
            items: items(Some(5)),
        })
        .unwrap_err();
    assert!(e.to_string().contains("segment 9 of the append"), "{e}");
    let session = begin(&c, "mixed");
    c.call(Call::Append {
        session,
        items: items(None),
    })
    .unwrap();
    c.call(Call::Commit {
        session,
        tree: None,
    })
    .unwrap();
    let mut want = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        want.extend_from_slice(s);
        if i >= 1 {
            want.extend_from_slice(&segs[i - 1]);
        }
    }
    assert!(restored(dir.path(), "mixed") == want);
    server.shut();
}

/// A client looks a segment up, then sends its bytes a few batches
/// later: a concurrent backup that stored the same segment in between
/// is reused, not stored a second time.
#[test]
fn a_segment_another_backup_stored_since_the_lookup_is_not_stored_again() {
    let (dir, server) = setup();
    let (a, b) = (server.client(), server.client());
    let x = noise(12, 8192);
    let fp = HASH.fingerprint(&x).0;
    let (sa, sb) = (begin(&a, "a"), begin(&b, "b"));
    let looked = a.call(Call::Lookup {
        session: sa,
        fingerprints: vec![fp],
    });
    assert_eq!(looked.unwrap(), Reply::Found(vec![false]));
    let append = |c: &Client, session| {
        let items = vec![Item::New {
            fingerprint: fp,
            data: x.clone(),
        }];
        c.call(Call::Append { session, items }).unwrap();
    };
    append(&b, sb);
    append(&a, sa);
    let commit = |c: &Client, session| match c.call(Call::Commit {
        session,
        tree: None,
    }) {
        Ok(Reply::Committed(w)) => w.report,
        other => panic!("{other:?}"),
    };
    // a commits first: it waits for b's container, still open, and
    // seals it.
    let (ra, rb) = (commit(&a, sa), commit(&b, sb));
    assert_eq!((ra.segments_new, ra.segments_duplicate), (0, 1));
    assert_eq!((rb.segments_new, rb.segments_duplicate), (1, 0));
    server.shut();
    assert!(restored(dir.path(), "a") == x && restored(dir.path(), "b") == x);
    assert_eq!(copies(dir.path(), fp), 1, "one copy of the segment");
}

#[test]
fn a_tree_travels_with_the_commit() {
    use dedup_store::tree::{Kind, Node, Tree};
    let (dir, server) = setup();
    let c = server.client();
    let mut file = Node::new("f", Kind::File);
    file.size = 5000;
    let tree = Tree {
        stream_len: 5000,
        nodes: vec![file],
    };
    // A tree that would not restore is refused, and nothing is committed.
    let refused = c.backup_stream(
        "t",
        "g",
        &noise(12, 5000)[..],
        Some(b"tree bytes".to_vec()),
        &BackupOptions::default(),
        &|_| {},
    );
    assert!(refused.is_err());
    let b = c
        .backup_stream(
            "t",
            "g",
            &noise(12, 5000)[..],
            Some(tree.encode()),
            &BackupOptions::default(),
            &|_| {},
        )
        .unwrap();
    assert!(b.has_tree);
    let repo = Repository::open_read_only(dir.path().join("repo")).unwrap();
    assert!(repo.backup("t").unwrap().tree.is_some());
    server.shut();
}

#[test]
fn restores_stream_back_through_the_server_in_chunks() {
    let (_dir, server) = setup();
    let c = server.client();
    let bytes = noise(13, (5 << 20) + 123);
    backup(&c, "big", &bytes);
    let mut out = Vec::new();
    assert_eq!(
        c.restore("big", &mut out).unwrap().bytes,
        bytes.len() as u64
    );
    assert!(out == bytes);
    let e = c.restore("nosuch", &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("no backup named nosuch"), "{e}");
    // The connection serves on after a failed restore.
    assert_eq!(c.list().unwrap().len(), 1);
    server.shut();
}

#[test]
fn a_loopback_tcp_server_serves_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path().join("repo")).unwrap();
    let at = Endpoint::Tcp("127.0.0.1:0".parse().unwrap());
    let server = Server::bind(repo, &at, ServerLimits::default()).unwrap();
    let (at, stop) = (server.endpoint().clone(), server.stop_handle());
    let t = std::thread::spawn(move || server.run());
    let c = Client::connect(&at).unwrap();
    let bytes = noise(14, 300_000);
    backup(&c, "tcp", &bytes);
    let mut out = Vec::new();
    c.restore("tcp", &mut out).unwrap();
    assert!(out == bytes);
    stop.stop();
    t.join().unwrap().unwrap();
    assert!(Client::connect(&at).is_err(), "nothing listens after stop");
}

#[test]
fn connections_past_the_limit_are_refused_as_busy() {
    let (_dir, server) = setup_with(ServerLimits {
        max_connections: 2,
        max_sessions_per_connection: 1,
        ..ServerLimits::default()
    });
    let at = server.at.clone();
    let (a, _b) = (Client::connect(&at).unwrap(), Client::connect(&at).unwrap());
    let e = Client::connect(&at).err().unwrap();
    assert!(e.to_string().contains("too many connections"), "{e}");
    let begin = |name: &str| Call::BeginBackup {
        name: name.into(),
        group: "g".into(),
    };
    a.call(begin("one")).unwrap();
    let e = a.call(begin("two")).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::Busy));
    server.shut();
}

/// A client that begins a backup and then sends nothing is cut off after
/// the idle timeout: its backup is aborted (nothing committed) and its
/// slot is free for another client.
#[test]
fn an_idle_connection_is_closed_and_its_backup_aborted() {
    let (_dir, server) = setup_with(ServerLimits {
        max_connections: 1,
        idle_timeout: Some(Duration::from_secs(1)),
        ..ServerLimits::default()
    });
    let at = server.at.clone();
    let idle = Client::connect(&at).unwrap();
    begin(&idle, "stalled");
    std::thread::sleep(Duration::from_secs(3));
    // The idle client's connection is gone, and with it its backup.
    assert!(
        idle.call(Call::List).is_err(),
        "the idle connection was closed"
    );
    // Its one slot is free once its thread has ended (on a loaded
    // machine, a little after).
    let other = (0..100)
        .find_map(|_| {
            Client::connect(&at)
                .map_err(|_| std::thread::sleep(Duration::from_millis(50)))
                .ok()
        })
        .expect("the idle client's slot is freed");
    let stats = other.stats().unwrap();
    assert_eq!(stats.running_backups, 0);
    assert!(other.list().unwrap().is_empty(), "nothing was committed");
    drop(other);
    server.shut();
}

/// A peer that stops part-way through a frame is idle too: its frames
/// are read ahead on a thread whose reads wait as long as the peer takes,
/// and the connection times it out all the same and frees its slot.
#[test]
fn a_peer_that_stops_inside_a_frame_is_cut_off_as_idle() {
    let (_dir, server) = setup_with(ServerLimits {
        max_connections: 1,
        idle_timeout: Some(Duration::from_secs(1)),
        ..ServerLimits::default()
    });
    let Endpoint::Unix(path) = server.at.clone() else {
        unreachable!()
    };
    let mut raw = UnixStream::connect(&path).unwrap();
    raw.write_all(&100u32.to_be_bytes()).unwrap();
    raw.write_all(&[0u8; 10]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(9),
        "closed after {took:?}"
    );
    let other = (0..100)
        .find_map(|_| {
            Client::connect(&server.at)
                .map_err(|_| std::thread::sleep(Duration::from_millis(50)))
                .ok()
        })
        .expect("the stalled peer's slot is freed");
    assert!(other.list().unwrap().is_empty());
    drop(other);
    server.shut();
}

/// A writer that takes `pause` over each of its first `slow` writes.
struct Sluggish {
    out: Vec<u8>,
    pause: Duration,
    slow: usize,
}

impl Write for Sluggish {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.slow > 0 {
            self.slow -= 1;
            std::thread::sleep(self.pause);
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_client_waiting_on_an_answer_longer_than_the_idle_timeout_is_not_idle() {
    // The server reads the next request while it answers one; a client
    // that sends nothing because the server is still answering (here a
    // restore that waits on a slow client for seconds) must not be cut
    // off as idle.
    let (_dir, server) = setup_with(ServerLimits {
        idle_timeout: Some(Duration::from_secs(1)),
        ..ServerLimits::default()
    });
    let c = server.client();
    let bytes = noise(21, 24 << 20);
    backup(&c, "slow", &bytes);
    let mut out = Sluggish {
        out: Vec::new(),
        pause: Duration::from_millis(400),
        slow: 6,
    };
    let started = std::time::Instant::now();
    assert_eq!(
        c.restore("slow", &mut out).unwrap().bytes,
        bytes.len() as u64
    );
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "the answer took longer than the timeout"
    );
    assert!(out.out == bytes);
    // Silent only for a moment since the answer: still connected.
    assert_eq!(c.list().unwrap().len(), 1);
    // Then silent for longer than the timeout: closed.
    std::thread::sleep(Duration::from_secs(3));
    assert!(c.list().is_err(), "the idle connection was closed");
    server.shut();
}

#[test]
fn a_server_whose_socket_file_was_removed_still_stops() {
    let (dir, server) = setup();
    std::fs::remove_file(dir.path().join("s.sock")).unwrap();
    server.shut();
    Repository::open(dir.path().join("repo")).unwrap();
}

/// A reader that gives a little, then blocks until told to end.
struct Slow(std::sync::mpsc::Receiver<()>, u64);

impl Read for Slow {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.1 >= 8 << 20 {
            let _ = self.0.recv_timeout(Duration::from_millis(20));
        }
        let n = buf.len().min(64 << 10);
        buf[..n].fill(self.1 as u8);
        self.1 += n as u64;
        Ok(n)
    }
}

#[test]
fn a_backup_whose_server_stops_fails_promptly_and_leaves_nothing() {
    let (dir, server) = setup();
    let c = server.client();
    let (_tx, rx) = std::sync::mpsc::channel();
    let stop = server.stop.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        stop.stop();
    });
    let start = std::time::Instant::now();
    let e = c
        .backup_stream(
            "slow",
            "g",
            Slow(rx, 0),
            None,
            &BackupOptions::default(),
            &|_| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("connection"), "{e}");
    // It does not wait for the slow reader to fill batches nobody takes.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    stopper.join().unwrap();
    server.shut();
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    assert!(repo.list_backups().unwrap().is_empty());
}

#[test]
fn gc_through_the_server_runs_beside_a_backup_and_keeps_what_it_uses() {
    let (dir, server) = setup();
    let c = server.client();
    let (old, kept) = (noise(20, 3 << 20), noise(21, 1 << 20));
    backup(&c, "old", &old);
    backup(&c, "kept", &kept);
    c.delete("old").unwrap();
    // A backup running on another connection reuses part of the deleted
    // backup's data while the collection runs.
    let other = server.client();
    let session = begin(&other, "running");
    let reused = &old[..4096];
    let found = other
        .call(Call::Lookup {
            session,
            fingerprints: vec![HASH.fingerprint(reused).0],
        })
        .unwrap();
    assert_eq!(found, Reply::Found(vec![true]));
    let r = c.gc(None).unwrap();
    assert_eq!(r.backups, 1);
    assert!(r.containers_protected >= 1, "{r:?}");
    let items = vec![Item::Known {
        fingerprint: HASH.fingerprint(reused).0,
    }];
    other.call(Call::Append { session, items }).unwrap();
    other
        .call(Call::Commit {
            session,
            tree: None,
        })
        .unwrap();
    assert!(restored(dir.path(), "running") == reused);
    assert!(restored(dir.path(), "kept") == kept);
    server.shut();
}

/// Tree parts: refused for an unknown session, and with a tree in the
/// commit too; a tree past `MAX_TREE` aborts its backup.
#[test]
fn tree_parts_are_bounded_and_exclusive_with_a_commit_tree() {
    use dedup_store::rpc::protocol::MAX_TREE;
    let (_dir, server) = setup();
    let c = server.client();
    let part = |session: u64, bytes: Vec<u8>| c.call(Call::TreePart { session, bytes });
    let e = part(99, vec![1]).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::NoSuchSession));
    let s = begin(&c, "both");
    assert_eq!(part(s, vec![1, 2]).unwrap(), Reply::TreeTaken { bytes: 2 });
    let e = c
        .call(Call::Commit {
            session: s,
            tree: Some(vec![3]),
        })
        .unwrap_err();
    assert!(e.to_string().contains("one or the other"), "{e}");
    let s = begin(&c, "huge");
    let sixteen = vec![0u8; 16 << 20];
    for _ in 0..MAX_TREE / sixteen.len() {
        part(s, sixteen.clone()).unwrap();
    }
    let e = part(s, vec![0]).unwrap_err();
    assert!(e.to_string().contains("backup aborted"), "{e}");
    let e = part(s, vec![0]).unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::NoSuchSession), "{e}");
    assert!(c.list().unwrap().is_empty());
    drop(c);
    server.shut();
}

#[test]
fn a_directory_tree_backs_up_through_the_server_and_restores_with_its_metadata() {
    use tree_support::{assert_same, build, in_target, listing};
    let (tmp, server) = setup();
    let data = build(tmp.path());
    let before = listing(&data);
    // Past the walk's one-second window for just-changed files, so a later
    // backup may trust their size, times and inode.
    std::thread::sleep(Duration::from_millis(1100));
    let c = server.client();
    let backup_with = |name: &str, opts: &BackupOptions| {
        let walk = TreeWalk::new(&[&data]).unwrap();
        let b = c.backup_files(name, "g", walk, opts, &|_| {}).unwrap();
        (b.backup, b.counts, b.warnings)
    };
    let backup = |name: &str| backup_with(name, &BackupOptions::default());
    let (b, counts, warnings) = backup("files");
    assert!(b.has_tree && warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        (counts.files, counts.symlinks, counts.hard_links),
        (11, 3, 1)
    );
    // The copy of a 3 MiB file inside the tree is found, and a second
    // backup of the same tree (reading every file: no parent) sends no
    // new segment.
    assert!(b.report.bytes_new < b.report.bytes_in - (3 << 20) + (64 << 10));
    // Its tree goes ahead in parts of 64 bytes, as a tree larger than a
    // frame does (the restore below checks it arrived whole).
    let parts = BackupOptions {
        tree_part: 64,
        parent: false,
        ..BackupOptions::default()
    };
    let (again, ..) = backup_with("again", &parts);
    assert_eq!(
        (again.report.bytes_new, again.report.bytes_in),
        (0, b.report.bytes_in)
    );
    let tree_len = std::fs::read_dir(tmp.path().join("repo/trees"))
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.file_name().to_string_lossy().starts_with("again-"))
        .map(|e| e.metadata().unwrap().len())
        .unwrap();
    assert!(
        tree_len > 3 * 64,
        "a tree of {tree_len} bytes went in parts"
    );
    // A path that is not there fails the walk before anything starts.
    assert!(TreeWalk::new(&[tmp.path().join("nowhere")]).is_err());
    server.shut();
    assert_eq!(listing(&data), before, "the backup changed what it read");

    let repo = Repository::open(tmp.path().join("repo")).unwrap();
    for name in ["files", "again"] {
        let target = tmp.path().join(format!("restored-{name}"));
        repo.restore_tree(name, &target, &RestoreOptions::default())
            .unwrap();
        assert_same(&before, &listing(&in_target(&target, &data)));
    }
    // Files were cut one by one, as a backup made beside the repository
    // cuts them: a later one reuses every unchanged file without reading it.
    let local = repo.backup_paths("local", "g", &[&data], |_| {}).unwrap();
    assert!(local.parent.is_some(), "{local:?}");
    assert_eq!(
        local.files_unchanged,
        counts.files - 1,
        "all but the empty one"
    );
    assert_eq!(local.backup.bytes_new, 0);
}

/// A server that never answers past its `Hello` (when `hello` is set): a
/// process stopped or wedged with its socket open. It reads what it is
/// sent when `drain` is set, else nothing, so the client's writes block
/// once the socket's buffers are full. Its listener and the connection it
/// took live as long as the returned sender.
fn silent_server(sock: &Path, hello: bool, drain: bool) -> std::sync::mpsc::Sender<()> {
    use dedup_store::rpc::protocol::{WireSegmenting, PROTOCOL_VERSION};
    let listener = std::os::unix::net::UnixListener::bind(sock).unwrap();
    let (keep, until) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        if hello {
            let mut len = [0u8; 4];
            s.read_exact(&mut len).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            s.read_exact(&mut body).unwrap();
            let req: Request = postcard::from_bytes(&body).unwrap();
            let reply = Response {
                id: req.id,
                reply: Ok(Reply::Hello {
                    protocol: PROTOCOL_VERSION,
                    segmenting: WireSegmenting::Fixed { size: 4096 },
                    challenge: None,
                }),
            };
            let body = postcard::to_allocvec(&reply).unwrap();
            s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
            s.write_all(&body).unwrap();
        }
        // Take whatever comes (or nothing) and answer nothing, until the
        // test is done.
        if drain {
            std::thread::spawn(move || std::io::copy(&mut s, &mut std::io::sink()));
            let _ = until.recv();
        } else {
            let _ = until.recv();
            drop(s);
        }
    });
    keep
}

#[test]
fn a_server_that_never_answers_fails_the_client_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Some(Duration::from_millis(500));
    let silent = dir.path().join("silent.sock");
    let _keep = silent_server(&silent, false, true);
    let started = std::time::Instant::now();
    let e = Client::connect_with(&Endpoint::Unix(silent), timeout)
        .err()
        .expect("no Hello, no client");
    assert!(e.to_string().contains("sent no answer in 0.5 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // Past the Hello: a call gives up, and the connection is closed, so
    // what comes after it on the same client fails at once, naming why.
    let wedged = dir.path().join("wedged.sock");
    let _keep = silent_server(&wedged, true, true);
    let c = Client::connect_with(&Endpoint::Unix(wedged), timeout).unwrap();
    let e = c.list().unwrap_err();
    assert!(e.to_string().contains("sent no answer in 0.5 s"), "{e}");
    assert!(e.to_string().contains("may still finish there"), "{e}");
    let started = std::time::Instant::now();
    let e = c
        .backup_stream(
            "b",
            "g",
            &noise(3, 100_000)[..],
            None,
            &BackupOptions::default(),
            &|_| {},
        )
        .unwrap_err();
    assert!(e.to_string().contains("sent no answer in 0.5 s"), "{e}");
    let e = c.restore("b", &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("sent no answer in 0.5 s"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "later calls waited"
    );
}

/// A server that takes no more data: the client's write blocks once the
/// socket is full, and fails after the timeout instead of for ever.
#[test]
fn a_server_that_takes_nothing_fails_a_large_request_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.sock");
    let _keep = silent_server(&full, true, false);
    let c = Client::connect_with(&Endpoint::Unix(full), Some(Duration::from_millis(500))).unwrap();
    let started = std::time::Instant::now();
    let e = c
        .send(Call::TreePart {
            session: 1,
            bytes: vec![7; 8 << 20],
        })
        .err()
        .expect("8 MiB does not fit a socket nobody reads");
    assert!(e.to_string().contains("took no data in 0.5 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let e = c.list().unwrap_err();
    assert!(e.to_string().contains("took no data"), "{e}");
}

#[test]
fn a_restore_through_a_wedged_server_times_out_too() {
    let dir = tempfile::tempdir().unwrap();
    let wedged = dir.path().join("wedged.sock");
    let _keep = silent_server(&wedged, true, true);
    let c =
        Client::connect_with(&Endpoint::Unix(wedged), Some(Duration::from_millis(300))).unwrap();
    let started = std::time::Instant::now();
    let e = c.restore("b", &mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("sent no answer in 0.3 s"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// `None` and zero both mean no timeout: the client works as usual.
#[test]
fn without_a_timeout_a_client_works_as_usual() {
    let (_dir, server) = setup();
    let c = Client::connect_with(&server.at, None).unwrap();
    backup(&c, "b", &noise(4, 200_000));
    let c = Client::connect_with(&server.at, Some(Duration::ZERO)).unwrap();
    assert_eq!(c.list().unwrap().len(), 1);
    server.shut();
}

/// A client that sent a segment's bytes names later
/// repeats of it as `Known` (pipeline.rs, `sent`). If the server reused
/// the bytes from another backup's container instead of storing them in
/// this session, a sampled index may no longer find them once that
/// container has left the in-flight table, and the append fails.
#[test]
fn a_segment_sent_once_is_known_later_even_if_reused_from_another_backup() {
    use dedup_store::index::{IndexConfig, SamplingRate};
    let dir = tempfile::tempdir().unwrap();
    Repository::init(dir.path().join("repo")).unwrap();
    let config = IndexConfig {
        max_rate: SamplingRate::from_log2_period(16).unwrap(),
        ..IndexConfig::default()
    };
    let repo = Repository::open_sampled(dir.path().join("repo"), config).unwrap();
    let server = Running::serving(repo, dir.path(), ServerLimits::default());
    let (a, b) = (server.client(), server.client());
    let p = noise(30, 8192);
    let x = noise(31, 8192);
    let (fpp, fpx) = (HASH.fingerprint(&p), HASH.fingerprint(&x));
    assert!(!config.max_rate.samples(&fpx), "x is no hook");
    let (sa, sb) = (begin(&a, "a"), begin(&b, "b"));
    // a looks x up: not there yet.
    let looked = a.call(Call::Lookup {
        session: sa,
        fingerprints: vec![fpx.0],
    });
    assert_eq!(looked.unwrap(), Reply::Found(vec![false]));
    // b stores p (its container's pinned hook) and x.
    let items = vec![
        Item::New {
            fingerprint: fpp.0,
            data: p.clone(),
        },
        Item::New {
            fingerprint: fpx.0,
            data: x.clone(),
        },
    ];
    b.call(Call::Append { session: sb, items }).unwrap();
    // a sends x's bytes: reused from b's open container, not stored.
    let items = vec![Item::New {
        fingerprint: fpx.0,
        data: x.clone(),
    }];
    a.call(Call::Append { session: sa, items }).unwrap();
    // b commits: its container is durable, in the index, off the table.
    match b.call(Call::Commit {
        session: sb,
        tree: None,
    }) {
        Ok(Reply::Committed(_)) => {}
        other => panic!("{other:?}"),
    }
    // x repeats in a's stream: the client sent it, so names it Known.
    let items = vec![Item::Known { fingerprint: fpx.0 }];
    let known = a.call(Call::Append { session: sa, items });
    assert!(matches!(known, Ok(Reply::Appended { .. })), "{known:?}");
    match a.call(Call::Commit {
        session: sa,
        tree: None,
    }) {
        Ok(Reply::Committed(_)) => {}
        other => panic!("{other:?}"),
    }
    server.shut();
    let mut xx = x.clone();
    xx.extend(&x);
    assert!(restored(dir.path(), "a") == xx);
}
