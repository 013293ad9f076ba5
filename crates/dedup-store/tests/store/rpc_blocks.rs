//! A block device backed up through `dedup store serve` by its
//! fingerprints (issue 39), in the clear and encrypted, against the plain
//! model device of `backup_blocks.rs`: each backup restores as the
//! device's image, and only the chunks the server lacked (or the device
//! kept no fingerprint of) were read. A chunk whose bytes do not match its
//! recorded fingerprint stops the backup by name with nothing committed;
//! a repository the chunks cannot name gets the image read whole.

use crate::blocks_model;
use crate::blocks_support;
use crate::rpc_support;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use blocks_model::{Model, REGION, REGIONS};
use blocks_support::{content, encrypted, options, BS};
use dedup_common::fingerprint::HashAlgo;
use dedup_store::backup_blocks::BlocksReport;
use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::rpc::protocol::{Call, Reply};
use dedup_store::rpc::{Client, ServerLimits};
use dedup_store::{CheckOptions, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, Rng, SeedableRng};
use rpc_support::{begin, Running};

fn serve(dir: &Path, how: RepoOptions) -> Running {
    let repo = Repository::init_with(dir.join("repo"), how).unwrap();
    repo.set_recipe_part_segments(300);
    Running::serving(repo, dir, ServerLimits::default())
}

fn backup(c: &Client, name: &str, model: &Model) -> BlocksReport {
    let last = std::sync::atomic::AtomicU64::new(0);
    let (b, report) = c
        .backup_blocks(name, "dev", model, &|done| {
            assert!(done > last.swap(done, Ordering::Relaxed));
        })
        .unwrap();
    assert_eq!(
        last.into_inner(),
        model.blocks.len() as u64,
        "progress reaches the end"
    );
    assert_eq!(
        b.report.bytes_in,
        (model.blocks.len() * model.block_size) as u64
    );
    report
}

fn restored(c: &Client, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let salvage = c.restore(name, &mut out).unwrap();
    assert!(salvage.damaged.is_empty(), "{salvage:?}");
    out
}

/// Random writes (most recorded, some not, some of zeros) and trims.
fn churn(model: &mut Model, rng: &mut StdRng, n: usize) {
    for _ in 0..n {
        let block = rng.random_range(0..model.blocks.len());
        match rng.random_range(0..20) {
            0 | 1 => model.trim(block),
            2 | 3 => model.write(block, content(rng, 4000), false),
            4 => model.write(block, vec![0; BS], true),
            _ => model.write(block, content(rng, 4000), true),
        }
    }
}

#[test]
fn a_device_through_a_server_is_backed_up_by_its_fingerprints() {
    for (seed, sealed) in [(1u64, false), (2, true)] {
        let _p = sealed.then(|| for_this_thread(b"served devices"));
        let dir = tempfile::tempdir().unwrap();
        let how = match sealed {
            true => encrypted(Segmenting::Fixed { size: 4096 }),
            false => options(Segmenting::Fixed { size: 4096 }),
        };
        let server = serve(dir.path(), how);
        let c = server.client();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut model = Model::new(2 * 1024 + 300, BS);
        let mut stored: HashSet<Vec<u8>> = HashSet::new();
        let mut live = Vec::new();
        for round in 0..4 {
            churn(&mut model, &mut rng, if round == 0 { 3000 } else { 400 });
            // Contents the device names that the repository lacks: each
            // read once at most.
            let new_known = (model.blocks.iter().flatten())
                .filter(|(bytes, fp)| fp.is_some() && !stored.contains(bytes))
                .map(|(bytes, _)| bytes.clone())
                .collect::<HashSet<_>>()
                .len();
            let unknown = model.unknown();
            model.reads.store(0, Ordering::Relaxed);
            let name = format!("dev-{round}");
            let report = backup(&c, &name, &model);
            assert!(report.by_fingerprint, "{report:?}");
            assert_eq!(report.blocks_read, model.reads.load(Ordering::Relaxed));
            assert!(
                report.blocks_read <= (unknown + new_known) as u64,
                "sealed {sealed} round {round}: read {} blocks, {unknown} unnamed and {new_known} new",
                report.blocks_read
            );
            let zero = model.blocks.iter().filter(|b| b.is_none()).count() as u64;
            assert_eq!(report.zero_blocks, zero);
            let image = model.image();
            stored.extend(image.chunks(BS).map(<[u8]>::to_vec));
            live.push((name, image));
            for (name, image) in &live {
                assert!(restored(&c, name) == *image, "sealed {sealed}: {name}");
            }
        }
        // Nothing changed: only the unnamed blocks are read.
        model.reads.store(0, Ordering::Relaxed);
        let report = backup(&c, "again", &model);
        assert_eq!(report.blocks_read, model.unknown() as u64);
        drop(c);
        server.shut();
        let repo = Repository::open_read_only(dir.path().join("repo")).unwrap();
        assert_eq!(repo.is_encrypted(), sealed);
        let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
        assert!(check.is_clean(), "{check:?}");
    }
}

#[test]
fn a_chunk_that_does_not_match_its_fingerprint_stops_a_served_backup_by_name() {
    a_chunk_that_does_not_match(options(Segmenting::Fixed { size: 4096 }));
    let _p = for_this_thread(b"served devices");
    a_chunk_that_does_not_match(encrypted(Segmenting::Fixed { size: 4096 }));
}

fn a_chunk_that_does_not_match(how: RepoOptions) {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), how);
    let c = server.client();
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = Model::new(2000, BS);
    for block in 0..1500 {
        model.write(block, content(&mut rng, 1 << 40), true);
    }
    backup(&c, "good", &model);
    let image = model.image();
    model.write(1700, content(&mut rng, 1 << 40), true);
    let lie = HashAlgo::Blake3.fingerprint(&content(&mut rng, 1 << 40));
    model.blocks[1700].as_mut().unwrap().1 = Some(lie);
    let e = c
        .backup_blocks("bad", "dev", &model, &|_| {})
        .expect_err("refused");
    assert!(e.to_string().contains("model block 1700"), "{e}");
    assert!(e.to_string().contains("nothing was committed"), "{e}");
    let names: Vec<String> = c.list().unwrap().into_iter().map(|b| b.name).collect();
    assert_eq!(names, ["good"]);
    assert!(restored(&c, "good") == image);
    // The same client goes on: repaired, it backs up.
    let bytes = model.blocks[1700].as_ref().unwrap().0.clone();
    model.write(1700, bytes, true);
    backup(&c, "repaired", &model);
    assert!(restored(&c, "repaired") == model.image());
}

#[test]
fn a_repository_the_chunks_cannot_name_gets_the_image_through_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), options(Segmenting::fastcdc(8192)));
    let c = server.client();
    let mut rng = StdRng::seed_from_u64(11);
    let mut model = Model::new(1500, BS);
    churn(&mut model, &mut rng, 2000);
    let report = backup(&c, "img", &model);
    assert!(!report.by_fingerprint);
    let because = report.read_because.clone().unwrap();
    assert!(because.contains("content-defined"), "{because}");
    assert_eq!(report.blocks_read, 1500);
    assert!(restored(&c, "img") == model.image());
}

/// Changed-block tracking through a server: regions unchanged since the
/// parent are taken from it without a walk, a lost tracking walks
/// everything, and marks set through the server and beside the
/// repository count for each other. Tracking that lies (a region past
/// the parent's end called unchanged) makes the server refuse the parent,
/// and the backup is made again walking every block, exactly.
#[test]
fn tracked_changes_are_all_a_served_backup_walks() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), options(Segmenting::Fixed { size: 4096 }));
    let c = server.client();
    let mut rng = StdRng::seed_from_u64(21);
    let mut model = Model::new((REGIONS * REGION) as usize, BS);
    model.tracking = Some(Mutex::new(None));
    for block in 0..3000 {
        model.write(block, content(&mut rng, 1 << 40), true);
    }
    let first = backup(&c, "t0", &model);
    assert_eq!(first.blocks_unwalked, 0, "no parent, no tracking yet");
    assert!(first.tracking);
    for round in 1..9 {
        model.change_two_regions(&mut rng, REGIONS, |rng| content(rng, 5000));
        let lost = match round % 4 {
            // A crash or a repair: untracked.
            1 => {
                model.untrack();
                true
            }
            // A damaged or foreign file: another mark, so the parent's
            // does not count.
            2 => {
                model.foreign_mark();
                true
            }
            // A newer backup in the group that is not this device's (a
            // stream, no mark): the parent now, and nothing is taken.
            3 if round == 7 => {
                // Backup times are in seconds: newer by one at least.
                std::thread::sleep(std::time::Duration::from_millis(1100));
                let other = vec![7u8; 3 * REGION as usize * BS];
                let opts = dedup_store::rpc::BackupOptions::default();
                c.backup_stream("other", "dev", &other[..], None, &opts, &|_| {})
                    .unwrap();
                true
            }
            _ => false,
        };
        let changed = {
            let t = model.tracking.as_ref().unwrap().lock().unwrap();
            t.as_ref().map_or(0, |(_, c)| c.len() as u64)
        };
        let name = format!("t{round}");
        // Every third backup beside the repository, while it is served.
        let report = match round % 3 {
            0 => {
                let repo = Repository::open(dir.path().join("repo")).unwrap();
                repo.backup_blocks(&name, "dev", &model, &mut |_| {})
                    .unwrap()
                    .1
            }
            _ => backup(&c, &name, &model),
        };
        assert!(restored(&c, &name) == model.image(), "round {round}");
        assert!(report.tracking);
        let want = if lost {
            0
        } else {
            (REGIONS - changed) * REGION
        };
        assert_eq!(report.blocks_unwalked, want, "round {round}: {report:?}");
        if round % 3 != 0 {
            assert_eq!(report.parent.is_some(), !lost, "round {round}: {report:?}");
        }
    }
    // Grown by two regions the tracking does not know of: the server
    // cannot take them from the parent, and the backup walks everything.
    model.blocks.resize(((REGIONS + 2) * REGION) as usize, None);
    model.reads.store(0, Ordering::Relaxed);
    // (Its progress starts again from 0 for the second try.)
    let (_, report) = c.backup_blocks("grown", "dev", &model, &|_| {}).unwrap();
    let why = report.parent_refused.clone().expect("the parent refused");
    assert!(why.contains("could be reused"), "{why}");
    assert_eq!(report.blocks_unwalked, 0, "{report:?}");
    assert!(restored(&c, "grown") == model.image());
    drop(c);
    server.shut();
    let repo = Repository::open_read_only(dir.path().join("repo")).unwrap();
    let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(check.is_clean(), "{check:?}");
}

/// A session has one parent, asked once; a device mark is refused on a
/// backup of files, and a parent image in a repository of content-defined
/// segments (no device's blocks).
#[test]
fn a_server_refuses_mixed_parents_and_marks_on_files() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), options(Segmenting::Fixed { size: 4096 }));
    let c = server.client();
    let refused = |c: &Client, call: Call, what: &str| match c.call(call) {
        Err(e) => assert!(e.to_string().contains(what), "{e}"),
        Ok(r) => panic!("answered {r:?}"),
    };
    let image = begin(&c, "image");
    let first = c.call(Call::ParentImage {
        session: image,
        size: 1 << 20,
    });
    assert!(
        matches!(first, Ok(Reply::ParentImage { name: None, .. })),
        "{first:?}"
    );
    refused(
        &c,
        Call::ParentImage {
            session: image,
            size: 1 << 20,
        },
        "asked for its parent already",
    );
    refused(
        &c,
        Call::ParentTree {
            session: image,
            at: 0,
        },
        "parent image already",
    );
    let files = begin(&c, "files");
    assert!(matches!(
        c.call(Call::ParentTree {
            session: files,
            at: 0
        }),
        Ok(Reply::ParentTree { name: None, .. })
    ));
    let mark = |session| Call::DeviceMark {
        session,
        device: [1; 16],
        mark: 2,
    };
    refused(&c, mark(files), "a device mark on a backup of files");
    refused(
        &c,
        Call::ParentImage {
            session: files,
            size: 1,
        },
        "asked for its parent already",
    );
    assert!(matches!(c.call(mark(image)), Ok(Reply::MarkSet)));
    drop(c);
    server.shut();

    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), options(Segmenting::fastcdc(8192)));
    let c = server.client();
    let s = begin(&c, "cdc");
    refused(
        &c,
        Call::ParentImage {
            session: s,
            size: 1,
        },
        "fixed segments",
    );
}
