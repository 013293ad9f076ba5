//! Round trip: a stream of random segments (1 B to 64 KiB, some repeated,
//! some compressible), deduplicated by fingerprint as the index will, packed
//! into containers, stored in a `LocalDir`, and read back: catalogs from the
//! trailer and catalog alone, then every segment byte for byte.

use std::collections::HashMap;
use std::sync::Mutex;

use dedup_common::compress::Compression;
use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use dedup_store::format::{Trailer, ENTRY_LEN, TRAILER_LEN};
use dedup_store::{container_name, Catalog, Container, ContainerWriter, LocalDir, ObjectStore};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// An `ObjectStore` that records the reads it passes on, so the test can
/// show what reading a catalog touches.
struct Recording<'a> {
    inner: &'a LocalDir,
    /// Tail reads as (name, length), ranged reads as (name, offset,
    /// length), whole reads by name.
    tails: Mutex<Vec<(String, u64)>>,
    ranges: Mutex<Vec<(String, u64, u64)>>,
    wholes: Mutex<Vec<String>>,
}

impl ObjectStore for Recording<'_> {
    fn put(&self, name: &str, bytes: &[u8]) -> dedup_store::Result<()> {
        self.inner.put(name, bytes)
    }
    fn get(&self, name: &str) -> dedup_store::Result<Vec<u8>> {
        self.wholes.lock().unwrap().push(name.into());
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> dedup_store::Result<Vec<u8>> {
        self.ranges.lock().unwrap().push((name.into(), offset, len));
        self.inner.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> dedup_store::Result<Vec<u8>> {
        self.tails.lock().unwrap().push((name.into(), len));
        self.inner.get_tail(name, len)
    }
    fn get_tail_sized(&self, name: &str, len: u64) -> dedup_store::Result<(Vec<u8>, u64)> {
        self.tails.lock().unwrap().push((name.into(), len));
        self.inner.get_tail_sized(name, len)
    }
    fn list(&self, prefix: &str) -> dedup_store::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn size(&self, name: &str) -> dedup_store::Result<u64> {
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> dedup_store::Result<()> {
        self.inner.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.inner.segment_hash()
    }
}

/// A segment: random bytes, or a short random pattern repeated (compressible).
fn segment(rng: &mut StdRng) -> Vec<u8> {
    let len = rng.random_range(1..=64 * 1024);
    let mut data = vec![0u8; len];
    if rng.random_bool(0.5) {
        rng.fill_bytes(&mut data);
    } else {
        let mut pattern = [0u8; 16];
        rng.fill_bytes(&mut pattern);
        for (i, b) in data.iter_mut().enumerate() {
            *b = pattern[i % pattern.len()];
        }
    }
    data
}

#[test]
fn segments_survive_containers_in_a_local_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::open(tmp.path().join("store")).unwrap();
    let mut rng = StdRng::seed_from_u64(17);

    // The stream, with about one segment in four a repeat of an earlier one.
    let mut stream: Vec<Vec<u8>> = Vec::new();
    for _ in 0..400 {
        if !stream.is_empty() && rng.random_bool(0.25) {
            let again = stream[rng.random_range(0..stream.len())].clone();
            stream.push(again);
        } else {
            stream.push(segment(&mut rng));
        }
    }

    // Pack the new segments into 1 MiB containers, as the index will.
    let mut index: HashMap<Fingerprint, (u64, usize)> = HashMap::new();
    let mut writer = ContainerWriter::with_options(0, 1 << 20, Compression::Lz4);
    let mut sealed_lens = HashMap::new();
    for data in &stream {
        let fp = HashAlgo::Blake3.fingerprint(data);
        if index.contains_key(&fp) {
            continue;
        }
        if writer.is_full() {
            let next = ContainerWriter::with_options(writer.id() + 1, 1 << 20, Compression::Lz4);
            let full = std::mem::replace(&mut writer, next);
            let id = full.id();
            let bytes = full.seal();
            sealed_lens.insert(id, bytes.len() as u64);
            dir.put(&container_name(id), &bytes).unwrap();
        }
        let (added, i) = writer.add(data).unwrap();
        assert_eq!(added, fp);
        index.insert(fp, (writer.id(), i));
    }
    let last = writer.id();
    let bytes = writer.seal();
    sealed_lens.insert(last, bytes.len() as u64);
    dir.put(&container_name(last), &bytes).unwrap();
    assert!(last >= 5, "the stream fills several containers ({last})");
    assert!(index.len() < stream.len(), "the stream has repeats");

    let names = dir.list("containers/").unwrap();
    assert_eq!(names, (0..=last).map(container_name).collect::<Vec<_>>());

    // Catalogs in a directory: one tail read of the trailer (with the
    // object's size), one ranged read of exactly the catalog, and nothing
    // of the segments. (In a bucket the tail read holds the catalog too:
    // `s3::tests`.)
    let rec = Recording {
        inner: &dir,
        tails: Mutex::default(),
        ranges: Mutex::default(),
        wholes: Mutex::default(),
    };
    let mut catalogs = HashMap::new();
    let mut compressed = 0;
    for id in 0..=last {
        let catalog = Catalog::read(&rec, id).unwrap();
        assert_eq!(catalog.container_id(), id);
        let name = container_name(id);
        let bytes = dir.get(&name).unwrap();
        let t = Trailer::decode(bytes[bytes.len() - TRAILER_LEN..].try_into().unwrap()).unwrap();
        let (catalog_offset, catalog_len) = (t.catalog_offset, t.catalog_len);
        assert_eq!(
            catalog_offset + catalog_len + TRAILER_LEN as u64,
            sealed_lens[&id]
        );
        assert_eq!(catalog.container_len(), sealed_lens[&id]);
        // Compressed: the fingerprints (32 bytes each) and a few bytes of
        // each location, not 64 bytes an entry.
        let entries = catalog.entries().len() as u64;
        assert!(
            catalog_len < entries * ENTRY_LEN as u64 * 3 / 4,
            "{catalog_len} bytes for {entries} entries"
        );
        assert_eq!(
            rec.tails.lock().unwrap().pop(),
            Some((name.clone(), TRAILER_LEN as u64))
        );
        assert_eq!(
            rec.ranges.lock().unwrap().pop(),
            Some((name, catalog_offset, catalog_len))
        );
        compressed += catalog
            .entries()
            .iter()
            .filter(|e| !e.location.compression.is_none())
            .count();
        catalogs.insert(id, catalog);
    }
    assert!(rec.wholes.lock().unwrap().is_empty());
    assert!(rec.ranges.lock().unwrap().is_empty());
    assert!(compressed > 0, "some segments were stored compressed");

    // Every segment of the stream, byte for byte, both from a ranged read
    // of it alone and from the whole container.
    let containers: HashMap<u64, Container> = (0..=last)
        .map(|id| (id, Container::read(&dir, id).unwrap()))
        .collect();
    for data in &stream {
        let fp = HashAlgo::Blake3.fingerprint(data);
        let (id, i) = index[&fp];
        let catalog = &catalogs[&id];
        assert_eq!(catalog.entries()[i].fingerprint, fp);
        assert_eq!(catalog.entries()[i].location.raw_len as usize, data.len());
        assert_eq!(&catalog.read_segment(&dir, i).unwrap(), data);
        assert_eq!(&containers[&id].segment(i).unwrap(), data);
    }
}

#[test]
fn a_full_writer_refuses_more_and_a_large_segment_gets_its_own_container() {
    let mut w = ContainerWriter::with_options(3, 100, Compression::Lz4);
    assert!(!w.is_full(), "an empty writer is never full");
    let big = vec![7u8; 5000];
    w.add(&big).unwrap();
    assert!(w.is_full());
    let e = w.add(b"more").unwrap_err().to_string();
    assert!(e.contains("container 3 is full"), "{e}");
    let c = Container::parse("c", w.seal()).unwrap();
    assert_eq!(c.segment(0).unwrap(), big);
    let e = c.segment(1).unwrap_err().to_string();
    assert!(e.contains("has 1 segments, no segment 1"), "{e}");

    let mut w = ContainerWriter::new(4);
    let e = w
        .add(&vec![0u8; dedup_store::format::MAX_SEGMENT_LEN + 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("over the"), "{e}");
}

#[test]
fn an_empty_segment_and_an_empty_container_round_trip() {
    let mut w = ContainerWriter::new(9);
    w.add(b"").unwrap();
    let c = Container::parse("c", w.seal()).unwrap();
    assert_eq!(c.segment(0).unwrap(), b"");
    let c = Container::parse("e", ContainerWriter::new(10).seal()).unwrap();
    assert!(c.catalog().entries().is_empty());
}

#[test]
fn a_container_under_another_id_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::open(tmp.path()).unwrap();
    let mut w = ContainerWriter::new(1);
    w.add(b"hello").unwrap();
    dir.put(&container_name(2), &w.seal()).unwrap();
    for e in [
        Catalog::read(&dir, 2).unwrap_err(),
        Container::read(&dir, 2).err().unwrap(),
    ] {
        let e = e.to_string();
        assert!(
            e.contains("containers/0000000000000002") && e.contains("holds container id 0x1"),
            "{e}"
        );
    }
}

/// A catalog read from `compacted/<id>` (a compaction replacing
/// `containers/<id>`) still reads its segments once the compaction has put
/// `containers/<id>` back and deleted `compacted/<id>`.
#[test]
fn a_catalog_read_mid_compaction_reads_after_it() {
    use dedup_store::container::compacted_name;
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::open(tmp.path()).unwrap();
    let mut w = ContainerWriter::new(9);
    w.add(b"a segment").unwrap();
    w.add(&[7u8; 5000]).unwrap();
    let bytes = w.seal();
    // Steps 1 and 2 of a compaction: the new version under compacted/.
    dir.put(&compacted_name(9), &bytes).unwrap();
    let catalog = Catalog::read(&dir, 9).unwrap();
    assert!(catalog.object_name().starts_with("compacted/"));
    // Steps 3 and 4.
    dir.put(&container_name(9), &bytes).unwrap();
    dir.delete(&compacted_name(9)).unwrap();
    assert_eq!(catalog.read_segment(&dir, 0).unwrap(), b"a segment");
    let run = catalog.read_run(&dir, 0, 2).unwrap();
    assert_eq!(run[1].as_ref().unwrap(), &[7u8; 5000]);
    catalog.check_header(&dir).unwrap();
}

/// A run read from a whole container (`Container::run`, how a restore
/// from a bucket reads) gives what the ranged read of the same run gives
/// (`Catalog::read_run`), segment by segment: an entry compaction removed
/// fails alone and the segments after it are read; a damaged frame fails
/// each of its segments with one error.
#[test]
fn a_run_read_from_a_whole_container_fails_only_what_is_removed_or_damaged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = LocalDir::open(tmp.path()).unwrap();
    // The entry a compaction left of a removed segment.
    let mut other = ContainerWriter::new(4);
    other.add(&[b'b'; 3000]).unwrap();
    let removed = Container::parse("other", other.seal())
        .unwrap()
        .catalog()
        .entries()[0];
    let mut w = ContainerWriter::new(3).with_frame_target(1 << 20);
    let segments: Vec<Vec<u8>> = (0..4u8)
        .map(|i| vec![b'c' + i; 3000 + i as usize])
        .collect();
    w.add(&segments[0]).unwrap();
    w.add_absent(&removed);
    // These two share a frame, which starts where the removed entry is
    // recorded.
    w.add(&segments[2]).unwrap();
    w.add(&segments[3]).unwrap();
    let bytes = w.seal();
    let both = |bytes: &[u8]| {
        dir.put(&container_name(3), bytes).unwrap();
        let ranged = Catalog::read(&dir, 3)
            .unwrap()
            .read_run(&dir, 0, 4)
            .unwrap();
        let whole = Container::parse_structure("containers/0000000000000003", bytes.to_vec())
            .unwrap()
            .run(0, 4);
        dir.delete(&container_name(3)).unwrap();
        let show = |r: Vec<dedup_store::Result<Vec<u8>>>| -> Vec<Result<Vec<u8>, String>> {
            r.into_iter()
                .map(|s| s.map_err(|e| e.to_string()))
                .collect()
        };
        let (ranged, whole) = (show(ranged), show(whole));
        assert_eq!(whole, ranged);
        whole
    };
    let intact = both(&bytes);
    assert_eq!(intact[0].as_deref().unwrap(), &segments[0][..]);
    assert!(intact[1]
        .as_ref()
        .unwrap_err()
        .contains("removed by garbage collection"));
    assert_eq!(intact[2].as_deref().unwrap(), &segments[2][..]);
    assert_eq!(intact[3].as_deref().unwrap(), &segments[3][..]);
    // A byte flipped in the shared frame.
    let catalog = Container::parse("c", bytes.clone())
        .unwrap()
        .catalog()
        .clone();
    let frame = catalog.entries()[2].location;
    let mut bad = bytes.clone();
    bad[frame.offset as usize + 10] ^= 0x5a;
    let damaged = both(&bad);
    assert!(damaged[0].is_ok() && damaged[1].is_err());
    let e = damaged[2].as_ref().unwrap_err();
    assert_eq!(
        damaged[3].as_ref().unwrap_err(),
        e,
        "one error for the frame"
    );
}
