//! Segments a client sends without hashing them (`Item::Unhashed`): the
//! server hashes them and finds their repeats itself, so a backup stores
//! the same bytes whatever the client hashed; and the client's pipeline,
//! watched through a proxy that counts what crosses the socket, sends new
//! data unhashed and goes back to lookups once the stream repeats what
//! the repository holds.

use crate::rpc_support;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dedup_common::testdata::noise;
use dedup_store::rpc::protocol::{Call, ErrorKind, Item, Reply, Request, WireBackup};
use dedup_store::rpc::{BackupOptions, Client, Endpoint};
use dedup_store::writer::HASH;
use rpc_support::{begin, copies, restored, setup, Running};

fn commit(c: &Client, session: u64) -> WireBackup {
    match c.call(Call::Commit {
        session,
        tree: None,
    }) {
        Ok(Reply::Committed(b)) => b,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_server_hashes_unhashed_segments_and_stores_each_once() {
    let (dir, server) = setup();
    let c = server.client();
    let (x, y) = (noise(1, 8192), noise(2, 5000));
    let unhashed = |d: &[u8]| Item::Unhashed { data: d.to_vec() };
    // Unhashed twice in one session, then beside its own fingerprint.
    let s = begin(&c, "one");
    let items = vec![unhashed(&x), unhashed(&y), unhashed(&x)];
    c.call(Call::Append { session: s, items }).unwrap();
    let items = vec![Item::Known {
        fingerprint: HASH.fingerprint(&y).0,
    }];
    c.call(Call::Append { session: s, items }).unwrap();
    let one = commit(&c, s).report;
    assert_eq!((one.segments_new, one.segments_duplicate), (2, 2));
    // Another session's unhashed copy is found, not stored again.
    let s = begin(&c, "two");
    let items = vec![unhashed(&y), unhashed(&x)];
    c.call(Call::Append { session: s, items }).unwrap();
    let two = commit(&c, s).report;
    assert_eq!((two.segments_new, two.segments_duplicate), (0, 2));
    // An empty segment, or one over the largest, fails the session.
    for bad in [
        Vec::new(),
        vec![0; dedup_store::rpc::protocol::MAX_SEGMENT + 1],
    ] {
        let s = begin(&c, "bad");
        let items = vec![unhashed(&x), Item::Unhashed { data: bad }];
        let e = c.call(Call::Append { session: s, items }).unwrap_err();
        assert_eq!(e.kind(), Some(ErrorKind::BadRequest), "{e}");
        assert!(e.to_string().contains("segment 1 of the append"), "{e}");
        let gone = c.call(Call::Commit {
            session: s,
            tree: None,
        });
        assert_eq!(gone.unwrap_err().kind(), Some(ErrorKind::NoSuchSession));
    }
    server.shut();
    assert!(restored(dir.path(), "one") == [&x[..], &y, &x, &y].concat());
    assert!(restored(dir.path(), "two") == [&y[..], &x].concat());
    let copies_of = |d: &[u8]| copies(dir.path(), HASH.fingerprint(d).0);
    assert_eq!((copies_of(&x), copies_of(&y)), (1, 1));
}

/// What a client sent, by kind.
#[derive(Debug, Default, Clone)]
struct Sent {
    looked_up: u64,
    known: u64,
    new: u64,
    unhashed: u64,
    unhashed_bytes: u64,
    /// The fingerprints of the segments sent with their bytes, and of
    /// those sent unhashed.
    sent_bytes_of: Fps,
    unhashed_fps: Fps,
}

/// Fingerprints, shown by their number.
#[derive(Default, Clone)]
struct Fps(Vec<[u8; 32]>);

impl std::fmt::Debug for Fps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} fingerprints", self.0.len())
    }
}

/// A proxy in front of `server` that counts the items clients send.
struct Counting {
    at: PathBuf,
    sent: Arc<Mutex<Sent>>,
}

impl Counting {
    fn new(dir: &Path, server: &Running) -> Counting {
        let Endpoint::Unix(target) = server.at.clone() else {
            unreachable!("the test server listens on a Unix socket")
        };
        let at = dir.join("proxy.sock");
        let listener = UnixListener::bind(&at).unwrap();
        let sent = Arc::new(Mutex::new(Sent::default()));
        let tally = sent.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let (client, tally) = (client.unwrap(), tally.clone());
                let server = UnixStream::connect(&target).unwrap();
                std::thread::spawn(move || forward(client, server, &tally));
            }
        });
        Counting { at, sent }
    }

    fn client(&self) -> Client {
        Client::connect(&Endpoint::Unix(self.at.clone())).unwrap()
    }

    /// What was sent since the last take.
    fn take(&self) -> Sent {
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

/// Pass frames from `client` to `server`, counting, and the answers back.
fn forward(mut client: UnixStream, mut server: UnixStream, tally: &Mutex<Sent>) {
    let (mut back_from, mut back_to) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || std::io::copy(&mut back_from, &mut back_to));
    let mut len = [0u8; 4];
    while client.read_exact(&mut len).is_ok() {
        let mut body = vec![0; u32::from_be_bytes(len) as usize];
        client.read_exact(&mut body).unwrap();
        let request: Request = postcard::from_bytes(&body).unwrap();
        let mut t = tally.lock().unwrap();
        match request.call {
            Call::Lookup { fingerprints, .. } => t.looked_up += fingerprints.len() as u64,
            Call::Append { items, .. } => {
                for item in items {
                    match item {
                        Item::Known { .. } => t.known += 1,
                        Item::New { data, .. } => {
                            t.new += 1;
                            t.sent_bytes_of.0.push(HASH.fingerprint(&data).0);
                        }
                        Item::Unhashed { data } => {
                            t.unhashed += 1;
                            t.unhashed_bytes += data.len() as u64;
                            let fp = HASH.fingerprint(&data).0;
                            t.sent_bytes_of.0.push(fp);
                            t.unhashed_fps.0.push(fp);
                        }
                        Item::Parent { .. } => {}
                    }
                }
            }
            _ => {}
        }
        drop(t);
        server.write_all(&len).unwrap();
        server.write_all(&body).unwrap();
    }
    let _ = server.shutdown(std::net::Shutdown::Write);
}

fn backup(c: &Client, name: &str, bytes: &[u8], opts: &BackupOptions) -> WireBackup {
    c.backup_stream(name, "g", bytes, None, opts, &|_| {})
        .unwrap()
}

/// Small batches (of 16 segments), so the pipeline changes its mind
/// many times in a few MiB; as many hashers and batches in flight on any
/// machine, so as many batches are hashed ahead of the lookups' answers.
fn small_batches(probe_every: usize) -> BackupOptions {
    BackupOptions {
        batch_segments: 16,
        probe_every,
        hashers: 2,
        in_flight: 2,
        ..BackupOptions::default()
    }
}

#[test]
fn new_data_goes_unhashed_and_a_repeat_of_the_repository_is_looked_up_again() {
    let (dir, server) = setup();
    let proxy = Counting::new(dir.path(), &server);
    let c = proxy.client();
    let opts = small_batches(8);
    let (a, b) = (noise(3, 16 << 20), noise(4, 4 << 20));

    let first = backup(&c, "a", &a, &opts);
    let sent = proxy.take();
    let of_a: std::collections::HashSet<[u8; 32]> = sent.sent_bytes_of.0.iter().copied().collect();
    let unhashed_of_a = |s: &Sent| {
        s.unhashed_fps
            .0
            .iter()
            .filter(|f| of_a.contains(*f))
            .count()
    };
    let segments = first.report.segments_new + first.report.segments_duplicate;
    assert_eq!(sent.known + sent.new + sent.unhashed, segments, "{sent:?}");
    // Past the batches hashed before the first answer came back, 7 in 8
    // segments go unhashed, and only the others are looked up. However
    // the threads are scheduled, at most 11 of the 256 batches are hashed
    // whole first (the 8 the hashers may take ahead of the lookups, the 2
    // in flight and the one answered): over 83 % go unhashed.
    assert!(
        sent.unhashed * 100 > segments * 80,
        "{sent:?} of {segments}"
    );
    assert_eq!(sent.looked_up, sent.new + sent.known, "{sent:?}");
    assert_eq!(first.report.bytes_new, a.len() as u64);

    // B, then A again: A is found by the probes, and with completing
    // asked for (as over TCP), every segment of it is looked up, even in
    // the batches hashed (sparsely) before the pipeline saw the switch;
    // only the batch where B meets A may send some of A unhashed.
    let stream = [&b[..], &a].concat();
    let complete = BackupOptions {
        complete_probed: Some(true),
        ..opts
    };
    let second = backup(&c, "ba", &stream, &complete);
    let sent = proxy.take();
    assert_eq!(
        second.report.bytes_new,
        b.len() as u64,
        "{:?}",
        second.report
    );
    let a_segments = segments;
    assert!(sent.known + 16 >= a_segments, "{sent:?} of {a_segments}");
    assert!(
        unhashed_of_a(&sent) < 16,
        "none of A went unhashed past the batch where B meets it: {sent:?}"
    );

    // Over a Unix socket (the default there), the batches hashed
    // sparsely before the switch go as they are: some of A crosses
    // unhashed, the server finds it, and still nothing is stored twice.
    let b2 = noise(6, 4 << 20);
    let stream2 = [&b2[..], &a].concat();
    let third = backup(&c, "b2a", &stream2, &opts);
    let sent = proxy.take();
    assert_eq!(
        third.report.bytes_new,
        b2.len() as u64,
        "{:?}",
        third.report
    );
    // The batch whose probes find A goes with the rest of it unhashed,
    // whatever the timing (the data and so its cut are fixed).
    assert!(
        unhashed_of_a(&sent) > 0,
        "some of A went unhashed: {sent:?}"
    );
    assert!(sent.known > 0, "past the switch, A is looked up: {sent:?}");

    // Hashing every segment sends none unhashed.
    backup(&c, "all", &noise(5, 1 << 20), &small_batches(1));
    let sent = proxy.take();
    assert_eq!(sent.unhashed, 0, "{sent:?}");
    assert!(sent.new > 0, "{sent:?}");
    server.shut();
    assert!(restored(dir.path(), "a") == a);
    assert!(restored(dir.path(), "ba") == stream);
    assert!(restored(dir.path(), "b2a") == stream2);
}

/// Streams of new and repeated regions in random order, backed up with
/// the client hashing every segment, every other one, or 1 in 8: every
/// backup restores byte for byte, and each stores exactly the same bytes
/// whatever the client hashed (the server finds every repeat itself).
#[test]
fn what_a_backup_stores_does_not_depend_on_what_the_client_hashed() {
    let regions: Vec<Vec<u8>> = (0..6).map(|i| noise(10 + i, 1 << 20)).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n) as usize
    };
    // Each stream: regions in a random order, some of them halves, some
    // new noise between them (in whole 4 KiB segments, so what follows
    // stays on the repository's segments and is found).
    let streams: Vec<Vec<u8>> = (0..5)
        .map(|s| {
            let mut out = Vec::new();
            for k in 0..8 {
                let r = &regions[next(regions.len() as u64)];
                out.extend_from_slice(&r[..r.len() >> next(2)]);
                if next(3) == 0 {
                    out.extend(noise(100 + s * 8 + k, 4096 * (1 + next(70))));
                }
            }
            out
        })
        .collect();
    let mut stored: Vec<Vec<u64>> = Vec::new();
    for every in [1, 2, 8] {
        let (dir, server) = setup();
        let c = server.client();
        let news = (streams.iter().enumerate())
            .map(|(i, s)| {
                let b = backup(&c, &format!("s{i}"), s, &small_batches(every));
                assert_eq!(b.report.bytes_in, s.len() as u64);
                b.report.bytes_new
            })
            .collect();
        server.shut();
        for (i, s) in streams.iter().enumerate() {
            assert!(
                restored(dir.path(), &format!("s{i}")) == *s,
                "s{i}, 1 in {every}"
            );
        }
        stored.push(news);
    }
    assert!(stored.windows(2).all(|w| w[0] == w[1]), "{stored:?}");
    let stored: u64 = stored[0].iter().sum();
    let all: usize = streams.iter().map(Vec::len).sum();
    assert!(
        stored * 3 < all as u64,
        "{stored} of {all} bytes stored: few repeats found"
    );
}
