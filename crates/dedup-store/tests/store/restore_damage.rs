//! Damage anywhere in a repository of several backups costs only what
//! needs the damaged bytes: a byte is flipped in every region of every
//! object (each frame, catalog and trailer of each container, each recipe
//! part and index, each tree and backup object, the config), and after
//! each flip every backup is restored. A file whose segments and tree are
//! intact restores byte for byte; every other one is named, with the
//! ranges it lost (the rest of it is written); a damaged tree or backup
//! object refuses its backup by name; a stream restores past damage with
//! zeros in the ranges it names; nothing panics. `include` of an intact
//! path reads no frame it does not need.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};

use dedup_common::compress::Compression;
use dedup_store::recipe::parts::{part_name, RecipeObject};
use dedup_store::tree::{Kind, Tree};
use dedup_store::{
    Catalog, LocalDir, RepoOptions, Repository, RestoreOptions, RestoreReport, Segmenting, WriteAt,
};
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Text-like bytes that compress, so frames are stored compressed too.
fn text(n: usize, seed: u64) -> Vec<u8> {
    let words: Vec<String> = (0..200).map(|i| format!("w{}x{} ", i * seed, i)).collect();
    let r = random(n, seed);
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < n {
        out.extend_from_slice(words[r[i % n] as usize % words.len()].as_bytes());
        i += 1;
    }
    out.truncate(n);
    out
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

/// What a backup holds, read from the intact repository: its objects, its
/// files' ranges of the stream, and where each segment lies.
struct Known {
    name: String,
    backup_object: String,
    tree_object: Option<String>,
    recipe_object: String,
    /// Recipe part objects and the ranges of the stream they cover.
    parts: Vec<(String, Range<u64>)>,
    /// (container, entry) of each segment and its range of the stream.
    segments: Vec<((u64, u32), Range<u64>)>,
    tree: Option<Tree>,
    stream: Vec<u8>,
}

/// Which backups a flip costs what: `None` for a backup refused whole
/// (and the object its error must name), else the ranges of its stream
/// that are lost.
enum Cost {
    Refused(String),
    Ranges(Vec<Range<u64>>),
}

fn know(repo: &Repository, dir: &Path, name: &str) -> Known {
    let (record, recipe) = repo.recipe(name).unwrap();
    let mut segments = Vec::new();
    let mut at = 0;
    for s in &recipe.segments {
        segments.push(((s.container, s.entry), at..at + u64::from(s.len)));
        at += u64::from(s.len);
    }
    let head = fs::read(dir.join(&record.recipe)).unwrap();
    let parts = match RecipeObject::decode(&record.recipe, &head).unwrap() {
        RecipeObject::Whole(r) => vec![(record.recipe.clone(), 0..r.stream_len)],
        RecipeObject::Index(i) => {
            let mut at = 0;
            (i.parts.iter().enumerate())
                .map(|(k, p)| {
                    at += p.bytes;
                    (part_name(&record.recipe, k), at - p.bytes..at)
                })
                .collect()
        }
    };
    let tree = record.tree.as_ref().map(|t| {
        let bytes = fs::read(dir.join(t)).unwrap();
        Tree::decode(t, &bytes).unwrap()
    });
    let mut stream = Vec::new();
    repo.restore(name, &mut stream).unwrap();
    Known {
        name: name.into(),
        backup_object: format!("backups/{name}"),
        tree_object: record.tree.clone(),
        recipe_object: record.recipe.clone(),
        parts,
        segments,
        tree,
        stream,
    }
}

/// A repository of three backups of files (the second after edits, the
/// third of a part) and one of a stream, in small containers of frames of
/// both kinds, recipes in parts of 16 segments.
fn setup(tmp: &Path) -> (PathBuf, Vec<Known>) {
    let data = tmp.join("data");
    write(&data, "a/text1", &text(200_000, 1));
    write(&data, "a/rand1", &random(150_000, 2));
    write(&data, "a/small", &text(3_000, 3));
    write(&data, "b/rand2", &random(300_000, 4));
    write(&data, "b/text2", &text(100_000, 5));
    write(&data, "b/c/rand3", &random(60_000, 6));
    write(&data, "empty", b"");
    write(&data, "dup", &random(150_000, 2));
    std::os::unix::fs::symlink("a/small", data.join("link")).unwrap();
    fs::hard_link(data.join("a/small"), data.join("hl")).unwrap();
    let dir = tmp.join("repo");
    let options = RepoOptions {
        segmenting: Segmenting::Fixed { size: 4096 },
        container_target: 256 << 10,
        compression: Compression::Lz4,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(&dir, options).unwrap();
    repo.set_recipe_part_segments(16);
    repo.backup_paths("one", "g", &[&data], |_| {}).unwrap();
    write(&data, "b/rand2", &random(300_000, 7));
    write(&data, "new", &text(80_000, 8));
    repo.backup_paths("two", "g", &[&data], |_| {}).unwrap();
    repo.backup_paths("three", "h", &[&data.join("b")], |_| {})
        .unwrap();
    let stream = [random(200_000, 9), text(300_000, 10)].concat();
    repo.backup_stream("s", "s", &stream[..]).unwrap();
    let known = ["one", "two", "three", "s"]
        .iter()
        .map(|n| know(&repo, &dir, n))
        .collect();
    (dir, known)
}

/// Positions to flip in each object file, one or more in each region,
/// and what each costs each backup.
fn flips(dir: &Path, known: &[Known]) -> Vec<(String, u64, Vec<Cost>)> {
    let store = LocalDir::open(dir).unwrap();
    let mut out = Vec::new();
    let refused = |object: &str, pick: &dyn Fn(&Known) -> bool| -> Vec<Cost> {
        known
            .iter()
            .map(|k| match pick(k) {
                true => Cost::Refused(object.to_string()),
                false => Cost::Ranges(Vec::new()),
            })
            .collect()
    };
    for entry in fs::read_dir(dir.join("containers")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        let object = format!("containers/{file}");
        let id = u64::from_str_radix(&file, 16).unwrap();
        let catalog = Catalog::read(&store, id).unwrap();
        let bytes = fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        let trailer = &bytes[bytes.len() - 48..];
        let catalog_at = u64::from_le_bytes(trailer[24..32].try_into().unwrap());
        let lost_if = |hit: &dyn Fn(u32) -> bool| -> Vec<Cost> {
            known
                .iter()
                .map(|k| {
                    Cost::Ranges(
                        (k.segments.iter())
                            .filter(|((c, e), _)| *c == id && hit(*e))
                            .map(|(_, r)| r.clone())
                            .collect(),
                    )
                })
                .collect()
        };
        // The header: a restore does not read it.
        out.push((object.clone(), 5, lost_if(&|_| false)));
        let mut frames: BTreeMap<u64, (u32, Vec<u32>)> = BTreeMap::new();
        for (i, e) in catalog.entries().iter().enumerate() {
            let f = frames
                .entry(e.location.offset)
                .or_insert((e.location.stored_len, Vec::new()));
            f.1.push(i as u32);
        }
        for (offset, (stored, entries)) in frames {
            for at in [offset, offset + u64::from(stored) - 1] {
                out.push((object.clone(), at, lost_if(&|e| entries.contains(&e))));
            }
        }
        for at in [catalog_at, (catalog_at + len - 48) / 2, len - 40, len - 1] {
            out.push((object.clone(), at, lost_if(&|_| true)));
        }
    }
    for k in known {
        for (part, range) in &k.parts {
            let len = fs::metadata(dir.join(part)).unwrap().len();
            for at in [0, len / 2, len - 1] {
                let costs = known
                    .iter()
                    .map(|o| match o.name == k.name {
                        // A recipe in one object: its backup's whole stream.
                        true if *part == k.recipe_object => whole(o),
                        true => Cost::Ranges(std::iter::once(range.clone()).collect()),
                        false => Cost::Ranges(Vec::new()),
                    })
                    .collect();
                out.push((part.clone(), at, costs));
            }
        }
        if k.parts.len() > 1 {
            let len = fs::metadata(dir.join(&k.recipe_object)).unwrap().len();
            for at in [0, len / 2, len - 1] {
                let costs = (known.iter())
                    .map(|o| match o.name == k.name {
                        true => whole(o),
                        false => Cost::Ranges(Vec::new()),
                    })
                    .collect();
                out.push((k.recipe_object.clone(), at, costs));
            }
        }
        let mut own = vec![k.backup_object.clone()];
        own.extend(k.tree_object.clone());
        for object in own {
            let len = fs::metadata(dir.join(&object)).unwrap().len();
            for at in [0, len / 2, len - 1] {
                let costs = refused(&object, &|o| o.name == k.name);
                out.push((object.clone(), at, costs));
            }
        }
    }
    out.push(("config".into(), 20, refused("config", &|_| true)));
    out
}

/// What losing backup `k`'s recipe object costs it: a stream cannot be
/// found at all; the tree of a backup of files still makes everything
/// but the files' contents, and names each file.
fn whole(k: &Known) -> Cost {
    match k.tree {
        Some(_) => Cost::Ranges(std::iter::once(0..u64::MAX).collect()),
        None => Cost::Refused(k.recipe_object.clone()),
    }
}

fn overlaps(a: &Range<u64>, lost: &[Range<u64>]) -> bool {
    lost.iter().any(|l| a.start < l.end && l.start < a.end)
}

/// Restore files backup `k` after a flip that costs it `cost`, and check
/// the restore against it.
fn check_files(dir: &Path, target: &Path, k: &Known, cost: &Cost, flip: &str) {
    let tree = k.tree.as_ref().unwrap();
    let got = Repository::open_read_only(dir)
        .and_then(|repo| repo.restore_tree(&k.name, target, &RestoreOptions::default()));
    let lost = match (cost, got) {
        (Cost::Refused(object), Err(e)) => {
            let e = e.to_string();
            assert!(
                e.contains(object.as_str()),
                "{flip}: {} refused: {e}",
                k.name
            );
            return;
        }
        (Cost::Refused(_), Ok(r)) => panic!("{flip}: {} restored: {r:?}", k.name),
        (Cost::Ranges(_), Err(e)) => panic!("{flip}: {} refused: {e}", k.name),
        (Cost::Ranges(lost), Ok(r)) => (lost, r),
    };
    let (lost, report): (&Vec<Range<u64>>, RestoreReport) = lost;
    let named: BTreeMap<PathBuf, _> = (report.damaged.iter())
        .map(|d| {
            let p = Path::new(&d.path)
                .strip_prefix(target)
                .unwrap()
                .to_path_buf();
            (p, d.ranges.clone())
        })
        .collect();
    let mut expected = BTreeSet::new();
    for n in &tree.nodes {
        let path = PathBuf::from(String::from_utf8(n.path.clone()).unwrap());
        let file = match n.kind {
            Kind::File => n,
            Kind::HardLink => tree.nodes.iter().find(|f| f.path == n.target).unwrap(),
            _ => continue,
        };
        let range = file.offset..file.offset + file.size;
        let want = &k.stream[range.start as usize..range.end as usize];
        let have = fs::read(target.join(&path)).unwrap();
        assert_eq!(have.len(), want.len(), "{flip}: {} {path:?}", k.name);
        if !range.is_empty() && overlaps(&range, lost) {
            expected.insert(path.clone());
        }
        match named.get(&path) {
            // Restored whole: byte for byte.
            None => assert!(have == want, "{flip}: {} {path:?} differs", k.name),
            // Named: every byte outside its named ranges is restored.
            Some(ranges) => {
                let mut mask = vec![true; want.len()];
                for r in ranges {
                    mask[r.offset as usize..(r.offset + r.len) as usize].fill(false);
                }
                let bad = (0..want.len()).find(|&i| mask[i] && have[i] != want[i]);
                assert_eq!(bad, None, "{flip}: {} {path:?} {ranges:?}", k.name);
            }
        }
    }
    let named: BTreeSet<PathBuf> = named.into_keys().collect();
    assert_eq!(named, expected, "{flip}: {} names what it lost", k.name);
}

/// Restore stream backup `k` past damage and check it against `cost`.
fn check_stream(dir: &Path, k: &Known, cost: &Cost, flip: &str) {
    let mut out = Vec::new();
    let got =
        Repository::open_read_only(dir).and_then(|repo| repo.restore_salvage(&k.name, &mut out));
    let (lost, s) = match (cost, got) {
        (Cost::Refused(object), Err(e)) => {
            assert!(e.to_string().contains(object.as_str()), "{flip}: {e}");
            return;
        }
        (Cost::Ranges(lost), Ok(s)) => (lost, s),
        (_, got) => panic!("{flip}: stream {got:?}"),
    };
    assert_eq!(out.len(), k.stream.len(), "{flip}");
    for (i, b) in out.iter().enumerate() {
        let at = i as u64;
        let damaged = s
            .damaged
            .iter()
            .any(|d| (d.offset..d.offset + d.len).contains(&at));
        let want = if damaged { 0 } else { k.stream[i] };
        assert_eq!(*b, want, "{flip}: stream byte {i}");
    }
    // Exactly the segments that needed the damage are named.
    for (_, r) in &k.segments {
        let named = s
            .damaged
            .iter()
            .any(|d| d.offset < r.end && r.start < d.offset + d.len);
        assert_eq!(named, overlaps(r, lost), "{flip}: segment at {r:?}");
    }
    // Restored at offsets, containers in order, in passes of a few recipe
    // parts: the same bytes, the same ranges named for the same reasons.
    // Containers read whole, and run by run.
    for whole in [true, false] {
        let at = Positioned::default();
        let s_at = Repository::open_read_only(dir)
            .and_then(|repo| repo.restore_salvage_at_in(&k.name, &at, 40, whole))
            .unwrap_or_else(|e| panic!("{flip}: at offsets (whole {whole}): {e}"));
        assert_eq!(s_at, s, "{flip}: at offsets (whole {whole})");
        let bytes = at.0.into_inner().unwrap();
        assert!(bytes == out, "{flip}: bytes at offsets (whole {whole})");
    }
}

/// A target written at offsets, in memory. Bytes it grows past are 0xAA
/// until written, so a range left unwritten (damaged ranges must be
/// written as zeros) does not pass for zeros.
#[derive(Default)]
struct Positioned(std::sync::Mutex<Vec<u8>>);

impl WriteAt for Positioned {
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut v = self.0.lock().unwrap();
        let end = offset as usize + data.len();
        if v.len() < end {
            v.resize(end, 0xAA);
        }
        v[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
}

#[test]
fn a_flipped_byte_anywhere_costs_only_the_files_that_need_it_and_names_them() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, known) = setup(tmp.path());
    let flips = flips(&dir, &known);
    let containers = flips
        .iter()
        .filter(|f| f.0.starts_with("containers/"))
        .count();
    assert!(containers > 40, "{containers} flips in containers");
    // How many restores lost something, and how many were refused: the
    // flips must reach both.
    let (mut lossy, mut refused) = (0, 0);
    for (n, (object, at, costs)) in flips.iter().enumerate() {
        let file = dir.join(object);
        let good = fs::read(&file).unwrap();
        let mut bad = good.clone();
        bad[*at as usize] ^= 0x41;
        fs::write(&file, &bad).unwrap();
        let flip = format!("flip {n} at byte {at} of {object}");
        for (k, cost) in known.iter().zip(costs) {
            match cost {
                Cost::Refused(_) => refused += 1,
                Cost::Ranges(r) if !r.is_empty() => lossy += 1,
                Cost::Ranges(_) => {}
            }
            match k.tree {
                Some(_) => {
                    let target = tmp.path().join(format!("out-{n}-{}", k.name));
                    check_files(&dir, &target, k, cost, &flip);
                    let _ = fs::remove_dir_all(&target);
                }
                None => check_stream(&dir, k, cost, &flip),
            }
        }
        fs::write(&file, &good).unwrap();
    }
    eprintln!(
        "{} flips: {lossy} restores lost bytes, {refused} refused",
        flips.len()
    );
    assert!(
        lossy > 100 && refused > 10,
        "{lossy} lossy, {refused} refused"
    );
}

/// Every frame but those of one file damaged: restoring only that file
/// reads none of them, so it restores whole and nothing is named.
#[test]
fn include_of_an_intact_path_reads_no_frame_it_does_not_need() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, known) = setup(tmp.path());
    let one = &known[0];
    let tree = one.tree.as_ref().unwrap();
    let file = (tree.nodes.iter())
        .find(|n| n.path.ends_with(b"b/text2"))
        .unwrap();
    let range = file.offset..file.offset + file.size;
    let needed: BTreeSet<(u64, u32)> = (one.segments.iter())
        .filter(|(_, r)| overlaps(r, std::slice::from_ref(&range)))
        .map(|(s, _)| *s)
        .collect();
    let store = LocalDir::open(&dir).unwrap();
    let mut flipped = 0;
    for entry in fs::read_dir(dir.join("containers")).unwrap() {
        let path = entry.unwrap().path();
        let id = u64::from_str_radix(path.file_name().unwrap().to_str().unwrap(), 16).unwrap();
        let catalog = Catalog::read(&store, id).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let mut needed_frames = BTreeSet::new();
        for (i, e) in catalog.entries().iter().enumerate() {
            if needed.contains(&(id, i as u32)) {
                needed_frames.insert(e.location.offset);
            }
        }
        let mut done = BTreeSet::new();
        for e in catalog.entries() {
            let l = &e.location;
            if !needed_frames.contains(&l.offset) && done.insert(l.offset) {
                bytes[(l.offset + u64::from(l.stored_len) / 2) as usize] ^= 0x41;
                flipped += 1;
            }
        }
        fs::write(&path, bytes).unwrap();
    }
    assert!(flipped > 5, "{flipped} frames damaged");
    let repo = Repository::open_read_only(&dir).unwrap();
    let target = tmp.path().join("part");
    let options = RestoreOptions {
        include: vec![PathBuf::from(String::from_utf8(file.path.clone()).unwrap())],
        ..RestoreOptions::default()
    };
    let r = repo.restore_tree("one", &target, &options).unwrap();
    assert!(r.damaged.is_empty(), "{:?}", r.damaged);
    let have = fs::read(target.join(String::from_utf8(file.path.clone()).unwrap())).unwrap();
    assert!(have == one.stream[range.start as usize..range.end as usize]);
    // The whole backup names what it lost and still restores that file.
    let all = tmp.path().join("all");
    let r = repo
        .restore_tree("one", &all, &RestoreOptions::default())
        .unwrap();
    assert!(r.damaged.len() > 3, "{:?}", r.damaged);
    assert!(!r.damaged.iter().any(|d| d.path.ends_with("b/text2")));
}
