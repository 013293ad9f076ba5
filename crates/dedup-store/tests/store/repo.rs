//! Repository basics and dedup: init/open, backup and restore round trips,
//! what a second, changed or shifted backup stores.

use dedup_store::index::IndexConfig;
use dedup_store::{RepoError, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn restore(repo: &mut Repository, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let n = repo.restore(name, &mut out).unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

fn small_containers(segmenting: Segmenting) -> RepoOptions {
    RepoOptions {
        segmenting,
        container_target: 256 << 10,
        force: false,
        ..RepoOptions::default()
    }
}

#[test]
fn init_refuses_non_empty_and_open_refuses_foreign() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("stray"), b"x").unwrap();
    let e = Repository::init(&dir).err().expect("non-empty");
    assert!(matches!(e, RepoError::NotEmpty { .. }), "{e}");
    assert!(e.to_string().contains("repo"), "{e}");
    // Forced over a stray file, but never over an existing repository.
    let opts = RepoOptions {
        force: true,
        ..RepoOptions::default()
    };
    Repository::init_with(&dir, opts).unwrap();
    assert!(Repository::init_with(&dir, opts).is_err());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);

    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    let e = Repository::open(&foreign).err().expect("foreign");
    assert!(matches!(e, RepoError::NotARepository { .. }), "{e}");
    assert!(e.to_string().contains("foreign"), "{e}");
    let e = Repository::open(tmp.path().join("absent"))
        .err()
        .expect("absent");
    assert!(matches!(e, RepoError::NotARepository { .. }), "{e}");
}

#[test]
fn round_trip_names_groups_and_odd_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let mut repo = Repository::init(tmp.path().join("r")).unwrap();
    let lens = [0usize, 1, 4095, 4096, 4097, 3 * 4096 + 17, 300_000];
    for (i, &n) in lens.iter().enumerate() {
        let data = random(n, i as u64);
        let r = repo
            .backup_stream(&format!("b{i}"), "g", &data[..])
            .unwrap();
        assert_eq!(r.bytes_in, n as u64);
        assert_eq!(restore(&mut repo, &format!("b{i}")), data);
    }
    assert!(matches!(
        repo.backup_stream("b0", "g", &b""[..]),
        Err(RepoError::BackupExists { .. })
    ));
    for bad in ["", "a/b", ".x", "sp ace"] {
        assert!(matches!(
            repo.backup_stream(bad, "g", &b""[..]),
            Err(RepoError::BadName { .. })
        ));
        assert!(matches!(
            repo.backup_stream("ok", bad, &b""[..]),
            Err(RepoError::BadName { .. })
        ));
    }
    let listed: Vec<_> = repo.list_backups().unwrap();
    assert_eq!(listed.len(), lens.len());
    assert!(listed.iter().all(|b| b.group == "g"));
    drop(repo);
    let mut repo = Repository::open(tmp.path().join("r")).unwrap();
    assert_eq!(restore(&mut repo, "b6"), random(300_000, 6));
    repo.delete_backup("b6").unwrap();
    assert!(matches!(
        repo.restore("b6", Vec::new()),
        Err(RepoError::NoSuchBackup { .. })
    ));
    assert!(matches!(
        repo.delete_backup("b6"),
        Err(RepoError::NoSuchBackup { .. })
    ));
}

#[test]
fn same_stream_twice_stores_nothing_new() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init_with(tmp.path(), small_containers(Segmenting::DEFAULT)).unwrap();
    let data = random(2 << 20, 1);
    let first = repo.backup_stream("one", "g", &data[..]).unwrap();
    assert_eq!(first.segments_new, 512);
    assert!(first.containers_written > 1, "{first:?}");
    // Reopen so the second backup's dedup comes from the rebuilt index.
    drop(repo);
    let mut repo = Repository::open(tmp.path()).unwrap();
    let second = repo.backup_stream("two", "g", &data[..]).unwrap();
    eprintln!(
        "same stream: first {first:?}\nsecond {second:?} ratio {}",
        second.dedup_ratio()
    );
    assert_eq!(second.bytes_new, 0);
    assert_eq!(second.segments_duplicate, 512);
    assert_eq!(second.containers_written, 0);
    assert_eq!(restore(&mut repo, "two"), data);
}

#[test]
fn a_container_name_past_the_highest_id_is_damage_not_the_next_id() {
    // A hook cannot name an id with the top bit set: had the next id come
    // after this name, no later container would have hooks, and dedup
    // across backups would stop without a word.
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init_with(tmp.path(), small_containers(Segmenting::DEFAULT)).unwrap();
    drop(repo);
    std::fs::create_dir_all(tmp.path().join("containers")).unwrap();
    std::fs::write(tmp.path().join("containers/8000000000000000"), b"stray").unwrap();
    let data = random(1 << 20, 7);
    // The sampled index, as `dedup backup` opens a repository.
    let open = || Repository::open_sampled(tmp.path(), IndexConfig::default()).unwrap();
    let repo = open();
    assert!(repo
        .damaged_containers()
        .iter()
        .any(|c| c.ends_with("8000000000000000")));
    repo.backup_stream("one", "g", &data[..]).unwrap();
    drop(repo);
    let mut repo = open();
    let second = repo.backup_stream("two", "g", &data[..]).unwrap();
    assert_eq!(
        (second.bytes_new, second.containers_written),
        (0, 0),
        "{second:?}"
    );
    assert_eq!(restore(&mut repo, "two"), data);
}

#[test]
fn changed_blocks_store_about_those_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut repo =
        Repository::init_with(tmp.path(), small_containers(Segmenting::DEFAULT)).unwrap();
    let data = random(1 << 20, 2);
    repo.backup_stream("base", "g", &data[..]).unwrap();
    let mut changed = data.clone();
    for block in [3usize, 100, 200, 255] {
        changed[block * 4096 + 7] ^= 0xff;
    }
    let r = repo.backup_stream("changed", "g", &changed[..]).unwrap();
    eprintln!(
        "4 changed blocks of 256: {r:?} ratio {:.1}",
        r.dedup_ratio()
    );
    assert_eq!(r.segments_new, 4);
    assert_eq!(r.bytes_new, 4 * 4096);
    assert_eq!(restore(&mut repo, "changed"), changed);
    assert_eq!(restore(&mut repo, "base"), data);
}

#[test]
fn fastcdc_dedups_a_shifted_stream_and_fixed_does_not() {
    let data = random(1 << 20, 3);
    let mut shifted = b"a few inserted bytes".to_vec();
    shifted.extend_from_slice(&data);
    let mut new_fraction = Vec::new();
    for how in [Segmenting::DEFAULT, Segmenting::FASTCDC_4K] {
        let tmp = tempfile::tempdir().unwrap();
        let mut repo = Repository::init_with(tmp.path(), small_containers(how)).unwrap();
        repo.backup_stream("base", "g", &data[..]).unwrap();
        let r = repo.backup_stream("shifted", "g", &shifted[..]).unwrap();
        eprintln!("{how:?} shifted: {r:?} ratio {:.2}", r.dedup_ratio());
        assert_eq!(restore(&mut repo, "shifted"), shifted);
        drop(repo);
        // The segmenting is the repository's: reopening keeps it.
        let repo = Repository::open(tmp.path()).unwrap();
        assert_eq!(repo.config().segmenting, how);
        new_fraction.push(r.bytes_new as f64 / r.bytes_in as f64);
    }
    assert!(new_fraction[0] > 0.99, "fixed: {new_fraction:?}");
    assert!(new_fraction[1] < 0.05, "fastcdc: {new_fraction:?}");
}

/// A backup that died after its recipe but before its backup object (made
/// here by removing the backup object: the same files are left) does not
/// exist, and its name can be used again; its containers serve as dedup.
#[test]
fn a_backup_dead_before_its_commit_point_is_absent_and_retryable() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    let data = random(100_000, 4);
    repo.backup_stream("keep", "g", &b"kept"[..]).unwrap();
    repo.backup_stream("dies", "g", &data[..]).unwrap();
    drop(repo);
    std::fs::remove_file(tmp.path().join("backups/dies")).unwrap();

    let mut repo = Repository::open(tmp.path()).unwrap();
    let names: Vec<_> = repo
        .list_backups()
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["keep"]);
    assert!(matches!(
        repo.restore("dies", Vec::new()),
        Err(RepoError::NoSuchBackup { .. })
    ));
    assert_eq!(restore(&mut repo, "keep"), b"kept");
    let retry = repo.backup_stream("dies", "g", &data[..]).unwrap();
    assert_eq!(retry.bytes_new, 0, "{retry:?}");
    assert_eq!(restore(&mut repo, "dies"), data);
    // The orphaned recipe stays for a GC: keep's, the orphan, the retry's.
    assert_eq!(
        std::fs::read_dir(tmp.path().join("recipes"))
            .unwrap()
            .count(),
        3
    );
}

/// A handle opened to delete deletes backups (their trees with them; their
/// recipes are the collection's) and does nothing else: no backup, no collection, and it leaves no pin,
/// checkpoint or id reservation behind; a read-only handle still refuses.
#[test]
fn a_handle_opened_to_delete_deletes_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    for name in ["a", "b"] {
        repo.backup_stream(name, "g", &random(100_000, 3)[..])
            .unwrap();
    }
    drop(repo);
    let listing = |sub: &str| -> Vec<String> {
        match std::fs::read_dir(dir.path().join(sub)) {
            Ok(d) => d
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    };
    let before: Vec<Vec<String>> = ["ids", "pins", "index", "recipes", "trees"]
        .iter()
        .map(|s| listing(s))
        .collect();
    let reader = Repository::open_read_only(dir.path()).unwrap();
    assert!(matches!(
        reader.delete_backup("a"),
        Err(RepoError::ReadOnly)
    ));
    let deleter = Repository::open_to_delete(dir.path()).unwrap();
    assert!(matches!(
        deleter.begin_backup("c", "g"),
        Err(RepoError::ReadOnly)
    ));
    assert!(matches!(
        deleter.gc(&Default::default()),
        Err(RepoError::ReadOnly)
    ));
    deleter.delete_backup("a").unwrap();
    drop(deleter);
    let names: Vec<String> = Repository::open_read_only(dir.path())
        .unwrap()
        .list_backups()
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["b"]);
    for (i, sub) in ["ids", "pins", "index"].iter().enumerate() {
        assert_eq!(listing(sub), before[i], "{sub}/ changed");
    }
    // Its recipe stays for the next collection, which reads it once more
    // to take its references out of the counts (stream backups: no trees).
    assert_eq!(listing("recipes"), before[3]);
    assert_eq!(listing("trees"), before[4]);
    let mut out = Vec::new();
    Repository::open_read_only(dir.path())
        .unwrap()
        .restore("b", &mut out)
        .unwrap();
    assert_eq!(out, random(100_000, 3));
}
