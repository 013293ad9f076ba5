//! Damaged containers: every single-byte flip and every truncation of a
//! small container is refused with an error naming the container (never a
//! panic), as are random flips in a large one, and forged fields with valid
//! checksums are refused by name.

use crate::catalog_support;

use catalog_support::{trailer, with_entries};
use dedup_common::compress::Compression;
use dedup_store::catalog_bytes;
use dedup_store::format::{crc, Header, Trailer, ENTRY_LEN, HEADER_LEN, TRAILER_LEN};
use dedup_store::{
    container_name, Catalog, Container, ContainerWriter, Error, LocalDir, ObjectStore,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

const NAME: &str = "containers/00000000000000c5";

/// A small container with a compressed, a stored-raw and an empty segment,
/// each its own frame.
fn small() -> Vec<u8> {
    let mut w = ContainerWriter::with_options(0xc5, 1 << 20, Compression::Lz4).with_frame_target(0);
    w.add(&b"abcd".repeat(40)).unwrap();
    w.add(&[0x13, 0x37, 0x42, 0x99, 0x01]).unwrap();
    w.add(b"").unwrap();
    let bytes = w.seal();
    let c = Container::parse(NAME, bytes.clone()).unwrap();
    let comps: Vec<_> = c
        .catalog()
        .entries()
        .iter()
        .map(|e| e.location.compression)
        .collect();
    assert_eq!(
        comps,
        [Compression::Lz4, Compression::None, Compression::None]
    );
    bytes
}

/// Parsing must fail, with a `Corrupt` error that names the container.
fn assert_refused(bytes: Vec<u8>, what: &str) {
    match Container::parse(NAME, bytes) {
        Ok(_) => panic!("{what}: accepted"),
        Err(e @ Error::Corrupt { .. }) => {
            assert!(e.to_string().contains(NAME), "{what}: {e}");
        }
        Err(e) => panic!("{what}: not a corruption error: {e}"),
    }
}

#[test]
fn every_single_byte_flip_of_a_small_container_is_refused() {
    let good = small();
    for at in 0..good.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[at] ^= mask;
            assert_refused(bad, &format!("byte {at} ^ {mask:#04x}"));
        }
    }
}

#[test]
fn every_truncation_and_extension_of_a_small_container_is_refused() {
    let good = small();
    for len in 0..good.len() {
        assert_refused(good[..len].to_vec(), &format!("cut to {len}"));
    }
    let mut longer = good.clone();
    longer.push(0);
    assert_refused(longer, "one byte added");
    let mut prefixed = vec![0u8];
    prefixed.extend_from_slice(&good);
    assert_refused(prefixed, "one byte in front");
}

#[test]
fn random_flips_in_a_large_container_are_refused() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut w = ContainerWriter::with_options(0xc5, 4 << 20, Compression::Lz4);
    while !w.is_full() {
        let mut seg = vec![0u8; rng.random_range(1..=64 * 1024)];
        if rng.random_bool(0.5) {
            rng.fill_bytes(&mut seg);
        }
        w.add(&seg).unwrap();
    }
    let good = w.seal();
    Container::parse(NAME, good.clone()).unwrap();
    for _ in 0..300 {
        let mut bad = good.clone();
        let at = rng.random_range(0..bad.len());
        bad[at] ^= rng.random_range(1..=255u8);
        assert_refused(bad, &format!("flip at {at}"));
    }
    for _ in 0..100 {
        let len = rng.random_range(0..good.len());
        assert_refused(good[..len].to_vec(), &format!("cut to {len}"));
    }
}

/// Flips read through the store: a damaged catalog or trailer fails the
/// catalog read; a damaged segment fails only that segment's read.
#[test]
fn catalog_reads_refuse_damaged_tails_and_segment_reads_damaged_bodies() {
    let good = small();
    let tmp = tempfile::tempdir().unwrap();
    let catalog_offset = trailer(&good).catalog_offset as usize;
    for at in 0..good.len() {
        let store = LocalDir::open(tmp.path().join(format!("s{at}"))).unwrap();
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        store.put(&container_name(0xc5), &bad).unwrap();
        let catalog = Catalog::read(&store, 0xc5);
        if at >= catalog_offset {
            let e = catalog.unwrap_err();
            assert!(e.to_string().contains(NAME), "byte {at}: {e}");
        } else if at >= HEADER_LEN {
            // The header is not part of a catalog read; the segments are
            // checked when read.
            let catalog = catalog.unwrap();
            let refused = (0..3)
                .filter(|&i| catalog.read_segment(&store, i).is_err())
                .count();
            assert_eq!(refused, 1, "byte {at}");
        }
    }
}

/// Rebuild `bytes` with a new trailer (checksummed) from `edit`.
fn with_trailer(bytes: &[u8], edit: impl FnOnce(&mut Trailer)) -> Vec<u8> {
    let at = bytes.len() - TRAILER_LEN;
    let mut t = Trailer::decode(bytes[at..].try_into().unwrap()).unwrap();
    edit(&mut t);
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(&t.encode());
    out
}

fn error_of(bytes: Vec<u8>) -> String {
    Container::parse(NAME, bytes)
        .err()
        .expect("refused")
        .to_string()
}

#[test]
fn forged_fields_with_valid_checksums_are_refused_by_name() {
    let good = small();
    let header = Header::decode(good[..HEADER_LEN].try_into().unwrap()).unwrap();

    let mut bad = good.clone();
    bad[..HEADER_LEN].copy_from_slice(
        &Header {
            version: 4,
            ..header
        }
        .encode(),
    );
    assert!(error_of(bad).contains("format version 4 in the header"));

    let mut bad = good.clone();
    bad[..HEADER_LEN].copy_from_slice(&Header { flags: 4, ..header }.encode());
    assert!(error_of(bad).contains("unknown header flags 0x4"));

    let mut bad = good.clone();
    bad[..HEADER_LEN].copy_from_slice(
        &Header {
            container_id: 7,
            ..header
        }
        .encode(),
    );
    assert!(error_of(bad).contains("the header says container 0x7"));

    let mut bad = good.clone();
    bad[..8].copy_from_slice(b"NOTACONT");
    assert!(error_of(bad).contains("bad header magic"));

    let e = error_of(with_trailer(&good, |t| t.version = 9));
    assert!(e.contains("format version 9 in the trailer"), "{e}");

    let e = error_of(with_trailer(&good, |t| t.catalog_offset = u64::MAX - 10));
    assert!(e.contains("does not end at the trailer"), "{e}");

    let e = error_of(with_trailer(&good, |t| t.catalog_offset = 3));
    assert!(e.contains("inside the 32-byte header"), "{e}");

    let e = error_of(with_trailer(&good, |t| t.catalog_len = u64::MAX));
    assert!(e.contains("cannot hold 3 compressed entries"), "{e}");
    // Fewer stored bytes than segments: a count forged to make a reader
    // decompress far more than it read.
    let e = error_of(with_trailer(&good, |t| t.catalog_len = 2));
    assert!(e.contains("cannot hold 3 compressed entries"), "{e}");

    // A segment count the size cannot hold (header agreeing, so the
    // trailer's numbers are what is checked).
    let mut bad = with_trailer(&good, |t| {
        t.segment_count = u32::MAX;
        t.catalog_len = u64::from(u32::MAX) * ENTRY_LEN as u64;
    });
    bad[..HEADER_LEN].copy_from_slice(
        &Header {
            segment_count: u32::MAX,
            ..header
        }
        .encode(),
    );
    assert!(error_of(bad).contains("does not end at the trailer"));

    // A compressed catalog with more after its zstd frame (a skippable
    // frame, which zstd itself would pass over), checksums recomputed.
    let t = trailer(&good);
    let mut catalog = good[t.catalog_offset as usize..good.len() - TRAILER_LEN].to_vec();
    catalog.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4]);
    let mut bad = good[..t.catalog_offset as usize].to_vec();
    bad.extend_from_slice(&catalog);
    bad.extend_from_slice(
        &Trailer {
            catalog_len: catalog.len() as u64,
            catalog_crc: crc(&catalog),
            ..t
        }
        .encode(),
    );
    let e = error_of(bad);
    assert!(e.contains("zstd frame and 12 bytes more"), "{e}");

    // A catalog entry pointing elsewhere, its catalog checksum recomputed.
    let bad = with_entries(&good, |e| e[0].location.offset = 1000);
    let e = error_of(bad);
    assert!(
        e.contains("segment 0's frame is at offset 1000, not 32"),
        "{e}"
    );

    // Through the store too: a trailer whose catalog lies past the end.
    let tmp = tempfile::tempdir().unwrap();
    let store = LocalDir::open(tmp.path()).unwrap();
    let bad = with_trailer(&good, |t| t.catalog_offset = 1 << 40);
    store.put(NAME, &bad).unwrap();
    let e = Catalog::read(&store, 0xc5).unwrap_err().to_string();
    assert!(e.contains("past the end of the"), "{e}");
    store.put("containers/0000000000000001", b"tiny").unwrap();
    let e = Catalog::read(&store, 1).unwrap_err().to_string();
    assert!(e.contains("shorter than a 48-byte trailer"), "{e}");
}

/// Two frames of three segments each (compressible text, then random
/// bytes that stay raw), and an empty segment in the second.
fn framed() -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut rng = StdRng::seed_from_u64(9);
    let mut segments: Vec<Vec<u8>> = (0..3)
        .map(|i| format!("line {i} of some text\n").repeat(20).into_bytes())
        .collect();
    let mut w =
        ContainerWriter::with_options(0xc5, 1 << 20, Compression::Lz4).with_frame_target(1200);
    for s in &segments {
        w.add(s).unwrap();
    }
    for len in [300, 0, 800] {
        let mut seg = vec![0u8; len];
        rng.fill_bytes(&mut seg);
        w.add(&seg).unwrap();
        segments.push(seg);
    }
    let bytes = w.seal();
    let c = Container::parse(NAME, bytes.clone()).unwrap();
    let frames: Vec<_> = c
        .catalog()
        .entries()
        .iter()
        .map(|e| {
            (
                e.location.offset,
                e.location.frame_at,
                e.location.compression,
            )
        })
        .collect();
    let (a, b) = (frames[0].0, frames[3].0);
    assert_eq!(
        frames,
        [
            (a, 0, Compression::Lz4),
            (a, 400, Compression::Lz4),
            (a, 800, Compression::Lz4),
            (b, 0, Compression::None),
            (b, 300, Compression::None),
            (b, 300, Compression::None),
        ]
    );
    (bytes, segments)
}

#[test]
fn frames_of_several_segments_read_back_whole_and_in_runs() {
    let (bytes, segments) = framed();
    let c = Container::parse(NAME, bytes.clone()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let store = LocalDir::open(tmp.path()).unwrap();
    store.put(NAME, &bytes).unwrap();
    let catalog = Catalog::read(&store, 0xc5).unwrap();
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(&c.segment(i).unwrap(), s);
        assert_eq!(&catalog.read_segment(&store, i).unwrap(), s);
        for n in 1..=segments.len() - i {
            let run = catalog.read_run(&store, i, n).unwrap();
            let run: Vec<Vec<u8>> = run.into_iter().map(|r| r.unwrap()).collect();
            assert_eq!(run, &segments[i..i + n]);
        }
    }
}

#[test]
fn every_byte_flip_of_a_framed_container_is_refused_and_costs_only_its_frame() {
    let (good, _) = framed();
    let catalog_offset = good.len() - TRAILER_LEN - 6 * ENTRY_LEN;
    let c = Container::parse(NAME, good.clone()).unwrap();
    let second_frame = c.catalog().entries()[3].location.offset as usize;
    let tmp = tempfile::tempdir().unwrap();
    for at in 0..good.len() {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        assert_refused(bad.clone(), &format!("byte {at}"));
        if !(HEADER_LEN..catalog_offset).contains(&at) {
            continue;
        }
        // Through the catalog: the damaged frame's segments fail, the
        // other frame's read, one by one and in one run.
        let store = LocalDir::open(tmp.path().join(format!("s{at}"))).unwrap();
        store.put(&container_name(0xc5), &bad).unwrap();
        let catalog = Catalog::read(&store, 0xc5).unwrap();
        let damaged = if at < second_frame { 0..3 } else { 3..6 };
        let run = catalog.read_run(&store, 0, 6).unwrap();
        for (i, in_run) in run.iter().enumerate() {
            let one = catalog.read_segment(&store, i);
            // An empty segment has nothing to damage, but its frame's
            // checksum still fails it.
            assert_eq!(one.is_err(), damaged.contains(&i), "byte {at}, segment {i}");
            assert_eq!(
                in_run.is_err(),
                damaged.contains(&i),
                "byte {at}, segment {i}"
            );
        }
    }
}

/// Containers as earlier builds wrote them still read: version 1
/// (56-byte entries, a frame per segment) and version 2 (64-byte entries,
/// the catalog not compressed).
#[test]
fn version_1_and_2_containers_still_read() {
    for version in [1, 2] {
        an_old_container_reads(version);
    }
}

fn an_old_container_reads(version: u32) {
    let good = small();
    let c = Container::parse(NAME, good.clone()).unwrap();
    let entries = c.catalog().entries();
    let trailer = trailer(&good);
    let header = Header::decode(good[..HEADER_LEN].try_into().unwrap()).unwrap();
    let mut v1 = Header { version, ..header }.encode().to_vec();
    v1.extend_from_slice(&good[HEADER_LEN..trailer.catalog_offset as usize]);
    let catalog = catalog_bytes::pack(entries, version);
    assert_eq!(catalog.len(), 3 * [56, 64][version as usize - 1]);
    v1.extend_from_slice(&catalog);
    v1.extend_from_slice(
        &Trailer {
            version,
            catalog_len: catalog.len() as u64,
            catalog_crc: crc(&catalog),
            ..trailer
        }
        .encode(),
    );
    let old = Container::parse(NAME, v1.clone()).unwrap();
    assert_eq!(old.catalog().entries(), entries);
    for i in 0..3 {
        assert_eq!(old.segment(i).unwrap(), c.segment(i).unwrap());
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = LocalDir::open(tmp.path()).unwrap();
    store.put(NAME, &v1).unwrap();
    let catalog = Catalog::read(&store, 0xc5).unwrap();
    assert_eq!(catalog.container_len(), v1.len() as u64);
    assert_eq!(
        catalog.read_segment(&store, 0).unwrap(),
        c.segment(0).unwrap()
    );
}
