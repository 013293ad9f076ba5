//! One repository handle shared by many backups at once (the paper's one
//! server, many streams), and the one-writing-process rule: a second
//! writer is refused by name, readers are not.

use std::sync::Arc;

use dedup_store::{RepoError, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn options(segmenting: Segmenting) -> RepoOptions {
    RepoOptions {
        segmenting,
        container_target: 64 << 10,
        force: false,
        ..RepoOptions::default()
    }
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn concurrent_backups_on_one_handle_all_restore_and_share_segments() {
    assert_send_sync::<Repository>();
    for segmenting in [
        Segmenting::DEFAULT,
        Segmenting::FastCdc {
            min: 2048,
            avg: 4096,
            max: 16384,
        },
    ] {
        let tmp = tempfile::tempdir().unwrap();
        Repository::init_with(tmp.path(), options(segmenting)).unwrap();
        let repo = Arc::new(Repository::open(tmp.path()).unwrap());
        repo.set_recipe_part_segments(5);
        // Every stream mixes shared blocks with its own (4 KiB-aligned for
        // fixed segments, long enough for FastCDC to find cut points in),
        // so streams dedup against each other's containers while those are
        // being written.
        let shared: Arc<Vec<Vec<u8>>> = Arc::new((0..16).map(|i| random(64 << 10, i)).collect());
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let (repo, shared) = (repo.clone(), shared.clone());
                std::thread::spawn(move || {
                    let mut rng = StdRng::seed_from_u64(100 + t);
                    let mut made = Vec::new();
                    for b in 0..4 {
                        let mut s = Vec::new();
                        for _ in 0..rng.random_range(5..30) {
                            if rng.random_bool(0.7) {
                                s.extend_from_slice(&shared[rng.random_range(0..16)]);
                            } else {
                                s.extend_from_slice(&random(
                                    4096 * rng.random_range(1..3),
                                    rng.random(),
                                ));
                            }
                        }
                        let name = format!("t{t}-b{b}");
                        repo.backup_stream(&name, &format!("g{t}"), &s[..]).unwrap();
                        made.push((name, s));
                    }
                    made
                })
            })
            .collect();
        let made: Vec<(String, Vec<u8>)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let check = |repo: &Repository| {
            for (name, s) in &made {
                let mut out = Vec::new();
                repo.restore(name, &mut out).unwrap();
                assert!(out == *s, "{name} restored wrong");
            }
        };
        check(&repo);
        let stored: u64 = repo
            .list_backups()
            .unwrap()
            .iter()
            .map(|b| b.report.bytes_new)
            .sum();
        let logical: u64 = made.iter().map(|(_, s)| s.len() as u64).sum();
        assert!(
            stored < logical * 3 / 4,
            "little dedup with {segmenting:?}: {stored} of {logical}"
        );
        drop(repo);
        check(&Repository::open_read_only(tmp.path()).unwrap());
        check(&Repository::open(tmp.path()).unwrap());
    }
}

#[test]
fn writers_and_readers_side_by_side_and_a_reader_never_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let writer = Repository::init(tmp.path()).unwrap();
    writer
        .backup_stream("a", "g", &random(50_000, 1)[..])
        .unwrap();
    // No lock: a second writer works beside the first.
    let second = Repository::open(tmp.path()).unwrap();
    second
        .backup_stream("b", "g", &random(50_000, 2)[..])
        .unwrap();
    let reader = Repository::open_read_only(tmp.path()).unwrap();
    for (name, seed) in [("a", 1), ("b", 2)] {
        let mut out = Vec::new();
        reader.restore(name, &mut out).unwrap();
        assert_eq!(out, random(50_000, seed), "{name}");
    }
    let e = reader
        .backup_stream("c", "g", &b"x"[..])
        .expect_err("read-only");
    assert!(matches!(e, RepoError::ReadOnly), "{e}");
    assert!(matches!(
        reader.delete_backup("a"),
        Err(RepoError::ReadOnly)
    ));
    drop(writer);
    drop(second);
    Repository::open(tmp.path()).unwrap();
}

#[test]
fn two_sessions_racing_for_one_name_commit_once() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    let mut first = repo.begin_backup("same", "g").unwrap();
    let mut second = repo.begin_backup("same", "g").unwrap();
    first.append(&random(4096, 1)).unwrap();
    second.append(&random(4096, 2)).unwrap();
    first.commit().unwrap();
    let e = second.commit().expect_err("name taken");
    assert!(matches!(e, RepoError::BackupExists { .. }), "{e}");
    let mut out = Vec::new();
    repo.restore("same", &mut out).unwrap();
    assert_eq!(out, random(4096, 1));
}

#[test]
fn a_tree_is_committed_with_its_backup_and_deleted_with_it() {
    use dedup_store::tree::{Kind, Node, Tree};
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    let mut file = Node::new("f", Kind::File);
    file.size = 5000;
    let tree = Tree {
        stream_len: 5000,
        nodes: vec![file],
    };
    // A tree that does not decode, or describes other contents, is
    // refused before anything is committed.
    for bad in [b"tree bytes".to_vec(), {
        let mut t = tree.clone();
        t.stream_len = 4999;
        t.nodes[0].size = 4999;
        t.encode()
    }] {
        let mut s = repo.begin_backup("files", "g").unwrap();
        s.append(&random(5000, 3)).unwrap();
        let e = s.commit_with_tree(Some(&bad)).expect_err("a bad tree");
        assert!(e.to_string().contains("the tree of backup files"), "{e}");
    }
    assert!(repo.list_backups().unwrap().is_empty());
    let mut s = repo.begin_backup("files", "g").unwrap();
    s.append(&random(5000, 3)).unwrap();
    let bytes = tree.encode();
    let record = s.commit_with_tree(Some(&bytes)).unwrap();
    let object = record.tree.clone().expect("a tree");
    assert!(object.starts_with("trees/files-"), "{object}");
    assert_eq!(repo.backup("files").unwrap(), record);
    assert_eq!(std::fs::read(tmp.path().join(&object)).unwrap(), bytes);
    repo.delete_backup("files").unwrap();
    assert!(!tmp.path().join(&object).exists());
    // The recipe is the collection's to remove.
    assert!(tmp.path().join(&record.recipe).exists());
    repo.gc(&dedup_store::GcOptions::default()).unwrap();
    assert!(!tmp.path().join(&record.recipe).exists());
}

#[test]
fn reuse_takes_an_earlier_recipe_s_segments_only_if_their_catalog_confirms_them() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init(tmp.path()).unwrap();
    let data = random(100_000, 9);
    repo.backup_stream("parent", "g", &data[..]).unwrap();
    let (_, recipe) = repo.recipe("parent").unwrap();
    let mut s = repo.begin_backup("child", "g").unwrap();
    for r in &recipe.segments {
        assert!(s.reuse(*r).unwrap());
    }
    let mut wrong = recipe.segments[0];
    wrong.check ^= 1;
    assert!(!s.reuse(wrong).unwrap(), "a wrong fingerprint is refused");
    let mut gone = recipe.segments[0];
    gone.container += 1000;
    assert!(!s.reuse(gone).unwrap(), "a missing container is refused");
    let record = s.commit().unwrap();
    assert_eq!(record.report.bytes_new, 0);
    assert_eq!(record.report.bytes_in, data.len() as u64);
    let mut out = Vec::new();
    repo.restore("child", &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_session_finds_what_it_sealed_even_without_a_hook() {
    use dedup_store::index::{IndexConfig, SamplingRate};
    let tmp = tempfile::tempdir().unwrap();
    drop(Repository::init_with(tmp.path(), options(Segmenting::DEFAULT)).unwrap());
    let config = IndexConfig {
        max_rate: SamplingRate::from_log2_period(7).unwrap(),
        cache_entries: 0,
        ..IndexConfig::default()
    };
    let repo = Repository::open_sampled(tmp.path(), config).unwrap();
    let mut s = repo.begin_backup("a", "g").unwrap();
    let first: Vec<Vec<u8>> = (0..64).map(|i| random(4096, 500 + i)).collect();
    let mut stored = Vec::new();
    for b in &first {
        let (c, e, fp) = s.store(b).unwrap();
        stored.push((fp, (c, e)));
    }
    // Fill more than a container (64 KiB) so the first ones are sealed.
    for i in 0..64 {
        s.append(&random(4096, 900 + i)).unwrap();
    }
    // At R = 1/128 with no cache most of them have no hook; a server's
    // client names them as known all the same.
    for (fp, at) in &stored {
        assert_eq!(s.lookup(fp).unwrap(), Some(*at));
    }
    s.commit().unwrap();
}

/// A container one session sealed reaches the index once its put is
/// durable, seen by the session's next segment, not at its next seal or
/// commit: a concurrent backup then reuses its segments (before, streams
/// shorter than a container never saw each other's).
#[test]
fn a_sealed_container_serves_other_sessions_once_durable() {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init_with(tmp.path(), options(Segmenting::DEFAULT)).unwrap();
    let repo = Repository::open(tmp.path()).unwrap();
    let mut a = repo.begin_backup("a", "g").unwrap();
    let mut b = repo.begin_backup("b", "g").unwrap();
    // 80 KiB of random segments fill a 64 KiB container: it seals.
    let first = random(80 << 10, 1);
    for s in first.chunks(4096) {
        a.append(s).unwrap();
    }
    let fp = dedup_store::writer::HASH.fingerprint(&first[..4096]);
    let mut seen = false;
    for k in 0..500u64 {
        // `a` goes on, a segment at a time, far from filling its next
        // container; `b` asks for a's first segment.
        a.append(&random(4096, 1000 + k)).unwrap();
        if b.lookup(&fp).unwrap().is_some() {
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(seen, "b never saw a's sealed container");
    b.append(&first[..4096]).unwrap();
    assert_eq!(b.report().segments_duplicate, 1);
    let rb = b.commit().unwrap();
    assert_eq!(rb.report.bytes_new, 0);
    a.commit().unwrap();
    let mut out = Vec::new();
    repo.restore("b", &mut out).unwrap();
    assert!(out == first[..4096]);
}
