//! The S3 object store and a repository in a bucket.
//!
//! The model test runs on the `object_store` crate's in-memory S3 stand-in
//! always, and with everything else here on a real S3 service when
//! `DEDUP_TEST_S3` names a bucket (`s3://BUCKET`, with the `AWS_*`
//! settings beside it): `scripts/test` starts SeaweedFS on loopback for it
//! (`scripts/s3-test-server`). Without one these tests say so and pass,
//! unless `DEDUP_REQUIRE_S3` is set, as it is in `scripts/test`.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use dedup_store::s3::S3Store;
use dedup_store::{Error, ObjectStore, RepoError, RepoLocation, Repository};
use proptest::prelude::*;

use crate::object_model;
use crate::s3_support;
use object_model::{model_step, op, store_step};
use s3_support::bucket_prefix;

fn s3_store(location: &RepoLocation) -> S3Store {
    let RepoLocation::S3 { bucket, prefix } = location else {
        panic!("{location} is not in a bucket");
    };
    S3Store::open(bucket, prefix).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn an_s3_store_behaves_like_a_map(ops in prop::collection::vec(op(), 1..40)) {
        let memory = Arc::new(object_store::memory::InMemory::new());
        let store = S3Store::over(memory, "some/prefix", "s3://memory/some/prefix".into()).unwrap();
        let mut model = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            let expected = model_step(&mut model, op, false);
            let got = store_step(&store, op);
            prop_assert_eq!(got, expected, "step {}: {:?}", i, op);
        }
    }
}

#[test]
fn a_real_s3_service_behaves_like_a_map() {
    let Some(location) = bucket_prefix("model") else {
        return;
    };
    let runner_config = proptest::test_runner::Config::with_cases(8);
    let mut runner = proptest::test_runner::TestRunner::new(runner_config);
    let n = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&prop::collection::vec(op(), 1..30), |ops| {
            let case = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let at: RepoLocation = format!("{location}/{case}").parse().unwrap();
            let store = s3_store(&at);
            let mut model = BTreeMap::new();
            for (i, op) in ops.iter().enumerate() {
                let expected = model_step(&mut model, op, false);
                let got = store_step(&store, op);
                prop_assert_eq!(got, expected, "step {}: {:?}", i, op);
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn racing_puts_of_one_name_leave_exactly_one_winner() {
    let Some(location) = bucket_prefix("race") else {
        return;
    };
    let store = Arc::new(s3_store(&location));
    for round in 0..4 {
        let name = format!("backups/b{round}");
        let outcomes: Vec<(u8, dedup_store::Result<()>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8u8)
                .map(|w| {
                    let (store, name) = (store.clone(), name.clone());
                    s.spawn(move || (w, store.put(&name, &[w; 1000])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<u8> = outcomes
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(w, _)| *w)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        for (w, r) in &outcomes {
            if *w != winners[0] {
                assert!(matches!(r, Err(Error::Exists { .. })), "writer {w}: {r:?}");
            }
        }
        assert_eq!(store.get(&name).unwrap(), vec![winners[0]; 1000]);
    }
}

#[test]
fn a_repository_in_a_bucket_backs_up_restores_collects_with_writers_side_by_side() {
    let Some(location) = bucket_prefix("repo") else {
        return;
    };
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 / 13) as u8).collect();
    let repo = Repository::init(&location).unwrap();
    repo.backup_stream("one", "g", Cursor::new(&data)).unwrap();

    // No lock: a second writer works beside the first, and readers too.
    let other = Repository::open(&location).unwrap();
    other
        .backup_stream("two", "g", Cursor::new(&data[1000..]))
        .unwrap();
    let reader = Repository::open_read_only(&location).unwrap();
    let mut out = Vec::new();
    reader.restore("one", &mut out).unwrap();
    assert!(out == data, "backup one restored differently");
    drop(other);

    repo.delete_backup("one").unwrap();
    let report = repo.gc(&Default::default()).unwrap();
    assert_eq!(report.backups, 1);
    let mut out = Vec::new();
    repo.restore("two", &mut out).unwrap();
    assert!(
        out == data[1000..],
        "backup two restored differently after gc"
    );
    drop(repo);
    let names = s3_store(&location).list("").unwrap();
    assert!(
        !names.iter().any(|n| n.starts_with("pins/")),
        "writers that closed leave no pins: {names:?}"
    );

    // A sibling prefix is another repository.
    let sibling: RepoLocation = format!("{location}x").parse().unwrap();
    assert!(matches!(
        Repository::open_read_only(&sibling),
        Err(RepoError::NotARepository { .. })
    ));
    assert!(matches!(
        Repository::init(&location),
        Err(RepoError::NotEmpty { .. })
    ));
}

/// `get_upto` and `get_tail_sized` (one request each on S3) answer what
/// `get_range`, `get_tail` and `size` do, at the ends of objects too; and
/// a sealed store over the bucket reads ranges and tails of objects of
/// several frames through them.
fn ranged_reads_with_sizes_agree(store: Arc<dyn ObjectStore>) {
    for (name, len) in [("e", 0usize), ("one", 1), ("some", 100)] {
        let bytes: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
        store.put(name, &bytes).unwrap();
        for offset in [0, 1, 50, 99, 100, 101] {
            for n in [0, 1, 7, 200] {
                match store.get_upto(name, offset, n) {
                    Ok((got, size)) => {
                        assert!(offset <= len as u64, "{name} {offset}+{n}");
                        assert_eq!(size, len as u64);
                        let end = (offset + n).min(len as u64) as usize;
                        assert_eq!(got, &bytes[offset as usize..end], "{name} {offset}+{n}");
                    }
                    Err(Error::OutOfRange { size, .. }) => {
                        assert!(offset > len as u64, "{name} {offset}+{n}");
                        assert_eq!(size, len as u64);
                    }
                    Err(e) => panic!("{name} {offset}+{n}: {e}"),
                }
            }
        }
        for n in [0, 1, 60, 100, 500] {
            let (tail, size) = store.get_tail_sized(name, n).unwrap();
            assert_eq!(size, len as u64);
            assert_eq!(tail, store.get_tail(name, n).unwrap(), "{name} tail {n}");
        }
    }
    use dedup_store::config::KeyedOf;
    use dedup_store::crypto::sealed::FRAME;
    use dedup_store::crypto::{MasterKey, SealedStore};
    let sealed = SealedStore::new(store, &MasterKey::random().unwrap(), KeyedOf::PlainDigest);
    let plain: Vec<u8> = (0..3 * FRAME as usize + 77)
        .map(|i| (i % 251) as u8)
        .collect();
    sealed.put("containers/0000000000000007", &plain).unwrap();
    let name = "containers/0000000000000007";
    for (offset, n) in [
        (0, 10),
        (FRAME - 3, 9),
        (2 * FRAME, FRAME + 77),
        (3 * FRAME + 70, 7),
    ] {
        let got = sealed.get_range(name, offset, n).unwrap();
        assert_eq!(got, &plain[offset as usize..(offset + n) as usize]);
    }
    assert!(sealed.get_range(name, 3 * FRAME + 70, 8).is_err());
    for n in [0, 48, FRAME, 2 * FRAME + 5, 10 * FRAME] {
        let tail = sealed.get_tail(name, n).unwrap();
        assert_eq!(tail, &plain[plain.len() - (n as usize).min(plain.len())..]);
    }
    assert_eq!(sealed.get(name).unwrap(), plain);
}

#[test]
fn ranged_reads_with_sizes_agree_in_memory() {
    let memory = Arc::new(object_store::memory::InMemory::new());
    let store = S3Store::over(memory, "p", "s3://memory/p".into()).unwrap();
    ranged_reads_with_sizes_agree(Arc::new(store));
}

#[test]
fn ranged_reads_with_sizes_agree_on_a_real_s3_service() {
    let Some(location) = bucket_prefix("upto") else {
        return;
    };
    ranged_reads_with_sizes_agree(Arc::new(s3_store(&location)));
}
