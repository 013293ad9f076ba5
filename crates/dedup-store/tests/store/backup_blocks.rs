//! Backups of a block source by its fingerprints (issue 39), against a
//! plain model of the device: random writes, trims and chunks without a
//! fingerprint, backed up again and again with deletes and collections
//! between; every backup restores as the device's image at that instant,
//! and only chunks the repository lacked were read. A chunk whose bytes do
//! not match its recorded fingerprint stops the backup, named, with
//! nothing committed; a repository whose segments the device's chunks
//! cannot be is backed up by reading, exactly.

use crate::blocks_model;
use crate::blocks_support;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use blocks_model::{Fault, Model, REGION, REGIONS};
use blocks_support::{content, encrypted, options, BS};
use dedup_common::fingerprint::HashAlgo;
use dedup_store::backup_blocks::BlocksReport;
use dedup_store::config::KeyedOf;
use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::{CheckOptions, GcOptions, RepoError, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, Rng, SeedableRng};

fn restore(repo: &Repository, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    repo.restore(name, &mut out).unwrap();
    out
}

fn backup(repo: &Repository, name: &str, model: &Model) -> BlocksReport {
    let mut last = 0;
    let (_, report) = repo
        .backup_blocks(name, "dev", model, &mut |done| {
            assert!(done > last);
            last = done;
        })
        .unwrap();
    assert_eq!(last, model.blocks.len() as u64, "progress reaches the end");
    report
}

/// Blocks `range` of `model` written with unique contents, recorded.
fn unique(model: &mut Model, range: std::ops::Range<usize>, rng: &mut StdRng) {
    for block in range {
        model.write(block, content(rng, 1 << 40), true);
    }
}

#[test]
fn backups_by_fingerprint_restore_the_image_and_read_only_what_is_new() {
    for seed in 0..4u64 {
        let tmp = tempfile::tempdir().unwrap();
        // The last in an encrypted repository: the device's plain
        // fingerprints name its keyed ones.
        let sealed = seed == 3;
        let _p = sealed.then(|| for_this_thread(b"device backups"));
        let how = match sealed {
            true => encrypted(Segmenting::Fixed { size: 4096 }),
            false => options(Segmenting::Fixed { size: 4096 }),
        };
        let repo = Repository::init_with(tmp.path(), how).unwrap();
        assert_eq!(repo.is_encrypted(), sealed);
        // Parents of many parts (a part's containers held as it loads).
        if seed == 1 {
            repo.set_recipe_part_segments(300);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        // Three steps of blocks and a part of one.
        let mut model = Model::new(3 * 1024 + 300, BS);
        let mut live: Vec<(String, Vec<u8>)> = Vec::new();
        for round in 0..6 {
            for _ in 0..rng.random_range(1..2000) {
                let block = rng.random_range(0..model.blocks.len());
                match rng.random_range(0..20) {
                    0 | 1 => model.blocks[block] = None,
                    2 | 3 => model.write(block, content(&mut rng, 5000), false),
                    // A chunk of zeros the device stored (mapped).
                    4 => model.write(block, vec![0; BS], true),
                    _ => model.write(block, content(&mut rng, 5000), true),
                }
            }
            // What the repository holds through its live backups.
            let stored: HashSet<Vec<u8>> = live
                .iter()
                .flat_map(|(_, image)| image.chunks(BS).map(<[u8]>::to_vec))
                .collect();
            let unknown = model.unknown();
            let new_known = (model.blocks.iter().flatten())
                .filter(|(bytes, fp)| fp.is_some() && !stored.contains(bytes))
                .map(|(bytes, _)| bytes)
                .collect::<HashSet<_>>()
                .len();
            let name = format!("dev-{round}");
            model.reads.store(0, Ordering::Relaxed);
            let report = backup(&repo, &name, &model);
            assert!(report.by_fingerprint, "{report:?}");
            assert_eq!(report.blocks_read, model.reads.load(Ordering::Relaxed));
            assert!(
                report.blocks_read <= (unknown + new_known) as u64,
                "seed {seed} round {round}: read {} blocks, {unknown} without a fingerprint and {} new",
                report.blocks_read,
                new_known
            );
            let zero = model.blocks.iter().filter(|b| b.is_none()).count() as u64;
            assert_eq!(report.zero_blocks, zero);
            live.push((name, model.image()));
            for (name, image) in &live {
                assert!(
                    restore(&repo, name) == *image,
                    "seed {seed} round {round}: {name}"
                );
            }
            // Drop the oldest now and then, and collect.
            if round % 2 == 1 {
                let (name, _) = live.remove(0);
                repo.delete_backup(&name).unwrap();
                repo.gc(&GcOptions::default()).unwrap();
            }
        }
        // Unchanged: nothing read at all.
        model.reads.store(0, Ordering::Relaxed);
        let report = backup(&repo, "again", &model);
        assert_eq!(report.blocks_read, model.unknown() as u64);
        // Every block with a fingerprint taken from the newest backup of
        // the group without a lookup (zero blocks name the zero segment).
        assert_eq!(report.parent.as_deref(), Some("dev-5"));
        let known = model.blocks.iter().flatten().count() - model.unknown();
        assert_eq!(report.blocks_from_parent, known as u64);
        assert!(restore(&repo, "again") == model.image());
        let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
        assert!(check.is_clean(), "{check:?}");
    }
}

#[test]
fn a_chunk_that_does_not_match_its_fingerprint_stops_the_backup_by_name() {
    a_chunk_that_does_not_match(options(Segmenting::Fixed { size: 4096 }));
    let _p = for_this_thread(b"device backups");
    a_chunk_that_does_not_match(encrypted(Segmenting::Fixed { size: 4096 }));
}

fn a_chunk_that_does_not_match(how: RepoOptions) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init_with(tmp.path(), how).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = Model::new(2000, BS);
    unique(&mut model, 0..1500, &mut rng);
    backup(&repo, "good", &model);
    let image = model.image();
    // Block 1700: new bytes, and its metadata names other bytes (a chunk
    // damaged on disk after it was written).
    model.write(1700, content(&mut rng, 1 << 40), true);
    let lie = HashAlgo::Blake3.fingerprint(&content(&mut rng, 1 << 40));
    model.blocks[1700].as_mut().unwrap().1 = Some(lie);
    let e = repo
        .backup_blocks("bad", "dev", &model, &mut |_| {})
        .expect_err("refused");
    assert!(matches!(e, RepoError::SourceMismatch { .. }), "{e}");
    assert!(e.to_string().contains("model block 1700"), "{e}");
    assert!(e.to_string().contains("nothing was committed"), "{e}");
    let names: Vec<String> = (repo.list_backups().unwrap().into_iter())
        .map(|b| b.name)
        .collect();
    assert_eq!(names, ["good"]);
    // The lie was stored under no name: an honest device with those bytes
    // under the fingerprint of the lie's bytes is not served them.
    assert!(restore(&repo, "good") == image);
    let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(check.is_clean(), "{check:?}");
    // Repaired (the right fingerprint), it backs up.
    let bytes = model.blocks[1700].as_ref().unwrap().0.clone();
    model.write(1700, bytes, true);
    backup(&repo, "repaired", &model);
    assert!(restore(&repo, "repaired") == model.image());
}

#[test]
fn a_repository_the_chunks_cannot_name_is_backed_up_by_reading() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let fill = |model: &mut Model, rng: &mut StdRng| {
        for block in 0..model.blocks.len() {
            if rng.random_range(0..4) > 0 {
                let mut bytes = vec![0u8; model.block_size];
                for piece in bytes.chunks_mut(BS) {
                    piece.copy_from_slice(&content(rng, 300));
                }
                model.write(block, bytes, true);
            }
        }
    };
    let fastcdc =
        Repository::init_with(tmp.path().join("cdc"), options(Segmenting::fastcdc(8192))).unwrap();
    let fixed8k = Repository::init_with(
        tmp.path().join("8k"),
        options(Segmenting::Fixed { size: 8192 }),
    )
    .unwrap();
    let _p = for_this_thread(b"device backups");
    // Encrypted as builds before config version 3 made them.
    let keyed_bytes = Repository::init_with(
        tmp.path().join("enc"),
        RepoOptions {
            keyed_of: KeyedOf::Bytes,
            ..encrypted(Segmenting::Fixed { size: 4096 })
        },
    )
    .unwrap();
    for (repo, why) in [
        (&fastcdc, "content-defined"),
        (&fixed8k, "segments 8192"),
        (&keyed_bytes, "keyed over segments' bytes"),
    ] {
        let mut model = Model::new(2500, BS);
        fill(&mut model, &mut rng);
        let report = backup(repo, "img", &model);
        assert!(!report.by_fingerprint);
        let because = report.read_because.clone().unwrap();
        assert!(because.contains(why), "{because}");
        assert_eq!(report.blocks_read, 2500);
        assert_eq!(model.reads.load(Ordering::Relaxed), 2500);
        assert!(restore(repo, "img") == model.image(), "{why}");
    }
    // A device of 8 KiB chunks into the 8 KiB repository: by fingerprint.
    let mut model = Model::new(600, 8192);
    fill(&mut model, &mut rng);
    let report = backup(&fixed8k, "eight", &model);
    assert!(report.by_fingerprint, "{report:?}");
    assert!(restore(&fixed8k, "eight") == model.image());
}

/// A source that fails a read: the backup fails naming the device and
/// commits nothing, by fingerprint and read whole; one that panics fails
/// it with an error; one interrupted is read again, and the image is exact.
#[test]
fn a_source_that_fails_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let fixed = Repository::init_with(
        tmp.path().join("fixed"),
        options(Segmenting::Fixed { size: 4096 }),
    )
    .unwrap();
    let cdc =
        Repository::init_with(tmp.path().join("cdc"), options(Segmenting::fastcdc(8192))).unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let mut model = Model::new(2600, BS);
    for block in 0..2600 {
        if rng.random_range(0..5) > 0 {
            model.write(block, content(&mut rng, 1 << 40), true);
        }
    }
    for repo in [&fixed, &cdc] {
        for fault in [Fault::Fails, Fault::Panics] {
            *model.fault.lock().unwrap() = Some(fault);
            let e = repo
                .backup_blocks("broken", "dev", &model, &mut |_| {})
                .expect_err("a failed read");
            let text = e.to_string();
            assert!(
                text.contains("the device for backup broken"),
                "{fault:?}: {text}"
            );
            assert!(repo.list_backups().unwrap().is_empty(), "{fault:?}");
        }
        *model.fault.lock().unwrap() = Some(Fault::Interrupted);
        let (_, report) = repo
            .backup_blocks("whole", "dev", &model, &mut |_| {})
            .unwrap();
        assert!(model.fault.lock().unwrap().is_none(), "the fault was met");
        assert!(restore(repo, "whole") == model.image(), "{report:?}");
    }
}

/// The parent deleted and collected, by another handle, while a backup
/// that takes blocks from it runs: what it took stays (held), what it had
/// not is read again, and the backup restores exactly.
#[test]
fn a_collection_beside_a_device_backup_takes_nothing_it_holds() {
    for compact_below in [0.0, 0.99] {
        let tmp = tempfile::tempdir().unwrap();
        let repo =
            Repository::init_with(tmp.path(), options(Segmenting::Fixed { size: 4096 })).unwrap();
        repo.set_recipe_part_segments(500);
        let mut rng = StdRng::seed_from_u64(33);
        let mut model = Model::new(4 * 1024, BS);
        for block in 0..model.blocks.len() {
            model.write(block, content(&mut rng, 1 << 40), true);
        }
        backup(&repo, "parent", &model);
        for block in (0..model.blocks.len()).step_by(7) {
            model.write(block, content(&mut rng, 1 << 40), true);
        }
        let other = Arc::new(Mutex::new(Repository::open(tmp.path()).unwrap()));
        let beside = other.clone();
        model.on_map = Some(Box::new(move |first| {
            if first == 2 * 1024 {
                let other = beside.lock().unwrap();
                other.delete_backup("parent").unwrap();
                let opts = GcOptions {
                    compact_below,
                    ..GcOptions::default()
                };
                other.gc(&opts).unwrap();
            }
        }));
        let report = backup(&repo, "child", &model);
        assert!(report.blocks_from_parent > 0, "{report:?}");
        assert!(restore(&repo, "child") == model.image());
        let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
        assert!(check.is_clean(), "{check:?}");
        drop(other);
    }
}

/// A device grown since its last backup: that backup is still the parent
/// for the blocks it covers, and the grown image restores exactly.
#[test]
fn a_grown_device_keeps_its_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let repo =
        Repository::init_with(tmp.path(), options(Segmenting::Fixed { size: 4096 })).unwrap();
    let mut rng = StdRng::seed_from_u64(44);
    let mut model = Model::new(1500, BS);
    unique(&mut model, 0..1500, &mut rng);
    backup(&repo, "small", &model);
    model.blocks.resize(2600, None);
    unique(&mut model, 1500..2000, &mut rng);
    model.reads.store(0, Ordering::Relaxed);
    let report = backup(&repo, "grown", &model);
    assert_eq!(report.parent.as_deref(), Some("small"));
    assert_eq!(report.blocks_from_parent, 1500);
    assert_eq!(report.blocks_read, 500);
    assert!(restore(&repo, "grown") == model.image());
}

/// Changed-block tracking: a backup whose parent recorded the device's
/// mark walks only the regions changed since (the others taken from the
/// parent), and every backup restores exactly; tracking reset (a crash,
/// a repair) or carrying another mark (a damaged or foreign file) walks
/// everything and is exact all the same.
#[test]
fn tracked_changes_are_all_a_backup_walks_and_a_lost_tracking_walks_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let repo =
        Repository::init_with(tmp.path(), options(Segmenting::Fixed { size: 4096 })).unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let mut model = Model::new((REGIONS * REGION) as usize, BS);
    model.tracking = Some(Mutex::new(None));
    unique(&mut model, 0..3000, &mut rng);
    let first = backup(&repo, "t0", &model);
    assert_eq!(first.blocks_unwalked, 0, "no parent, no tracking yet");
    assert!(first.tracking);
    for round in 1..10 {
        // Changes in two regions at most.
        model.change_two_regions(&mut rng, REGIONS, |rng| content(rng, 5000));
        let lost = match round % 4 {
            // A crash or a repair: untracked.
            1 => {
                model.untrack();
                true
            }
            // A damaged or foreign file: another mark.
            2 => {
                model.foreign_mark();
                true
            }
            _ => false,
        };
        let changed = {
            let t = model.tracking.as_ref().unwrap().lock().unwrap();
            t.as_ref().map_or(0, |(_, c)| c.len() as u64)
        };
        let name = format!("t{round}");
        let report = backup(&repo, &name, &model);
        assert!(restore(&repo, &name) == model.image(), "round {round}");
        assert!(report.tracking);
        if lost {
            assert_eq!(
                report.blocks_unwalked, 0,
                "round {round}: walked everything"
            );
        } else {
            assert_eq!(
                report.blocks_unwalked,
                (REGIONS - changed) * REGION,
                "round {round}: only the changed regions walked"
            );
        }
        if round == 5 {
            repo.delete_backup("t0").unwrap();
            repo.gc(&GcOptions::default()).unwrap();
        }
    }
    let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(check.is_clean(), "{check:?}");
}
