//! `dedup grow` on every backend that can grow: random writes, overwrites,
//! discards and collections checked against a plain in-memory disk across
//! grows of the logical size and of the data space; a device that was full
//! takes the new chunks after growing; bad requests are refused by name and
//! change nothing; an interrupted grow leaves the old device as it was.

use crate::common;

use std::path::Path;

use common::ModelDisk;
use dedup_core::backends::OpenOptions;
use dedup_core::compress::Compression;
use dedup_core::grow::{self, GrowOptions};
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::testdata::noise;
use dedup_core::{Device, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CS: u64 = 4096;
/// The overwrite reserve `create` (and `grow`) add to a file's data space.
const RESERVE: u64 = 1024;

/// Every store that grows, raw and packed: (backend, compression).
const GROWING: &[(&str, &str)] = &[
    ("sparse", "none"),
    ("sparse", "lz4"),
    ("disktable", "none"),
    ("disktable", "lz4"),
    ("inram", "none"),
    ("inram", "lz4"),
    ("cowbtree", "none"),
    ("cowbtree", "zstd:1"),
    ("lsm", "none"),
    ("lsm", "lz4"),
];

fn rw() -> OpenOptions {
    OpenOptions {
        writable: true,
        ..Default::default()
    }
}

fn create(dir: &Path, backend: &str, codec: &str, chunks: u64, physical: u64) -> DevicePaths {
    let opts = CreateOptions {
        backend: backend.into(),
        compression: Compression::parse(codec).unwrap(),
        physical_size: Some(physical * CS),
        ..CreateOptions::new(chunks * CS)
    };
    layout::create(dir, &opts).unwrap();
    DevicePaths::from_dir(dir).unwrap()
}

fn grow_to(dir: &Path, chunks: Option<u64>, physical: Option<u64>) -> grow::GrowReport {
    let opts = GrowOptions {
        size: chunks.map(|c| c * CS),
        physical_size: physical.map(|c| c * CS),
    };
    grow::grow(dir, &opts, &|_, _| {}).unwrap()
}

/// A chunk: one of a few shared contents (duplicates; even ones compress),
/// or unique noise.
fn content(rng: &mut StdRng, unique: &mut u64) -> Vec<u8> {
    if rng.random_bool(0.4) {
        let p = rng.random_range(1..6u64);
        let base = noise(p * 77, 100);
        (0..CS as usize).map(|i| base[i % 100]).collect()
    } else if rng.random_bool(0.3) {
        noise(rng.random_range(1..4u64), CS as usize)
    } else {
        *unique += 1;
        noise(1_000_000 + *unique, CS as usize)
    }
}

/// Random writes (whole and partial chunks), discards and a collection
/// within `[from, to)`, on the device and on the model.
fn workload(dev: &Device, model: &mut ModelDisk, rng: &mut StdRng, from: u64, to: u64, ops: usize) {
    let mut unique = rng.random::<u32>() as u64 * 10_000;
    for i in 0..ops {
        let lbn = rng.random_range(from..to);
        match rng.random_range(0..10) {
            0 => {
                let n = rng.random_range(1..=(to - lbn).min(4));
                dev.discard(lbn * CS, n * CS, false).unwrap();
                model.zero(lbn * CS, n * CS);
            }
            1 => {
                let at = lbn * CS + rng.random_range(0..CS);
                let len = rng.random_range(1..=(to * CS - at).min(3 * CS)) as usize;
                let bytes = noise(rng.random(), len);
                dev.write(at, &bytes, false).unwrap();
                model.write(at, &bytes);
            }
            _ => {
                let bytes = content(rng, &mut unique);
                dev.write(lbn * CS, &bytes, false).unwrap();
                model.write(lbn * CS, &bytes);
            }
        }
        if i % 97 == 96 {
            dev.gc().unwrap();
        }
    }
    dev.flush().unwrap();
}

fn verify(paths: &DevicePaths, model: &ModelDisk, what: &str) {
    let dev = layout::open(paths, &rw()).unwrap();
    assert_eq!(dev.size(), model.bytes.len() as u64, "{what}: size");
    let got = common::read_all(&dev);
    if let Some(i) = (0..model.chunks())
        .find(|&i| got[i * CS as usize..(i + 1) * CS as usize] != *model.chunk(i))
    {
        panic!("{what}: LBN {i} differs from the model");
    }
    common::assert_consistent(&dev);
    stop(dev);
}

/// Stop cleanly and let go of the device's lock.
fn stop(dev: Device) {
    dev.close().unwrap();
}

fn grown(model: &ModelDisk, chunks: u64) -> ModelDisk {
    let mut m = ModelDisk::new((chunks * CS) as usize, CS as usize);
    m.bytes[..model.bytes.len()].copy_from_slice(&model.bytes);
    m
}

#[test]
fn random_operations_across_grows_match_a_plain_disk_on_every_backend() {
    for &(backend, codec) in GROWING {
        for seed in 0..2u64 {
            let what = format!("{backend}/{codec} seed {seed}");
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("dev");
            let paths = create(&dir, backend, codec, 300, 64);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut model = ModelDisk::new((300 * CS) as usize, CS as usize);

            let dev = layout::open(&paths, &rw()).unwrap();
            workload(&dev, &mut model, &mut rng, 0, 300, 500);
            stop(dev);

            // Logical only, then physical only, then both.
            let r = grow_to(&dir, Some(700), None);
            assert_eq!(
                (r.logical_size, r.physical_size_before),
                (700 * CS, r.physical_size),
                "{what}"
            );
            model = grown(&model, 700);
            verify(&paths, &model, &format!("{what}, grown to 700 chunks"));
            let dev = layout::open(&paths, &rw()).unwrap();
            // Writes on both sides of the old end.
            workload(&dev, &mut model, &mut rng, 250, 700, 500);
            stop(dev);
            verify(&paths, &model, &format!("{what}, written after growing"));

            let r = grow_to(&dir, None, Some(500));
            assert_eq!(r.physical_size, (500 + RESERVE) * CS, "{what}");
            verify(&paths, &model, &format!("{what}, more data space"));

            grow_to(&dir, Some(1000), Some(900));
            model = grown(&model, 1000);
            let dev = layout::open(&paths, &rw()).unwrap();
            workload(&dev, &mut model, &mut rng, 0, 1000, 600);
            stop(dev);
            verify(&paths, &model, &format!("{what}, grown twice more"));
        }
    }
}

/// Unique, incompressible chunks at LBNs `lbns`: stops at the first write
/// refused; how many were written.
fn fill(dev: &Device, model: &mut ModelDisk, lbns: std::ops::Range<u64>, seed: u64) -> u64 {
    for lbn in lbns.clone() {
        let bytes = noise(seed * 1_000_003 + lbn, CS as usize);
        match dev.write(lbn * CS, &bytes, false) {
            Ok(()) => model.write(lbn * CS, &bytes),
            Err(Error::NoSpace { .. }) => return lbn - lbns.start,
            Err(e) => panic!("LBN {lbn}: {e}"),
        }
    }
    lbns.end - lbns.start
}

#[test]
fn a_full_device_takes_new_chunks_after_growing_its_data_space() {
    for &(backend, codec) in GROWING {
        let what = format!("{backend}/{codec}");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dev");
        let old_blocks = 16 + RESERVE;
        let paths = create(&dir, backend, codec, 3000, 16);
        let mut model = ModelDisk::new((3000 * CS) as usize, CS as usize);
        let dev = layout::open(&paths, &rw()).unwrap();
        let written = fill(&dev, &mut model, 0..3000, 1);
        stop(dev);
        assert_eq!(
            written, old_blocks,
            "{what}: the device took {written} unique chunks in {old_blocks} blocks"
        );

        grow_to(&dir, None, Some(3000));
        let dev = layout::open(&paths, &rw()).unwrap();
        assert_eq!(
            fill(&dev, &mut model, written..3000, 2),
            3000 - written,
            "{what}: refused writes after growing the data space"
        );
        stop(dev);
        verify(&paths, &model, &format!("{what}, filled after growing"));
        let data_len = std::fs::metadata(&paths.data).unwrap().len();
        assert!(
            data_len >= 4096 + (3000 + RESERVE) * CS,
            "{what}: data file {data_len}"
        );
    }
}

fn grow_err(dir: &Path, chunks: Option<u64>, physical: Option<u64>) -> String {
    let opts = GrowOptions {
        size: chunks.map(|c| c * CS),
        physical_size: physical.map(|c| c * CS),
    };
    grow::grow(dir, &opts, &|_, _| {}).unwrap_err().to_string()
}

#[test]
fn bad_requests_are_refused_by_name_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let paths = create(&dir, "sparse", "lz4", 100, 50);
    let mut model = ModelDisk::new((100 * CS) as usize, CS as usize);
    let dev = layout::open(&paths, &rw()).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    workload(&dev, &mut model, &mut rng, 0, 100, 200);

    // Served (open): refused, and says how to grow.
    let e = grow_err(&dir, Some(200), None);
    assert!(e.contains("is open") && e.contains("stop"), "{e}");
    stop(dev);

    let e = grow_err(&dir, Some(50), None);
    assert!(e.contains("never shrinks"), "{e}");
    let e = grow_err(&dir, None, Some(10));
    assert!(e.contains("never shrinks"), "{e}");
    let e = grow_err(&dir, Some(100), None);
    assert!(e.contains("nothing to grow"), "{e}");
    let e = grow::grow(
        &dir,
        &GrowOptions {
            size: Some(200 * CS + 1),
            physical_size: None,
        },
        &|_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a multiple"), "{e}");
    let e = grow::grow(
        &dir,
        &GrowOptions {
            size: None,
            physical_size: Some(200 * CS + 512),
        },
        &|_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not a multiple"), "{e}");
    verify(&paths, &model, "after refused grows");
    let (cfg, _) = layout::read_config(&paths).unwrap();
    assert_eq!(cfg.logical_size, 100 * CS);

    // A device not stopped cleanly (inram: dropped without close).
    let dir2 = tmp.path().join("inram");
    let paths2 = create(&dir2, "inram", "none", 100, 50);
    let dev = layout::open(&paths2, &rw()).unwrap();
    dev.write(0, &noise(5, CS as usize), false).unwrap();
    // A copy of its files while it is open is what a crash leaves.
    let dir3 = tmp.path().join("copy");
    std::fs::create_dir(&dir3).unwrap();
    for f in ["data", "meta"] {
        std::fs::copy(dir2.join(f), dir3.join(f)).unwrap();
    }
    stop(dev);
    let e = grow_err(&dir3, Some(200), None);
    assert!(e.contains("not stopped cleanly"), "{e}");

    // thin lays its windows out by the sizes.
    let dir4 = tmp.path().join("thin");
    create(&dir4, "thin", "lz4", 100, 50);
    let e = grow_err(&dir4, Some(200), None);
    assert!(e.contains("thin") && e.contains("cannot grow"), "{e}");
}

#[test]
fn an_interrupted_grow_leaves_the_old_device_and_the_next_one_finishes() {
    for backend in ["sparse", "disktable", "inram"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dev");
        let paths = create(&dir, backend, "lz4", 200, 100);
        let mut model = ModelDisk::new((200 * CS) as usize, CS as usize);
        let dev = layout::open(&paths, &rw()).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        workload(&dev, &mut model, &mut rng, 0, 200, 300);
        stop(dev);

        // What a crash part-way leaves: a longer data file and a half-made
        // copy of the metadata beside the old.
        let data = std::fs::OpenOptions::new()
            .write(true)
            .open(&paths.data)
            .unwrap();
        let len = data.metadata().unwrap().len();
        data.set_len(len + 64 * CS).unwrap();
        std::fs::write(dir.join("meta.grow"), noise(4, 3 * CS as usize)).unwrap();
        verify(
            &paths,
            &model,
            &format!("{backend}: old device after a crash"),
        );

        grow_to(&dir, Some(400), Some(300));
        assert!(!dir.join("meta.grow").exists(), "{backend}");
        verify(
            &paths,
            &grown(&model, 400),
            &format!("{backend}: grown after a crash"),
        );
    }
}

#[test]
fn a_cleanly_grown_device_refuses_its_pre_grow_metadata_once_served() {
    // Restoring the metadata from before a grow is restoring a backup:
    // once the grown device has been served, the data device's record is
    // newer and the old copy is refused (`generation.rs`).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let paths = create(&dir, "sparse", "lz4", 100, 50);
    let dev = layout::open(&paths, &rw()).unwrap();
    dev.write(0, &noise(1, CS as usize), false).unwrap();
    stop(dev);
    let before = std::fs::read(&paths.meta).unwrap();
    grow_to(&dir, Some(200), None);
    let dev = layout::open(&paths, &rw()).unwrap();
    dev.write(CS, &noise(2, CS as usize), false).unwrap();
    stop(dev);
    std::fs::write(&paths.meta, before).unwrap();
    let e = layout::open(&paths, &rw())
        .err()
        .expect("stale metadata opened");
    assert!(matches!(e, Error::Stale { .. }), "{e}");
}

#[test]
fn a_grown_copy_keeps_the_metadata_files_place_owner_and_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Metadata named by a symlink (`create --meta PATH`): the copy lands
    // beside the file, not the link, and the link still names it.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let elsewhere = tmp.path().join("fast");
    std::fs::create_dir(&elsewhere).unwrap();
    let meta_file = elsewhere.join("dev.meta");
    let opts = CreateOptions {
        meta: Some(meta_file.clone()),
        physical_size: Some(50 * CS),
        ..CreateOptions::new(100 * CS)
    };
    layout::create(&dir, &opts).unwrap();
    let paths = DevicePaths::from_dir(&dir).unwrap();
    let mut model = ModelDisk::new((100 * CS) as usize, CS as usize);
    let dev = layout::open(&paths, &rw()).unwrap();
    workload(&dev, &mut model, &mut StdRng::seed_from_u64(5), 0, 100, 150);
    stop(dev);
    // A service user's device, grown by root.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(&meta_file, Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(&meta_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let before = std::fs::metadata(&meta_file).unwrap();

    grow_to(&dir, Some(300), Some(200));
    assert!(std::fs::symlink_metadata(dir.join("meta"))
        .unwrap()
        .is_symlink());
    assert_eq!(std::fs::read_link(dir.join("meta")).unwrap(), meta_file);
    assert!(!elsewhere.join("dev.meta.grow").exists());
    let after = std::fs::metadata(&meta_file).unwrap();
    assert_eq!(after.mode() & 0o7777, 0o640);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    if !root {
        eprintln!("not root: the owner could not be changed to test it");
    }
    verify(&paths, &grown(&model, 300), "grown through a symlink");
}
