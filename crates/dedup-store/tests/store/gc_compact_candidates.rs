//! Compaction candidates are kept until compacted: a collection that
//! compacts nothing (`--compact-below 0`) or whose threshold a candidate
//! is not below leaves it for a later one with a higher threshold, which
//! compacts it; a candidate already found not worth it at a threshold is
//! not read again at that threshold.

use crate::gc_support;

use dedup_store::{GcOptions, RepoOptions, Repository, Segmenting};
use gc_support::*;
use rand::{rngs::StdRng, SeedableRng};

fn gc(repo: &Repository, compact_below: f64) -> dedup_store::GcReport {
    repo.gc(&GcOptions {
        compact_below,
        ..GcOptions::default()
    })
    .unwrap()
}

#[test]
fn candidates_left_by_a_collection_that_compacts_nothing_are_compacted_later() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let mut rng = StdRng::seed_from_u64(7);
    let shared = blocks(&mut rng, 10);
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 24 << 10,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(&dir, options).unwrap();
    // p's containers end up mostly dead once p is deleted: q keeps one
    // block of some of them.
    let p: Vec<u8> = (0..12)
        .flat_map(|i| shared[i % 10].iter().map(move |b| b ^ (i as u8 + 1)))
        .collect();
    let mut q = p[..4096].to_vec();
    q.extend_from_slice(&p[8 * 4096..9 * 4096]);
    repo.backup_stream("p", "p", &p[..]).unwrap();
    repo.backup_stream("q", "q", &q[..]).unwrap();
    gc(&repo, 0.5);
    repo.delete_backup("p").unwrap();

    let r = gc(&repo, 0.0);
    assert!(r.containers_compacted == 0, "{r:?}");
    // Found not below 1 %: kept, with the share found.
    let r = gc(&repo, 0.01);
    assert!(r.catalogs_read > 0 && r.containers_compacted == 0, "{r:?}");
    let r = gc(&repo, 0.01);
    assert!(r.catalogs_read == 0 && r.containers_compacted == 0, "{r:?}");
    // A higher threshold compacts them, and then they are done.
    let r = gc(&repo, 1.0);
    assert!(r.containers_compacted > 0, "{r:?}");
    let r = gc(&repo, 1.0);
    assert!(r.catalogs_read == 0 && r.containers_compacted == 0, "{r:?}");
    let mut out = Vec::new();
    repo.restore("q", &mut out).unwrap();
    assert!(out == q);
}
