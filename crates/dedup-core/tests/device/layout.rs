//! Devices on real files: create, open, lock, and every kind of bad input a
//! user can hand us (existing device, foreign or corrupt metadata, mismatched
//! halves, truncation, a second opener), each refused by name, losing nothing.

use std::path::Path;

use dedup_core::backends::OpenOptions;
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::Error;

fn rw() -> OpenOptions {
    OpenOptions {
        writable: true,
        ..Default::default()
    }
}

fn create(dir: &Path, size: u64) -> DevicePaths {
    layout::create(dir, &CreateOptions::new(size)).unwrap();
    DevicePaths::from_dir(dir).unwrap()
}

fn write_some(paths: &DevicePaths) -> Vec<u8> {
    let dev = layout::open(paths, &rw()).unwrap();
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    dev.write(4096 * 5 + 7, &data, false).unwrap();
    dev.close().unwrap();
    data
}

fn read_back(paths: &DevicePaths, len: usize) -> Vec<u8> {
    let dev = layout::open(paths, &rw()).unwrap();
    let mut got = vec![0; len];
    dev.read(4096 * 5 + 7, &mut got).unwrap();
    dev.close().unwrap();
    got
}

#[test]
fn create_open_write_close_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let paths = create(&dir, 1 << 20);
    let data = write_some(&paths);
    assert_eq!(read_back(&paths, data.len()), data);
    let (cfg, state) = layout::read_config(&paths).unwrap();
    assert_eq!(cfg.logical_size, 1 << 20);
    assert_eq!(state, dedup_core::superblock::DeviceState::Clean);
}

#[test]
fn a_directory_that_already_holds_a_device_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(tmp.path(), 1 << 20);
    let data = write_some(&paths);
    let err = layout::create(tmp.path(), &CreateOptions::new(1 << 20)).unwrap_err();
    assert!(matches!(err, Error::Exists { .. }), "{err}");
    assert_eq!(
        read_back(&paths, data.len()),
        data,
        "the existing device is untouched"
    );
}

#[test]
fn bad_sizes_and_names_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dev");
    let cases: Vec<(CreateOptions, &str)> = vec![
        (
            CreateOptions::new(1_000_000),
            "not a multiple of the chunk size",
        ),
        (
            CreateOptions {
                chunk_size: 6144,
                ..CreateOptions::new(1 << 20)
            },
            "power of two",
        ),
        (
            CreateOptions {
                chunk_size: 2048,
                ..CreateOptions::new(1 << 20)
            },
            "power of two",
        ),
        (
            CreateOptions {
                backend: "zfs".into(),
                ..CreateOptions::new(1 << 20)
            },
            "unknown backend",
        ),
        (
            CreateOptions {
                physical_size: Some(1000),
                ..CreateOptions::new(1 << 20)
            },
            "physical size",
        ),
        (CreateOptions::new(0), "greater than zero"),
    ];
    for (opts, want) in cases {
        let err = layout::create(&dir, &opts).unwrap_err().to_string();
        assert!(err.contains(want), "expected {want:?} in {err:?}");
        assert!(
            !dir.join("meta").exists() && !dir.join("data").exists(),
            "nothing left behind"
        );
    }
}

#[test]
fn a_second_opener_is_refused_while_the_first_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(tmp.path(), 1 << 20);
    let first = layout::open(&paths, &rw()).unwrap();
    let err = layout::open(&paths, &rw())
        .err()
        .expect("second open must fail");
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("dedup serve"), "{err}");
    first.close().unwrap();
    drop(first);
    layout::open(&paths, &rw()).unwrap().close().unwrap();
}

#[test]
fn mismatched_data_and_metadata_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let a = create(&tmp.path().join("a"), 1 << 20);
    let b = create(&tmp.path().join("b"), 1 << 20);
    let mixed = DevicePaths {
        data: a.data.clone(),
        meta: b.meta.clone(),
    };
    let err = layout::open(&mixed, &rw())
        .err()
        .expect("mismatch must fail");
    assert!(matches!(err, Error::Foreign { .. }), "{err}");
    assert!(err.to_string().contains("mismatched"), "{err}");
}

#[test]
fn foreign_files_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(tmp.path(), 1 << 20);
    std::fs::write(&paths.meta, vec![0x5a; 3 << 20]).unwrap();
    let err = layout::open(&paths, &rw()).err().expect("foreign metadata");
    assert!(
        err.to_string().contains("not a dedup metadata device"),
        "{err}"
    );
    std::fs::write(&paths.meta, b"tiny").unwrap();
    let err = layout::open(&paths, &rw()).err().expect("tiny metadata");
    assert!(err.to_string().contains("too small"), "{err}");
}

#[test]
fn corrupted_metadata_is_refused_naming_the_structure_and_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(tmp.path(), 1 << 20);
    let data = write_some(&paths);
    let pristine = std::fs::read(&paths.meta).unwrap();
    // An accepted open records a newer generation on the data device, which
    // would make every later flip's metadata "older than the data".
    let pristine_data = std::fs::read(&paths.data).unwrap();
    // Flip one byte at many places: every open either fails cleanly or (for
    // bytes nothing reads) serves exactly the data written.
    let len = pristine.len();
    let mut refused = 0;
    for i in (0..len)
        .step_by(len / 400 + 1)
        .chain([0, 8, 4092, 4096 + 60, 8192, 8200])
    {
        let mut bad = pristine.clone();
        bad[i] ^= 0x40;
        std::fs::write(&paths.meta, &bad).unwrap();
        std::fs::write(&paths.data, &pristine_data).unwrap();
        match layout::open(&paths, &rw()) {
            Ok(dev) => {
                let mut got = vec![0; data.len()];
                dev.read(4096 * 5 + 7, &mut got).unwrap();
                assert_eq!(
                    got, data,
                    "byte {i} flipped: an accepted open must serve the right data"
                );
                drop(dev);
            }
            Err(e) => {
                refused += 1;
                let msg = e.to_string();
                assert!(
                    matches!(
                        e,
                        Error::Corrupt { .. }
                            | Error::Foreign { .. }
                            | Error::Unsupported(_)
                            | Error::Unclean { .. }
                            // The newest superblock slot hit.
                            | Error::Stale { .. }
                    ),
                    "byte {i}: unexpected error kind: {msg}"
                );
            }
        }
    }
    assert!(refused > 0);
}

/// The default backend is crash-safe: a server killed mid-write leaves a
/// device that opens again with no flag, with everything flushed intact.
#[test]
fn the_default_device_serves_again_after_a_crash_without_a_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(tmp.path(), 1 << 20);
    let data = write_some(&paths);
    {
        let dev = layout::open(&paths, &rw()).unwrap();
        dev.write(0, &[7u8; 4096], false).unwrap();
        dev.write(4096, &[8u8; 4096], false).unwrap();
        dev.flush().unwrap();
        dev.write(0, &[9u8; 4096], false).unwrap();
        // Dropped without close: what a SIGKILL leaves behind.
    }
    let dev = layout::open(&paths, &rw()).expect("the default backend recovers by itself");
    let mut got = vec![0; data.len()];
    dev.read(4096 * 5 + 7, &mut got).unwrap();
    assert_eq!(got, data);
    let mut b = vec![0u8; 4096];
    dev.read(4096, &mut b).unwrap();
    assert_eq!(b, vec![8u8; 4096], "flushed before the crash");
    dev.read(0, &mut b).unwrap();
    assert!(b == vec![7; 4096] || b == vec![9; 4096]);
    assert!(dev.check(true).unwrap().is_clean());
    dev.close().unwrap();
}

#[test]
fn a_crashed_inram_server_is_refused_then_recovered_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    layout::create(
        tmp.path(),
        &CreateOptions {
            backend: "inram".into(),
            ..CreateOptions::new(1 << 20)
        },
    )
    .unwrap();
    let paths = DevicePaths::from_dir(tmp.path()).unwrap();
    let data = write_some(&paths);
    {
        let dev = layout::open(&paths, &rw()).unwrap();
        dev.write(0, &[7u8; 4096], false).unwrap();
        // Dropped without close: what a SIGKILL leaves behind.
    }
    let err = layout::open(&paths, &rw()).err().expect("unclean");
    assert!(matches!(err, Error::Unclean { .. }), "{err}");
    let dev = layout::open(
        &paths,
        &OpenOptions {
            writable: true,
            accept_unclean: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut got = vec![0; data.len()];
    dev.read(4096 * 5 + 7, &mut got).unwrap();
    assert_eq!(got, data, "data saved at the last clean stop survives");
    let mut first = vec![1u8; 4096];
    dev.read(0, &mut first).unwrap();
    assert!(first == vec![0; 4096] || first == vec![7; 4096]);
    dev.close().unwrap();
}

#[test]
fn explicit_data_and_metadata_paths_are_linked_and_protected() {
    let tmp = tempfile::tempdir().unwrap();
    let data_path = tmp.path().join("disk.img");
    let meta_path = tmp.path().join("meta.img");
    std::fs::write(&data_path, vec![0u8; (2 << 20) + 4096]).unwrap();
    let opts = CreateOptions {
        data: Some(data_path.clone()),
        meta: Some(meta_path.clone()),
        ..CreateOptions::new(4 << 20)
    };
    let cfg = layout::create(&tmp.path().join("dev"), &opts).unwrap();
    assert_eq!(
        cfg.physical_size(),
        2 << 20,
        "physical size taken from the existing data file"
    );
    let paths = DevicePaths::from_dir(&tmp.path().join("dev")).unwrap();
    assert_eq!(std::fs::read_link(&paths.data).unwrap(), data_path);
    write_some(&paths);
    // Reusing those files for another device needs --force.
    let again = CreateOptions {
        data: Some(data_path),
        meta: Some(meta_path),
        ..CreateOptions::new(4 << 20)
    };
    let err = layout::create(&tmp.path().join("dev2"), &again).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
    let forced = CreateOptions {
        force: true,
        ..again
    };
    let cfg2 = layout::create(&tmp.path().join("dev2"), &forced).unwrap();
    // The old device's superblocks are gone: the new one opens, empty.
    let paths2 = DevicePaths::from_dir(&tmp.path().join("dev2")).unwrap();
    let dev = layout::open(&paths2, &rw()).unwrap();
    assert_eq!(dev.config().uuid, cfg2.uuid);
    assert_eq!(dev.stats().chunks_mapped, 0);
    dev.close().unwrap();
}

#[test]
fn not_a_device_directory_says_how_to_make_one() {
    let tmp = tempfile::tempdir().unwrap();
    let err = DevicePaths::from_dir(tmp.path()).unwrap_err().to_string();
    assert!(err.contains("dedup create"), "{err}");
}

#[test]
fn create_force_over_the_files_of_a_served_device_is_refused() {
    // Was: `create z2 --data z1/data --meta z1/meta --force` while z1 was
    // served destroyed both.
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(&tmp.path().join("z1"), 1 << 20);
    let data = write_some(&paths);
    let served = layout::open(&paths, &rw()).unwrap();
    for (d, m) in [
        (Some(paths.data.clone()), Some(paths.meta.clone())),
        (Some(paths.data.clone()), None),
        (None, Some(paths.meta.clone())),
    ] {
        let opts = CreateOptions {
            data: d,
            meta: m,
            force: true,
            ..CreateOptions::new(1 << 20)
        };
        let err = layout::create(&tmp.path().join("z2"), &opts).unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
        assert!(!tmp.path().join("z2").join("meta").exists());
    }
    let mut got = vec![0; data.len()];
    served.read(4096 * 5 + 7, &mut got).unwrap();
    assert_eq!(got, data);
    served.close().unwrap();
    drop(served);
    assert_eq!(read_back(&paths, data.len()), data);
}

#[test]
fn one_file_for_data_and_metadata_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let x = tmp.path().join("x");
    for existing in [false, true] {
        if existing {
            std::fs::write(&x, b"").unwrap();
        }
        let opts = CreateOptions {
            data: Some(x.clone()),
            meta: Some(x.clone()),
            force: true,
            ..CreateOptions::new(1 << 20)
        };
        let err = layout::create(&tmp.path().join("dev"), &opts).unwrap_err();
        assert!(err.to_string().contains("same file"), "{err}");
    }
}

#[test]
fn create_over_a_file_that_holds_something_needs_force() {
    // Was: `create --data victim.img` overwrote an existing file.
    let tmp = tempfile::tempdir().unwrap();
    let victim = tmp.path().join("victim.img");
    let mut ext4 = vec![0u8; 4 << 20];
    ext4[1080..1082].copy_from_slice(&[0x53, 0xef]);
    for (content, says) in [
        (b"SECRET database pages".repeat(1000), "not all zeros"),
        (ext4, "ext2/3/4 filesystem"),
    ] {
        std::fs::write(&victim, &content).unwrap();
        let opts = CreateOptions {
            data: Some(victim.clone()),
            ..CreateOptions::new(1 << 20)
        };
        let err = layout::create(&tmp.path().join("dev"), &opts).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(says) && msg.contains("--force"), "{msg}");
        assert_eq!(std::fs::read(&victim).unwrap(), content, "nothing written");
        assert!(!tmp.path().join("dev").join("meta").exists());
        let forced = CreateOptions {
            force: true,
            ..opts
        };
        layout::create(&tmp.path().join("dev"), &forced).unwrap();
        std::fs::remove_dir_all(tmp.path().join("dev")).unwrap();
    }
}

/// Every file of a device directory (the lsm tables too), by relative path.
fn snapshot_dir(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if !p.ends_with("control.sock") {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn inspecting_a_device_writes_nothing_on_any_backend() {
    // Was: `dedup status` on a new lsm device made it unopenable.
    for backend in dedup_core::registry::names() {
        for written in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("dev");
            let opts = CreateOptions {
                backend: backend.to_string(),
                ..CreateOptions::new(1 << 20)
            };
            layout::create(&dir, &opts).unwrap();
            let paths = DevicePaths::from_dir(&dir).unwrap();
            let data = if written {
                write_some(&paths)
            } else {
                Vec::new()
            };
            let before = snapshot_dir(&dir);
            let inspect = OpenOptions {
                for_check: true,
                ..Default::default()
            };
            let dev = layout::open(&paths, &inspect).unwrap();
            let _ = dev.stats();
            assert!(dev.check(true).unwrap().is_clean(), "{backend}");
            drop(dev);
            let after = snapshot_dir(&dir);
            let changed: Vec<_> = after
                .iter()
                .filter(|f| !before.contains(f))
                .map(|f| f.0.display().to_string())
                .collect();
            assert!(
                changed.is_empty(),
                "{backend} (written: {written}): inspection changed {changed:?}"
            );
            assert_eq!(
                before.len(),
                after.len(),
                "{backend}: inspection removed files"
            );
            if written {
                assert_eq!(read_back(&paths, data.len()), data, "{backend}");
            } else {
                drop(layout::open(&paths, &rw()).unwrap());
            }
        }
    }
}

#[test]
fn a_directory_that_cannot_be_looked_into_is_named_not_called_empty() {
    let tmp = tempfile::tempdir().unwrap();
    // A file where the directory should be: looking inside fails with
    // ENOTDIR, which is not "no device here".
    let file = tmp.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = DevicePaths::from_dir(&file).unwrap_err().to_string();
    assert!(!err.contains("create one"), "{err}");
    assert!(
        err.contains(&file.join("meta").display().to_string()),
        "{err}"
    );
    // Unreadable to its caller (only testable as a non-root user).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp.path().join("dev");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("meta"), b"").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o000)).unwrap();
        let err = DevicePaths::from_dir(&dir).unwrap_err().to_string();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(err.contains("permission denied"), "{err}");
    }
}
