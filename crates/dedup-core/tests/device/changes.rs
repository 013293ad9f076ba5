//! Changed-block tracking (`changes.rs`, issue 39) on devices in real
//! directories: every region a write or trim touched after the mark is
//! flagged after a clean stop, against a model of what was touched; and
//! whenever the tracking cannot be trusted it is gone, never wrong: a
//! crash (dropped without a stop), a repair, a grow, a file from an older
//! stop put back, a damaged file, a device opened read-only after a
//! crash (which cannot start tracking either).

use std::collections::BTreeSet;
use std::path::Path;

use dedup_core::backends::OpenOptions;
use dedup_core::grow::{self, GrowOptions};
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::{Changes, Device};
use rand::{rngs::StdRng, Rng, SeedableRng};

const CS: u64 = 4096;
const REGION: u64 = Changes::REGION_CHUNKS;
/// 12 regions.
const CHUNKS: u64 = 12 * REGION;

fn open(paths: &DevicePaths, writable: bool) -> Device {
    layout::open(
        paths,
        &OpenOptions {
            writable,
            ..Default::default()
        },
    )
    .unwrap()
}

fn create(dir: &Path, backend: &str) -> DevicePaths {
    let mut opts = CreateOptions::new(CHUNKS * CS);
    opts.backend = backend.into();
    layout::create(dir, &opts).unwrap();
    DevicePaths::from_dir(dir).unwrap()
}

/// Random writes and trims of 1-3 chunks; the regions whose chunks they
/// changed (a trim of chunks already unmapped changes nothing).
fn churn(dev: &Device, rng: &mut StdRng, n: usize, touched: &mut BTreeSet<u64>) {
    for _ in 0..n {
        let lbn = rng.random_range(0..CHUNKS - 3);
        let count = rng.random_range(1..=3u64);
        let mut before = vec![0u8; (count * CS) as usize];
        dev.read(lbn * CS, &mut before).unwrap();
        let after = if rng.random_range(0..4) == 0 {
            dev.discard(lbn * CS, count * CS, false).unwrap();
            vec![0u8; before.len()]
        } else {
            let mut buf = vec![0u8; (count * CS) as usize];
            rng.fill(&mut buf[..]);
            dev.write(lbn * CS, &buf, false).unwrap();
            buf
        };
        for (i, (b, a)) in before
            .chunks(CS as usize)
            .zip(after.chunks(CS as usize))
            .enumerate()
        {
            if a != b {
                touched.insert((lbn + i as u64) / REGION);
            }
        }
    }
}

/// The regions `changes` flags.
fn flagged(changes: &Changes) -> BTreeSet<u64> {
    (0..CHUNKS / REGION)
        .filter(|r| changes.changed(r * REGION, REGION))
        .collect()
}

#[test]
fn every_region_touched_since_the_mark_is_flagged_across_stops() {
    for (seed, backend) in ["sparse", "disktable", "inram", "cowbtree", "thin"]
        .into_iter()
        .enumerate()
    {
        let tmp = tempfile::tempdir().unwrap();
        let paths = create(&tmp.path().join("dev"), backend);
        let mut rng = StdRng::seed_from_u64(seed as u64);
        let dev = open(&paths, true);
        churn(&dev, &mut rng, 50, &mut BTreeSet::new());
        assert_eq!(dev.changes(), None, "{backend}: untracked until a mark");
        dev.start_changes(7).unwrap();
        let mut touched = BTreeSet::new();
        // A few regions only, so untouched ones are there to check.
        for _ in 0..20 {
            let lbn = rng.random_range(0..3) * 4 * REGION + rng.random_range(0..REGION - 1);
            dev.write(lbn * CS, &vec![seed as u8 + 1; CS as usize], false)
                .unwrap();
            touched.insert(lbn / REGION);
        }
        dev.close().unwrap();
        drop(dev);
        // Read-only: what the stop saved, as it was.
        let ro = open(&paths, false);
        let c = ro.changes().unwrap_or_else(|| panic!("{backend}: tracked"));
        assert_eq!(c.mark, 7);
        assert_eq!(flagged(&c), touched, "{backend}");
        ro.close().unwrap();
        drop(ro);
        // Served again: more changes on top, flagged after the next stop.
        let dev = open(&paths, true);
        churn(&dev, &mut rng, 30, &mut touched);
        dev.close().unwrap();
        drop(dev);
        let ro = open(&paths, false);
        let c = ro.changes().unwrap();
        assert!(
            flagged(&c).is_superset(&touched),
            "{backend}: {:?} misses some of {touched:?}",
            flagged(&c)
        );
        assert_eq!(c.mark, 7);
        // A backup starts it anew from a read-only open.
        ro.start_changes(9).unwrap();
        ro.close().unwrap();
        drop(ro);
        let ro = open(&paths, false);
        let c = ro.changes().unwrap();
        assert_eq!((c.mark, c.regions_changed()), (9, 0), "{backend}");
    }
}

/// Tracked, then stopped cleanly: the state every case below starts from.
fn tracked(dir: &Path) -> DevicePaths {
    let paths = create(dir, "sparse");
    let dev = open(&paths, true);
    dev.write(0, &[1u8; CS as usize], false).unwrap();
    dev.start_changes(3).unwrap();
    dev.close().unwrap();
    drop(dev);
    assert!(open(&paths, false).changes().is_some());
    paths
}

#[test]
fn a_crash_a_repair_a_grow_an_old_or_damaged_file_leave_it_untracked() {
    let tmp = tempfile::tempdir().unwrap();
    let changes_file = |p: &DevicePaths| p.meta.with_file_name("changes");

    // A crash: dropped without a stop.
    let paths = tracked(&tmp.path().join("crash"));
    {
        let dev = open(&paths, true);
        dev.write(5 * REGION * CS, &[2u8; CS as usize], false)
            .unwrap();
        dev.flush().unwrap();
    }
    let ro = open(&paths, false);
    assert_eq!(ro.changes(), None, "after a crash");
    let e = ro.start_changes(4).unwrap_err();
    assert!(e.to_string().contains("not stopped cleanly"), "{e}");
    drop(ro);
    // The next clean stop is untracked until a mark.
    let dev = open(&paths, true);
    dev.close().unwrap();
    drop(dev);
    assert_eq!(open(&paths, false).changes(), None);

    // A repair.
    let paths = tracked(&tmp.path().join("repair"));
    let dev = open(&paths, true);
    dev.repair(false).unwrap();
    dev.close().unwrap();
    drop(dev);
    assert_eq!(open(&paths, false).changes(), None, "after a repair");

    // A grow.
    let paths = tracked(&tmp.path().join("grow"));
    let dir = paths.meta.parent().unwrap().to_path_buf();
    let to = GrowOptions {
        size: Some(2 * CHUNKS * CS),
        physical_size: None,
    };
    grow::grow(&dir, &to, &|_, _| {}).unwrap();
    assert_eq!(open(&paths, false).changes(), None, "after a grow");

    // The file of an older stop put back.
    let paths = tracked(&tmp.path().join("old"));
    let old = std::fs::read(changes_file(&paths)).unwrap();
    let dev = open(&paths, true);
    dev.write(6 * REGION * CS, &[3u8; CS as usize], false)
        .unwrap();
    dev.close().unwrap();
    drop(dev);
    std::fs::write(changes_file(&paths), &old).unwrap();
    assert_eq!(open(&paths, false).changes(), None, "an older stop's file");

    // A damaged file.
    let paths = tracked(&tmp.path().join("damaged"));
    let mut bytes = std::fs::read(changes_file(&paths)).unwrap();
    bytes[30] ^= 1;
    std::fs::write(changes_file(&paths), &bytes).unwrap();
    assert_eq!(open(&paths, false).changes(), None, "a damaged file");
}
