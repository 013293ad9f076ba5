//! A server without a key on a Unix socket: peers that connect and never
//! say Hello neither lock clients out nor hold their slots for the idle
//! timeout (an hour by default). The handshake's deadline and the room
//! made by closing the oldest connection not yet in apply as on TCP with
//! a key.

use crate::rpc_support;

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dedup_store::rpc::{Client, Endpoint, ServerLimits};
use rpc_support::setup_with;

/// Whether the server closed `s` within its read timeout.
fn closed(s: &mut UnixStream) -> bool {
    let mut byte = [0u8; 1];
    match s.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => panic!("the server said something unasked"),
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn unix_peers_that_never_say_hello_cannot_keep_a_client_out_and_are_cut_off() {
    let limits = ServerLimits {
        max_connections: 2,
        ..ServerLimits::default()
    };
    let (_dir, server) = setup_with(limits);
    let Endpoint::Unix(path) = &server.at else {
        unreachable!("served on a Unix socket")
    };
    let start = Instant::now();
    let mut squatters: Vec<UnixStream> =
        (0..2).map(|_| UnixStream::connect(path).unwrap()).collect();
    // Taken by the server (it polls its listener).
    std::thread::sleep(Duration::from_millis(300));
    let client = Client::connect(&server.at).unwrap();
    assert!(client.list().unwrap().is_empty());
    squatters[0]
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    assert!(closed(&mut squatters[0]), "the oldest was closed for room");
    // The other is cut off at the handshake's 10 s, not the idle hour.
    squatters[1]
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    assert!(closed(&mut squatters[1]), "never cut off");
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(12), "cut off after {waited:?}");
    // The client, in, is not.
    assert!(client.list().unwrap().is_empty());
}
