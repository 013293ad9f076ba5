//! Damage to a repository's objects is refused naming the object, never a
//! panic, and an index that lies never corrupts a restore.

use crate::catalog_support;

use std::fs;
use std::path::{Path, PathBuf};

use dedup_common::fingerprint::Fingerprint;
use dedup_store::format::crc;
use dedup_store::{Entry, RepoError, RepoOptions, Repository, SegmentIndex, Segmenting};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A repository with backup `b` of three segments (one short).
fn setup() -> (tempfile::TempDir, Vec<u8>) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    let data = random(2 * 4096 + 100, 9);
    repo.backup_stream("b", "g", &data[..]).unwrap();
    (tmp, data)
}

/// Flip every byte of `file` in turn; `check` must return an error
/// mentioning `object` each time. The file is restored afterwards.
fn flip_every_byte(file: &Path, object: &str, check: impl Fn() -> Option<String>) {
    let good = fs::read(file).unwrap();
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x5a;
        fs::write(file, &bad).unwrap();
        let e = check().unwrap_or_else(|| panic!("flip at {i} of {object} accepted"));
        assert!(e.contains(object), "flip at {i}: {e}");
    }
    for cut in [0, 1, good.len() / 2, good.len() - 1] {
        fs::write(file, &good[..cut]).unwrap();
        let e = check().unwrap_or_else(|| panic!("{object} cut to {cut} accepted"));
        assert!(e.contains(object), "cut to {cut}: {e}");
    }
    fs::write(file, &good).unwrap();
    assert!(check().is_none());
}

#[test]
fn damaged_recipe_backup_and_config_are_refused_by_name() {
    let (tmp, data) = setup();
    let dir = tmp.path();
    let restore = || {
        let repo = Repository::open(dir).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        repo.restore("b", &mut out).map_err(|e| e.to_string())?;
        assert_eq!(out, data);
        repo.list_backups().map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    };
    let recipe = only_file(&dir.join("recipes"));
    let recipe_name = format!("recipes/{}", recipe.file_name().unwrap().to_str().unwrap());
    flip_every_byte(&recipe, &recipe_name, || restore().err());
    flip_every_byte(&dir.join("backups/b"), "backups/b", || restore().err());
    flip_every_byte(&dir.join("config"), "config", || restore().err());
}

#[test]
fn missing_recipe_or_container_is_named() {
    let (tmp, _) = setup();
    let dir = tmp.path();
    let container = only_file(&dir.join("containers"));
    let saved = fs::read(&container).unwrap();
    fs::remove_file(&container).unwrap();
    let repo = Repository::open(dir).unwrap();
    let e = repo.restore("b", Vec::new()).unwrap_err().to_string();
    assert!(
        e.contains("containers/0000000000000000") && e.contains("missing"),
        "{e}"
    );
    fs::write(&container, saved).unwrap();
    fs::remove_file(only_file(&dir.join("recipes"))).unwrap();
    let e = repo.restore("b", Vec::new()).unwrap_err().to_string();
    assert!(e.contains("recipes/b-") && e.contains("missing"), "{e}");
}

/// Damage a segment's bytes *and* fix every checksum over them, so only the
/// fingerprint can tell: the restore must still refuse it.
#[test]
fn a_damaged_segment_is_caught_by_its_fingerprint() {
    let (tmp, data) = setup();
    let file = only_file(&tmp.path().join("containers"));
    let mut c = fs::read(&file).unwrap();
    let l = catalog_support::entries(&c)[1].location;
    assert_eq!(
        l.stored_len, l.frame_len,
        "random data is stored uncompressed"
    );
    // Segment 1's 10th byte, then the crc of its frame in every entry of it.
    c[l.offset as usize + l.frame_at as usize + 10] ^= 1;
    let stored_crc = crc(&c[l.offset as usize..][..l.stored_len as usize]);
    let c = catalog_support::with_entries(&c, |entries| {
        for e in entries.iter_mut().filter(|e| e.location.same_frame(&l)) {
            e.location.stored_crc = stored_crc;
        }
    });
    fs::write(&file, &c).unwrap();

    let repo = Repository::open(tmp.path()).unwrap();
    let mut out = Vec::new();
    let e = repo.restore("b", &mut out).unwrap_err().to_string();
    assert!(e.contains("containers/0000000000000000"), "{e}");
    assert!(
        e.contains("segment 1 does not match its fingerprint"),
        "{e}"
    );
    // Segment 0 was fine and went out; nothing damaged did.
    assert_eq!(out, data[..4096]);
}

/// An index that answers every lookup with a plausible wrong location: an
/// existing container's wrong entry, an entry past the end, or a container
/// that does not exist.
struct Liar {
    rng: StdRng,
    containers: Vec<(u64, u32)>,
}

impl SegmentIndex for Liar {
    fn lookup(&mut self, _fp: &Fingerprint) -> Option<(u64, u32)> {
        if self.containers.is_empty() || self.rng.random_ratio(1, 5) {
            return Some((self.rng.random_range(0..1000), 0));
        }
        let (id, n) = self.containers[self.rng.random_range(0..self.containers.len())];
        Some((id, self.rng.random_range(0..n + 2)))
    }

    fn insert(&mut self, container: u64, entries: &[Entry]) {
        self.containers.push((container, entries.len() as u32));
    }
}

#[test]
fn a_lying_index_never_corrupts_a_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 32 << 10,
        force: false,
        ..RepoOptions::default()
    };
    Repository::init_with(tmp.path(), options).unwrap();
    let liar = Liar {
        rng: StdRng::seed_from_u64(5),
        containers: Vec::new(),
    };
    let mut repo = Repository::open_with_index(tmp.path(), Box::new(liar)).unwrap();
    // Few distinct blocks: a liar picking a random entry is sometimes right,
    // and then reusing it is correct too.
    let blocks: Vec<Vec<u8>> = (0..4).map(|i| random(4096, 100 + i)).collect();
    let mut rng = StdRng::seed_from_u64(6);
    let mut streams = Vec::new();
    for i in 0..20 {
        let mut s = Vec::new();
        for _ in 0..rng.random_range(0..30) {
            s.extend_from_slice(&blocks[rng.random_range(0..4)]);
        }
        s.extend_from_slice(&random(rng.random_range(0..5000), 200 + i));
        repo.backup_stream(&format!("s{i}"), "g", &s[..]).unwrap();
        streams.push(s);
    }
    for reopened in [false, true] {
        if reopened {
            // One writer at a time: the old handle goes first.
            drop(repo);
            repo = Repository::open(tmp.path()).unwrap();
        }
        for (i, s) in streams.iter().enumerate() {
            let mut out = Vec::new();
            repo.restore(&format!("s{i}"), &mut out).unwrap();
            assert!(out == *s, "s{i} restored wrong (reopened: {reopened})");
        }
    }
    // An honest index on the same repository dedups what the liar stored.
    let r = repo.backup_stream("again", "g", &streams[3][..]).unwrap();
    assert_eq!(r.bytes_new, 0, "{r:?}");
}

#[test]
fn restore_errors_are_errors_not_panics() {
    let (tmp, _) = setup();
    let repo = Repository::open(tmp.path()).unwrap();
    assert!(matches!(
        repo.restore("nope", Vec::new()),
        Err(RepoError::NoSuchBackup { .. })
    ));
    assert!(matches!(
        repo.restore("../x", Vec::new()),
        Err(RepoError::BadName { .. })
    ));
}

/// Recipes keep their references by column with 8-byte fingerprint checks,
/// compressed (version 5), and trees their bodies compressed (version 2);
/// recipes with whole fingerprints, by column (version 3) or by rows,
/// compressed (version 2) or plain (version 1), and plain trees still read;
/// a compressed body that does not decompress, or not to the length it
/// names, is refused by name.
#[test]
fn compressed_recipes_and_trees_and_plain_ones_from_before() {
    use dedup_store::recipe::{Recipe, SegmentRef};
    use dedup_store::tree::Tree;
    let fps: Vec<Fingerprint> = (0..300u32)
        .map(|i| dedup_store::writer::HASH.fingerprint(&(i % 30).to_le_bytes()))
        .collect();
    let recipe = Recipe {
        stream_len: 4096 * 300,
        segments: (0..300)
            .map(|i| SegmentRef::new(7, i % 30, 4096, &fps[i as usize]))
            .collect(),
    };
    let bytes = recipe.encode();
    assert_eq!(&bytes[8..12], &5u32.to_le_bytes(), "written as version 5");
    assert!(bytes.len() < 300 * 24 / 4, "{} bytes", bytes.len());
    assert_eq!(Recipe::decode("r", &bytes).unwrap(), recipe);
    // The same references with whole fingerprints, as rows (versions 1,
    // plain, and 2, compressed) and as columns (version 3, compressed).
    let head = |raw: &mut Vec<u8>| {
        raw.extend_from_slice(&recipe.stream_len.to_le_bytes());
        raw.extend_from_slice(&(recipe.segments.len() as u64).to_le_bytes());
    };
    let mut rows = Vec::new();
    head(&mut rows);
    for (s, fp) in recipe.segments.iter().zip(&fps) {
        rows.extend_from_slice(&s.container.to_le_bytes());
        rows.extend_from_slice(&s.entry.to_le_bytes());
        rows.extend_from_slice(&s.len.to_le_bytes());
        rows.extend_from_slice(&fp.0);
    }
    let mut columns = Vec::new();
    head(&mut columns);
    let segs = &recipe.segments;
    segs.iter()
        .for_each(|s| columns.extend_from_slice(&s.container.to_le_bytes()));
    segs.iter()
        .for_each(|s| columns.extend_from_slice(&s.entry.to_le_bytes()));
    segs.iter()
        .for_each(|s| columns.extend_from_slice(&s.len.to_le_bytes()));
    fps.iter().for_each(|fp| columns.extend_from_slice(&fp.0));
    let packed = |raw: &[u8]| {
        let mut b = (raw.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(&zstd::encode_all(raw, 3).unwrap());
        b
    };
    for (version, body) in [
        (1u32, rows.clone()),
        (2, packed(&rows)),
        (3, packed(&columns)),
    ] {
        let old = frame(*b"DDUPRCPE", version, &body);
        assert_eq!(
            Recipe::decode("r", &old).unwrap(),
            recipe,
            "version {version}"
        );
    }
    // Columns read as rows are other references: the lengths no longer
    // add up, and that is refused.
    let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 1, &columns)).unwrap_err();
    assert!(err.to_string().contains("add up to"), "{err}");
    // Version 5's columns read as plain version 6 are a compressed body
    // taken for references: refused, as is version 3's body as version 5
    // (a count that does not fit its bytes).
    let v5 = bytes[12..bytes.len() - 4].to_vec();
    assert!(Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 6, &v5)).is_err());
    let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 5, &packed(&columns))).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    // Forged compressed bodies with good checksums, in every compressed
    // version: not zstd, or decompressing to one byte fewer or more than
    // they name.
    let v5_raw = zstd::decode_all(&v5[8..]).unwrap();
    for (version, body) in [(2u32, &rows), (3, &columns), (5, &v5_raw), (7, &v5_raw)] {
        let mut not_zstd = 100u64.to_le_bytes().to_vec();
        not_zstd.extend_from_slice(b"not zstd at all");
        let err =
            Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", version, &not_zstd)).unwrap_err();
        assert!(
            err.to_string().contains("recipes/x") && err.to_string().contains("decompress"),
            "{err}"
        );
        let named = |raw: &[u8]| {
            let mut b = (body.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(&zstd::encode_all(raw, 3).unwrap());
            Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", version, &b)).unwrap_err()
        };
        let short = named(&body[..body.len() - 1]);
        assert!(short.to_string().contains("it names"), "{short}");
        let long = named(&[&body[..], &[0]].concat());
        assert!(long.to_string().contains("it names"), "{long}");
    }
    let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 4, &packed(&rows))).unwrap_err();
    assert!(err.to_string().contains("format version 4"), "{err}");
    let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 8, &v5)).unwrap_err();
    assert!(err.to_string().contains("version 8"), "{err}");
    // A body naming more than 64 times its compressed bytes is refused
    // before it is decompressed.
    let mut bomb = (1u64 << 40).to_le_bytes().to_vec();
    bomb.extend_from_slice(&zstd::encode_all(&rows[..], 3).unwrap());
    for version in [2u32, 3, 5] {
        let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", version, &bomb)).unwrap_err();
        assert!(err.to_string().contains("over 64 times"), "{err}");
    }
    // Version 7 may expand any number of times, but to no more than a
    // part's references.
    let err = Recipe::decode("recipes/x", &frame(*b"DDUPRCPE", 7, &bomb)).unwrap_err();
    assert!(err.to_string().contains("over the"), "{err}");
    // A body that would expand more than that (a stream of zeros: every
    // reference the same) is written plain, as version 6, and reads.
    let zeros = Recipe {
        stream_len: 16384 * 100_000,
        segments: vec![recipe.segments[0]; 100_000]
            .into_iter()
            .map(|s| SegmentRef { len: 16384, ..s })
            .collect(),
    };
    let bytes = zeros.encode();
    assert_eq!(&bytes[8..12], &6u32.to_le_bytes(), "written as version 6");
    assert_eq!(Recipe::decode("r", &bytes).unwrap(), zeros);
    // A tree: the same, in one line each way.
    let tree = Tree {
        stream_len: 0,
        nodes: Vec::new(),
    };
    let t = tree.encode();
    assert_eq!(Tree::decode("t", &t).unwrap(), tree);
    let raw = zstd::decode_all(&t[20..t.len() - 4]).unwrap();
    assert_eq!(
        Tree::decode("t", &frame(*b"DDUPTREE", 1, &raw)).unwrap(),
        tree
    );
}

/// A frame as the repository writes one: magic, version, body, crc32c.
fn frame(magic: [u8; 8], version: u32, body: &[u8]) -> Vec<u8> {
    let mut b = magic.to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(body);
    let sum = crc32c::crc32c(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}
