//! The tree format: round trip, every damaged or truncated object refused
//! by name, trees that would escape their target refused, and no panic on
//! random bytes.

use proptest::prelude::*;

use super::*;
use crate::framed::frame;

const OBJ: &str = "trees/b-0000000000000001";

fn node(path: &str, kind: Kind) -> Node {
    Node::new(path.as_bytes(), kind)
}

fn sample() -> Tree {
    let mut d = node("d", Kind::Dir);
    d.mode = 0o1777;
    d.mtime = Time {
        sec: -5,
        nsec: 999_999_999,
    };
    let mut f = node("d/f", Kind::File);
    (f.size, f.mode, f.uid, f.gid) = (10, 0o4755, 1000, 100);
    f.xattrs = vec![(b"user.a".to_vec(), b"v".to_vec())];
    let mut g = node("d/g", Kind::File);
    (g.offset, g.size) = (10, 5);
    let mut s = node("d/s", Kind::Symlink);
    s.target = b"../nowhere".to_vec();
    let mut h = node("h", Kind::HardLink);
    h.target = b"d/f".to_vec();
    let mut c = node("c", Kind::CharDev);
    c.rdev = 0x0103;
    let mut odd = Node::new(b"d/\xff\xfe name".to_vec(), Kind::Fifo);
    odd.atime = Time {
        sec: 1 << 40,
        nsec: 1,
    };
    Tree {
        stream_len: 15,
        nodes: vec![d, f, g, s, h, c, odd],
    }
}

#[test]
fn round_trip() {
    let t = sample();
    assert_eq!(Tree::decode(OBJ, &t.encode()).unwrap(), t);
    let empty = Tree::default();
    assert_eq!(Tree::decode(OBJ, &empty.encode()).unwrap(), empty);
}

#[test]
fn every_flipped_byte_and_every_truncation_is_refused_by_name() {
    let bytes = sample().encode();
    for i in 0..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= bit;
            let e = Tree::decode(OBJ, &b).expect_err("flipped");
            assert!(e.to_string().contains(OBJ), "{e}");
        }
    }
    for n in 0..bytes.len() {
        let e = Tree::decode(OBJ, &bytes[..n]).expect_err("truncated");
        assert!(e.to_string().contains(OBJ), "{e}");
    }
}

/// Re-frame a tree with a valid checksum: only `check` stands in the way.
fn refused(t: &Tree, says: &str) {
    let e = Tree::decode(OBJ, &t.encode()).expect_err(says);
    assert!(e.to_string().contains(says), "{says}: {e}");
}

#[test]
fn trees_that_would_leave_their_target_are_refused() {
    for bad in ["../x", "/etc/x", "a/../../x", "./x", "a//b", "a/", ""] {
        let t = Tree {
            stream_len: 0,
            nodes: vec![node("a", Kind::Dir), node(bad, Kind::Dir)],
        };
        refused(&t, "path");
    }
    // A file under a symlink, a file, or a directory not seen yet.
    let mut s = node("a", Kind::Symlink);
    s.target = b"/etc".to_vec();
    for parent in [s, node("a", Kind::Fifo)] {
        let t = Tree {
            stream_len: 0,
            nodes: vec![parent, node("a/passwd", Kind::Fifo)],
        };
        refused(&t, "parent is not an earlier directory");
    }
    let t = Tree {
        stream_len: 0,
        nodes: vec![node("a/b", Kind::Dir), node("a", Kind::Dir)],
    };
    refused(&t, "parent is not an earlier directory");
    let t = Tree {
        stream_len: 0,
        nodes: vec![node("a", Kind::Dir), node("a", Kind::Dir)],
    };
    refused(&t, "repeated");
}

#[test]
fn inconsistent_entries_are_refused() {
    let mut t = sample();
    t.stream_len = 14;
    refused(&t, "not the stream's 14");
    let mut t = sample();
    t.nodes[2].offset = 11;
    refused(&t, "offset 11 where the stream is at 10");
    let mut t = sample();
    t.nodes[4].target = b"d".to_vec();
    refused(&t, "not an earlier file");
    let mut t = sample();
    t.nodes[4].target = b"zz".to_vec();
    refused(&t, "not an earlier file");
    let mut t = sample();
    t.nodes[0].mode = 0o10000;
    refused(&t, "12 bits");
    let mut t = sample();
    t.nodes[0].mtime.nsec = 1_000_000_000;
    refused(&t, "nanoseconds");
    let mut t = sample();
    t.nodes[3].target.clear();
    refused(&t, "symlink target");
    let mut t = sample();
    t.nodes[0].size = 1;
    refused(&t, "no contents");
    let mut t = sample();
    t.nodes[0].rdev = 1;
    refused(&t, "rdev");
    let mut t = sample();
    t.nodes[0].target = b"x".to_vec();
    refused(&t, "a target on");
    // An entry count that cannot fit is refused before allocating.
    let mut body = Vec::new();
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&u64::MAX.to_le_bytes());
    let e = Tree::decode(OBJ, &frame(MAGIC, PLAIN_VERSION, &body)).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    let e = Tree::decode(OBJ, &frame_compressed(MAGIC, PLAIN_VERSION, VERSION, &body)).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    // Another version is refused.
    let e = Tree::decode(OBJ, &frame(MAGIC, 3, &[0; 16])).unwrap_err();
    assert!(e.to_string().contains("version 3"), "{e}");
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = Tree::decode(OBJ, &bytes);
        // Framed, so the body itself is what is parsed: as is, compressed,
        // and as a compressed body.
        let _ = Tree::decode(OBJ, &frame(MAGIC, PLAIN_VERSION, &bytes));
        let _ = Tree::decode(OBJ, &frame_compressed(MAGIC, PLAIN_VERSION, VERSION, &bytes));
        let _ = Tree::decode(OBJ, &frame(MAGIC, VERSION, &bytes));
    }

    #[test]
    fn damaged_bodies_under_a_good_frame_never_panic(
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let full = sample().encode();
        // The compressed body damaged, and the raw body damaged.
        let packed = full[12..full.len() - 4].to_vec();
        let raw = zstd::decode_all(&packed[8..]).unwrap();
        for (version, mut body) in [(VERSION, packed), (PLAIN_VERSION, raw)] {
            let i = at.index(body.len());
            body[i] = value;
            body.truncate(cut.index(body.len() + 1));
            let _ = Tree::decode(OBJ, &frame(MAGIC, version, &body));
            let _ = Tree::decode(OBJ, &frame_compressed(MAGIC, PLAIN_VERSION, VERSION, &body));
        }
    }
}
