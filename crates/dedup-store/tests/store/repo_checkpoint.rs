//! The repository's index checkpoint: a writing handle leaves one behind,
//! the next sampled open starts from it and reads only newer catalogs,
//! and a damaged or stale one costs a rebuild, never data.

use dedup_store::index::IndexConfig;
use dedup_store::{RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn init(dir: &std::path::Path) {
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 64 << 10,
        force: false,
        ..RepoOptions::default()
    };
    drop(Repository::init_with(dir, options).unwrap());
}

fn sampled(dir: &std::path::Path) -> Repository {
    let config = IndexConfig {
        cache_entries: 4096,
        ..IndexConfig::default()
    };
    Repository::open_sampled(dir, config).unwrap()
}

fn checkpoints(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("index"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Flip a byte of container `id`'s catalog trailer, so reading its catalog
/// fails: an open that reads it lists it as damaged.
fn damage_catalog(dir: &std::path::Path, id: u64) {
    let p = dir.join(format!("containers/{id:016x}"));
    let mut b = std::fs::read(&p).unwrap();
    let n = b.len();
    b[n - 5] ^= 0x40;
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, b).unwrap();
}

#[test]
fn a_sampled_open_starts_from_the_checkpoint_and_reads_only_newer_catalogs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    let data = random(1 << 20, 1);
    {
        let repo = sampled(dir);
        repo.backup_stream("a", "g", &data[..]).unwrap();
    }
    let saved = checkpoints(dir);
    assert_eq!(saved.len(), 1, "{saved:?}");
    // Container 0 is covered by the checkpoint: an open that reads its
    // catalog would list it as damaged.
    damage_catalog(dir, 0);
    {
        let repo = sampled(dir);
        assert!(
            repo.damaged_containers().is_empty(),
            "read a covered catalog"
        );
        let ram = repo.index_ram().unwrap();
        assert_eq!(ram.fingerprints, 256, "{ram:?}");
        // The hooks still find the rest of the stream; the segments of
        // container 0 (its catalog unreadable now) are stored again.
        let r = repo.backup_stream("b", "g", &data[..]).unwrap();
        assert!(r.bytes_new < data.len() as u64 / 4, "{r:?}");
        repo.backup_stream("c", "g", &random(100_000, 2)[..])
            .unwrap();
        let mut out = Vec::new();
        repo.restore("b", &mut out).unwrap();
        assert!(out == data);
    }
    // One checkpoint, covering the newer containers too.
    let newer = checkpoints(dir);
    assert_eq!(newer.len(), 1, "{newer:?}");
    assert_ne!(newer, saved);
}

#[test]
fn a_damaged_or_missing_checkpoint_costs_a_rebuild_not_data() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    let data = random(600_000, 3);
    drop({
        let repo = sampled(dir);
        repo.backup_stream("a", "g", &data[..]).unwrap();
        repo
    });
    let [cp] = &checkpoints(dir)[..] else {
        panic!("one checkpoint")
    };
    let path = dir.join("index").join(cp);
    let mut b = std::fs::read(&path).unwrap();
    b[40] ^= 1;
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, &b).unwrap();
    for round in 0..2 {
        let repo = sampled(dir);
        let r = repo
            .backup_stream(&format!("again{round}"), "g", &data[..])
            .unwrap();
        assert_eq!(r.bytes_new, 0, "round {round}: {r:?}");
        drop(repo);
        // Second round: no checkpoint at all.
        std::fs::remove_dir_all(dir.join("index")).unwrap();
    }
}

#[test]
fn no_checkpoint_is_taken_while_a_backup_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    let repo = sampled(dir);
    let mut s = repo.begin_backup("a", "g").unwrap();
    s.append(&random(4096, 4)).unwrap();
    assert!(!repo.save_index().unwrap());
    s.commit().unwrap();
    assert!(repo.save_index().unwrap());
    // A read-only handle never writes one.
    let before = checkpoints(dir);
    drop(Repository::open_read_only(dir).unwrap());
    assert_eq!(checkpoints(dir), before);
}

/// A backup of what is stored already adds no hook: the handle leaves the
/// checkpoint it opened from as it was (no put, delete, put again and
/// listing, four requests of a bucket); one that stored something new
/// writes a new one.
#[test]
fn an_unchanged_index_is_not_saved_again() {
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    let data = random(1 << 20, 7);
    let repo = sampled(dir);
    repo.backup_stream("a", "g", &data[..]).unwrap();
    assert!(repo.save_index().unwrap());
    assert!(!repo.save_index().unwrap(), "saved twice with nothing new");
    drop(repo);
    let [only] = &checkpoints(dir)[..] else {
        panic!("one checkpoint: {:?}", checkpoints(dir))
    };
    let inode = |name: &str| {
        std::fs::metadata(dir.join("index").join(name))
            .unwrap()
            .ino()
    };
    let before = inode(only);
    let repo = sampled(dir);
    repo.backup_stream("b", "g", &data[..]).unwrap();
    drop(repo);
    assert_eq!(checkpoints(dir), std::slice::from_ref(only));
    assert_eq!(inode(only), before, "the checkpoint was written again");
    // New data: a new checkpoint, which the next open starts from.
    let repo = sampled(dir);
    repo.backup_stream("c", "g", &random(1 << 20, 8)[..])
        .unwrap();
    drop(repo);
    let after = checkpoints(dir);
    assert_eq!(after.len(), 1);
    assert!(after[0] != *only || inode(&after[0]) != before);
    let repo = sampled(dir);
    for (name, seed) in [("a", 7), ("b", 7), ("c", 8)] {
        let mut out = Vec::new();
        repo.restore(name, &mut out).unwrap();
        assert!(out == random(1 << 20, seed), "{name}");
    }
}

#[test]
fn container_ids_are_never_handed_out_twice_after_a_collection() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init(dir);
    {
        let repo = sampled(dir);
        repo.backup_stream("a", "g", &random(300_000, 5)[..])
            .unwrap();
    }
    let highest = |dir: &std::path::Path| {
        std::fs::read_dir(dir.join("containers"))
            .unwrap()
            .map(|e| {
                u64::from_str_radix(&e.unwrap().file_name().into_string().unwrap(), 16).unwrap()
            })
            .max()
    };
    let before = highest(dir).expect("containers");
    // Everything is deleted and collected by an exact-index handle, which
    // leaves the old checkpoint; the next container must not take an old id.
    {
        let repo = Repository::open(dir).unwrap();
        repo.delete_backup("a").unwrap();
        repo.gc(&dedup_store::GcOptions::default()).unwrap();
    }
    assert_eq!(highest(dir), None, "gc left containers");
    let repo = Repository::open(dir).unwrap();
    repo.backup_stream("b", "g", &random(100_000, 6)[..])
        .unwrap();
    assert!(highest(dir).unwrap() > before);
}
