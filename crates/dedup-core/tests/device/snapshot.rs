//! A snapshot of a served device for a backup by fingerprint (issue 39,
//! `engine/snapshot.rs`), on every variant against a plain disk: the map
//! is frozen, writes (aligned, unaligned, trims) and collections go on,
//! from this thread and from a racing one, and the snapshot's map and
//! bytes stay those of the disk at the freeze while the device reads the
//! disk as it is now. A second snapshot is refused while one runs; after
//! the end the chunks it held are collected and the metadata checks
//! clean; with write-back, every write acknowledged before the freeze is
//! in it. Through the control socket, a snapshot lives as long as its
//! session. Changed-block tracking goes on from the freeze only when the
//! snapshot ends with a mark.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{assert_consistent, read_all, variant_device, ModelDisk, Patterns, VARIANTS};
use dedup_core::control::snapshot::SnapshotClient;
use dedup_core::control::ControlServer;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::{Changes, ChunkState, Device, OpenOptions};
use rand::{rngs::StdRng, Rng, SeedableRng};

const CS: usize = 4096;
const CHUNKS: u64 = 256;

/// Random writes of a few patterns (some at 512-byte offsets, so
/// read-modify-write), and trims, on the device and the model alike.
fn churn(dev: &Device, model: &mut ModelDisk, patterns: &Patterns, rng: &mut StdRng, n: usize) {
    for _ in 0..n {
        let aligned = rng.random_range(0..4) != 0;
        let offset = rng.random_range(0..CHUNKS - 4) * CS as u64
            + if aligned {
                0
            } else {
                rng.random_range(1..8u64) * 512
            };
        let len = rng.random_range(1..=3usize) * CS;
        if rng.random_range(0..6) == 0 {
            dev.discard(offset, len as u64, false).unwrap();
            model.zero(offset, len as u64);
        } else {
            let data = patterns.bytes(rng.random_range(1..24), offset, len);
            dev.write(offset, &data, false).unwrap();
            model.write(offset, &data);
        }
    }
}

/// Chunks `lbns` written with unique contents (seeded from `seed`), on
/// the device and the model.
fn unique(dev: &Device, model: &mut ModelDisk, lbns: std::ops::Range<u64>, seed: u64) {
    for lbn in lbns {
        let data = dedup_common::testdata::noise(lbn + seed, CS);
        dev.write(lbn * CS as u64, &data, false).unwrap();
        model.write(lbn * CS as u64, &data);
    }
}

/// The snapshot's map and bytes are `frozen`'s, read in pieces of
/// varying size.
fn snapshot_is(dev: &Device, frozen: &ModelDisk, rng: &mut StdRng, variant: &str) {
    let mut lbn = 0u64;
    while lbn < CHUNKS {
        let n = rng.random_range(1..=40u64).min(CHUNKS - lbn);
        let states = dev.snapshot_map(lbn, n).unwrap();
        let mut buf = vec![0u8; n as usize * CS];
        dev.snapshot_read(lbn, &mut buf).unwrap();
        for (i, s) in states.iter().enumerate() {
            let at = lbn as usize + i;
            let want = frozen.chunk(at);
            assert_eq!(
                &buf[i * CS..(i + 1) * CS],
                want,
                "{variant}: snapshot bytes of LBN {at}"
            );
            match s {
                ChunkState::Unmapped => assert!(
                    want.iter().all(|&b| b == 0),
                    "{variant}: LBN {at} unmapped in the snapshot, not zero at the freeze"
                ),
                ChunkState::Known(fp) => assert_eq!(
                    *fp,
                    HashAlgo::Blake3.fingerprint(want),
                    "{variant}: snapshot fingerprint of LBN {at}"
                ),
                ChunkState::Unknown => {}
            }
        }
        lbn += n;
    }
}

#[test]
fn a_snapshot_keeps_the_map_of_its_instant_while_writes_and_collections_go_on() {
    let patterns = Patterns::new(24, CS);
    // Every variant, and the default with write-back (writes queued when
    // acknowledged: the snapshot must still have every one of them).
    let cases = VARIANTS
        .iter()
        .map(|&v| (v, 0))
        .chain([("sparse", 8 << 20)]);
    for (seed, (variant, write_back)) in cases.enumerate() {
        let mut mem = variant_device(variant, CS as u32, CHUNKS, CHUNKS * 3);
        mem.write_back_bytes = write_back;
        let dev = mem.open().unwrap();
        let mut rng = StdRng::seed_from_u64(seed as u64 + 900);
        let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
        churn(&dev, &mut model, &patterns, &mut rng, 150);
        let frozen = model.clone();
        let start = dev.snapshot_start().unwrap();
        assert!(start.changes.is_none() && !start.can_track, "{variant}");
        let again = dev.snapshot_start().unwrap_err().to_string();
        assert!(again.contains("already running"), "{variant}: {again}");
        for round in 0..4 {
            churn(&dev, &mut model, &patterns, &mut rng, 60);
            if round % 2 == 1 {
                dev.gc().unwrap();
            }
            snapshot_is(&dev, &frozen, &mut rng, variant);
            assert_eq!(read_all(&dev), model.bytes, "{variant}: live bytes");
        }
        assert!(
            !dev.snapshot_end(start.id, None).unwrap(),
            "{variant}: no tracking here"
        );
        assert!(
            dev.snapshot_map(0, 1).is_err(),
            "{variant}: read after the end"
        );
        dev.gc().unwrap();
        assert_eq!(read_all(&dev), model.bytes, "{variant}");
        assert_consistent(&dev);
        dev.close().unwrap();
        let dev = mem.open().unwrap();
        assert_eq!(read_all(&dev), model.bytes, "{variant}: after a reopen");
        assert_consistent(&dev);
    }
}

#[test]
fn with_write_back_every_acknowledged_write_is_in_the_snapshot() {
    let mut mem = variant_device("sparse", CS as u32, CHUNKS, CHUNKS * 4);
    mem.write_back_bytes = 8 << 20;
    let dev = mem.open().unwrap();
    for round in 0..300u64 {
        let lbn = round % CHUNKS;
        let data = dedup_common::testdata::noise(round + 1, CS);
        dev.write(lbn * CS as u64, &data, false).unwrap();
        let s = dev.snapshot_start().unwrap();
        let want = HashAlgo::Blake3.fingerprint(&data);
        assert_eq!(
            dev.snapshot_map(lbn, 1).unwrap(),
            vec![ChunkState::Known(want)],
            "round {round}"
        );
        dev.snapshot_end(s.id, None).unwrap();
    }
}

#[test]
fn what_a_snapshot_held_is_collected_after_its_end() {
    let mem = variant_device("sparse", CS as u32, CHUNKS, CHUNKS * 3);
    let dev = mem.open().unwrap();
    let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
    // 64 unique chunks, frozen, then all overwritten with other unique ones.
    unique(&dev, &mut model, 0..64, 1);
    let frozen = model.clone();
    let s = dev.snapshot_start().unwrap();
    unique(&dev, &mut model, 0..64, 1000);
    let during = dev.gc().unwrap();
    assert_eq!(during.reclaimed, 0, "a held chunk was collected");
    let shown = dev.stats().snapshot.unwrap();
    assert_eq!(
        (shown.lbns_kept, shown.chunks_held, shown.given_up),
        (64, 64, false)
    );
    let mut rng = StdRng::seed_from_u64(7);
    snapshot_is(&dev, &frozen, &mut rng, "sparse");
    dev.snapshot_end(s.id, None).unwrap();
    assert!(dev.stats().snapshot.is_none());
    let after = dev.gc().unwrap();
    assert_eq!(after.reclaimed, 64, "the held chunks, once free");
    assert_consistent(&dev);
}

#[test]
fn a_stop_ends_a_running_snapshot_and_leaves_nothing_behind() {
    let patterns = Patterns::new(24, CS);
    for (seed, variant) in ["sparse", "disktable/zstd", "thin/none"]
        .into_iter()
        .enumerate()
    {
        let mem = variant_device(variant, CS as u32, CHUNKS, CHUNKS * 3);
        let dev = mem.open().unwrap();
        let mut rng = StdRng::seed_from_u64(seed as u64 + 300);
        let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
        churn(&dev, &mut model, &patterns, &mut rng, 100);
        let s = dev.snapshot_start().unwrap();
        churn(&dev, &mut model, &patterns, &mut rng, 100);
        assert_consistent(&dev);
        dev.close().unwrap();
        assert!(
            !dev.snapshot_end(s.id, None).unwrap(),
            "{variant}: ended by the stop"
        );
        let dev = mem.open().unwrap();
        assert_eq!(read_all(&dev), model.bytes, "{variant}");
        dev.gc().unwrap();
        assert_consistent(&dev);
        assert_eq!(read_all(&dev), model.bytes, "{variant}");
    }
}

#[test]
fn a_snapshot_that_would_keep_too_much_is_given_up_and_says_so() {
    for variant in ["sparse", "thin/none"] {
        let mem = variant_device(variant, CS as u32, CHUNKS, CHUNKS * 3);
        let dev = mem.open().unwrap();
        let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
        // 64 unique chunks, frozen, then overwritten with others.
        unique(&dev, &mut model, 0..64, 1);
        let s = dev.snapshot_start_keeping(10).unwrap();
        let mut buf = vec![0u8; CS];
        dev.snapshot_read(0, &mut buf).unwrap();
        unique(&dev, &mut model, 0..30, 500);
        let e = dev.snapshot_read(0, &mut buf).unwrap_err().to_string();
        assert!(
            e.contains("given up") && e.contains("10 chunks"),
            "{variant}: {e}"
        );
        assert!(dev.snapshot_map(40, 1).is_err(), "{variant}");
        let shown = dev.stats().snapshot.unwrap();
        // What it held before it was given up, it holds to its end.
        assert!(
            shown.given_up && shown.chunks_held == 10,
            "{variant}: {shown:?}"
        );
        assert!(
            dev.snapshot_start().is_err(),
            "{variant}: still one at a time"
        );
        let during = dev.gc().unwrap();
        assert!(
            !dev.snapshot_end(s.id, Some(9)).unwrap(),
            "{variant}: no tracking from it"
        );
        let after = dev.gc().unwrap();
        if variant == "sparse" {
            assert_eq!((during.reclaimed, after.reclaimed), (20, 10), "{variant}");
        }
        assert_eq!(read_all(&dev), model.bytes, "{variant}");
        assert_consistent(&dev);
    }
}

#[test]
fn writes_racing_a_snapshot_from_other_threads_never_reach_it() {
    let patterns = Patterns::new(24, CS);
    for (seed, variant) in ["sparse", "disktable/zstd", "thin/none", "inram"]
        .into_iter()
        .enumerate()
    {
        let mem = variant_device(variant, CS as u32, CHUNKS, CHUNKS * 4);
        let dev = mem.open().unwrap();
        let mut rng = StdRng::seed_from_u64(seed as u64 + 77);
        let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
        churn(&dev, &mut model, &patterns, &mut rng, 120);
        let frozen = model.clone();
        let s = dev.snapshot_start().unwrap();
        let live = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut rng = StdRng::seed_from_u64(seed as u64 + 78);
                let mut model = model.clone();
                for _ in 0..6 {
                    churn(&dev, &mut model, &patterns, &mut rng, 40);
                    dev.gc().unwrap();
                }
                model
            });
            for _ in 0..6 {
                snapshot_is(&dev, &frozen, &mut rng, variant);
            }
            writer.join().unwrap()
        });
        snapshot_is(&dev, &frozen, &mut rng, variant);
        dev.snapshot_end(s.id, None).unwrap();
        dev.gc().unwrap();
        assert_eq!(read_all(&dev), live.bytes, "{variant}: live bytes");
        assert_consistent(&dev);
    }
}

/// A device in a real directory (so it tracks changes), served by a
/// control socket.
fn tracked_device(dir: &std::path::Path) -> Device {
    let mut opts = CreateOptions::new(12 * Changes::REGION_CHUNKS * CS as u64);
    opts.backend = "sparse".into();
    layout::create(dir, &opts).unwrap();
    let paths = DevicePaths::from_dir(dir).unwrap();
    layout::open(
        &paths,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn regions(changes: &Changes) -> BTreeSet<u64> {
    (0..12)
        .filter(|r| changes.changed(r * Changes::REGION_CHUNKS, Changes::REGION_CHUNKS))
        .collect()
}

fn write_region(dev: &Device, region: u64, seed: u64) {
    let data = dedup_common::testdata::noise(seed, CS);
    dev.write(region * Changes::REGION_CHUNKS * CS as u64, &data, false)
        .unwrap();
}

#[test]
fn tracking_goes_on_from_the_freeze_only_when_the_snapshot_ends_with_a_mark() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tracked_device(&tmp.path().join("dev"));
    dev.start_changes(1).unwrap();
    write_region(&dev, 2, 1);
    let s = dev.snapshot_start().unwrap();
    assert!(s.can_track);
    let at_freeze = s.changes.unwrap();
    assert_eq!(
        (at_freeze.mark, regions(&at_freeze)),
        (1, BTreeSet::from([2]))
    );
    write_region(&dev, 5, 2);
    // Ended without a mark (the backup failed): as if never taken.
    assert!(!dev.snapshot_end(s.id + 1, None).unwrap(), "another's id");
    assert!(!dev.snapshot_end(s.id, None).unwrap());
    let c = dev.changes().unwrap();
    assert_eq!((c.mark, regions(&c)), (1, BTreeSet::from([2, 5])));

    let s = dev.snapshot_start().unwrap();
    write_region(&dev, 7, 3);
    write_region(&dev, 9, 4);
    // Ended with a mark: what changed since the freeze, under that mark.
    assert!(dev.snapshot_end(s.id, Some(42)).unwrap());
    let c = dev.changes().unwrap();
    assert_eq!((c.mark, regions(&c)), (42, BTreeSet::from([7, 9])));
    dev.close().unwrap();
}

#[test]
fn through_the_control_socket_a_snapshot_lives_as_long_as_its_session() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = Arc::new(tracked_device(&tmp.path().join("dev")));
    let sock = tmp.path().join("control.sock");
    let server = ControlServer::start(&sock, dev.clone(), Arc::new(|_: &Device| Ok(()))).unwrap();
    let cs = CS as u64;
    let first = dedup_common::testdata::noise(1, CS);
    dev.write(0, &first, false).unwrap();
    dev.start_changes(5).unwrap();

    let mut c = SnapshotClient::start(&sock).unwrap().unwrap();
    assert_eq!(c.info.chunk_size, CS as u32);
    assert_eq!(c.changes().unwrap().mark, 5);
    // Overwritten and trimmed after the freeze.
    dev.write(0, &dedup_common::testdata::noise(2, CS), false)
        .unwrap();
    dev.write(cs, &first, false).unwrap();
    let states = c.map(0, 3).unwrap();
    assert_eq!(
        states,
        vec![
            ChunkState::Known(HashAlgo::Blake3.fingerprint(&first)),
            ChunkState::Unmapped,
            ChunkState::Unmapped
        ]
    );
    let mut buf = vec![0u8; 2 * CS];
    c.read(0, &mut buf).unwrap();
    assert_eq!(&buf[..CS], &first[..]);
    assert!(buf[CS..].iter().all(|&b| b == 0));
    // Past the end and too much at once: refused, the session goes on.
    assert!(c.map(12 * Changes::REGION_CHUNKS, 1).is_err());
    assert!(c.map(0, 1 << 30).is_err());
    assert_eq!(c.map(1, 1).unwrap(), vec![ChunkState::Unmapped]);
    // One snapshot at a time.
    let second = SnapshotClient::start(&sock).err().unwrap().to_string();
    assert!(second.contains("already running"), "{second}");
    // Dropped (the backup died): the snapshot ends with the session.
    drop(c);
    let c = (0..100)
        .find_map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            SnapshotClient::start(&sock).ok().flatten()
        })
        .expect("a new snapshot once the first session closed");
    assert_eq!(c.changes().unwrap().mark, 5, "tracking untouched");
    assert!(c.end(Some(6)).unwrap());
    assert_eq!(dev.changes().unwrap().mark, 6);
    server.stop();
    dev.close().unwrap();
}

#[test]
fn a_large_device_sends_its_tracking_whole() {
    // 4 TiB: 16,384 words of flags, more than a reply line may hold.
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = CreateOptions::new(4 << 40);
    opts.backend = "sparse".into();
    opts.physical_size = Some(64 << 20);
    let dir = tmp.path().join("dev");
    layout::create(&dir, &opts).unwrap();
    let dev = Arc::new(
        layout::open(
            &DevicePaths::from_dir(&dir).unwrap(),
            &OpenOptions {
                writable: true,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    dev.start_changes(77).unwrap();
    for region in [0u64, 1 << 19, (1 << 20) - 1] {
        write_region(&dev, region, region + 1);
    }
    let sock = tmp.path().join("control.sock");
    let server = ControlServer::start(&sock, dev.clone(), Arc::new(|_: &Device| Ok(()))).unwrap();
    let c = SnapshotClient::start(&sock).unwrap().unwrap();
    assert_eq!(c.changes(), dev.changes());
    assert_eq!(c.changes().unwrap().regions_changed(), 3);
    drop(c);
    server.stop();
    dev.close().unwrap();
}
