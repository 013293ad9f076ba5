//! Metadata older than its data, for every backend: a metadata copy put
//! back from a backup, and a damaged newest superblock slot that leaves only
//! the older one. Both used to be accepted and serve another time's data
//! with `check` clean; now they are refused (`Error::Stale`, naming both
//! generations), and `accept_stale` (`check --repair --data`) keeps the
//! older metadata only after verifying every chunk: each block then reads
//! its content as of that metadata, or zeros, never something else.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::{MemDevice, Patterns};
use dedup_core::backends::{BackendParams, OpenOptions};
use dedup_core::blockfile::sim::SimDisk;
use dedup_core::blockfile::BlockFile;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::superblock::{Superblock, SUPERBLOCK_SIZE};
use dedup_core::{Device, Error};

const CHUNKS: u64 = 24;
const CS: usize = 4096;

fn open(md: &MemDevice, meta: &Arc<SimDisk>, accept_stale: bool) -> dedup_core::Result<Device> {
    md.open_stale(md.data.clone(), meta.clone(), accept_stale)
}

fn format(variant: &str) -> MemDevice {
    let cfg = common::config(
        variant,
        CS as u32,
        CHUNKS,
        CHUNKS + 8,
        HashAlgo::Blake3,
        false,
    );
    MemDevice::format(cfg, &common::params(variant, BackendParams::default()))
}

/// Write `shift`ed patterns over the first two thirds and stop cleanly;
/// what the device holds.
fn generation_of_writes(md: &MemDevice, shift: usize) -> Vec<u8> {
    let p = Patterns::new(7, CS);
    let dev = md.open().unwrap();
    for lbn in 0..CHUNKS * 2 / 3 {
        dev.write(lbn * CS as u64, p.chunk((lbn as usize + shift) % 7), false)
            .unwrap();
    }
    let contents = common::read_all(&dev);
    dev.close().unwrap();
    contents
}

/// Write, take a copy of the metadata (for lsm, its files too), write
/// again, and put the copy back, as an admin restoring a backup would:
/// what the device held at the copy, and the metadata put back.
fn backup_put_back(md: &MemDevice) -> (Vec<u8>, Arc<SimDisk>) {
    let then = generation_of_writes(md, 0);
    let backup = md.meta.contents();
    let aux_backup = common::scratch_dir();
    common::copy_dir(md.aux.path(), aux_backup.path());
    generation_of_writes(md, 3);
    std::fs::remove_dir_all(md.aux.path()).unwrap();
    common::copy_dir(aux_backup.path(), md.aux.path());
    (
        then,
        Arc::new(SimDisk::from_image(backup, "meta", Arc::default())),
    )
}

/// After `accept_stale`: every block reads as in `then`, or zeros; check is clean.
fn assert_rolled_back(dev: &Device, then: &[u8], what: &str) {
    let report = dev.check(true).unwrap();
    assert!(report.is_clean(), "{what}: {:#?}", report.problems);
    let got = common::read_all(dev);
    for (lbn, (g, t)) in got.chunks(CS).zip(then.chunks(CS)).enumerate() {
        assert!(
            g == t || g.iter().all(|&b| b == 0),
            "{what}: block {lbn} reads neither its content as of the kept metadata nor zeros"
        );
    }
}

#[test]
fn a_metadata_copy_put_back_from_a_backup_is_refused() {
    for &variant in common::VARIANTS {
        let md = format(variant);
        let (then, meta) = backup_put_back(&md);
        match open(&md, &meta, false) {
            Err(Error::Stale {
                meta_generation,
                data_generation,
                damaged_slot: false,
                ..
            }) => assert!(meta_generation < data_generation, "{variant}"),
            other => panic!(
                "{variant}: stale metadata must be refused, got {:?}",
                other.map(|_| ())
            ),
        }

        let dev = open(&md, &meta, true).unwrap_or_else(|e| panic!("{variant}: {e}"));
        assert_rolled_back(&dev, &then, variant);
        dev.close().unwrap();
        // Kept: it is the device's metadata now, and opens as such.
        drop(open(&md, &meta, false).unwrap_or_else(|e| panic!("{variant}: {e}")));
    }
}

#[test]
fn a_damaged_newest_superblock_slot_is_damage_not_a_roll_back() {
    for &variant in common::VARIANTS {
        let md = format(variant);
        let written = generation_of_writes(&md, 1);
        let sb = Superblock::read(md.meta.as_ref(), Path::new("meta")).unwrap();
        let newest = (sb.generation % 2) * SUPERBLOCK_SIZE as u64;
        md.meta.write_at(&[0x5a], newest + 100).unwrap();
        match md.open() {
            Err(
                e @ Error::Stale {
                    damaged_slot: true, ..
                },
            ) => assert!(e.to_string().contains("slot is damaged"), "{variant}: {e}"),
            other => panic!(
                "{variant}: a damaged newest slot must be refused as damage, got {:?}",
                other.map(|_| ())
            ),
        }
        // Repair keeps what the older slot describes, verified.
        let dev = open(&md, &md.meta, true).unwrap_or_else(|e| panic!("{variant}: {e}"));
        assert_rolled_back(&dev, &written, variant);
    }
}

#[test]
fn inspection_never_accepts_stale_metadata() {
    let md = format("sparse");
    generation_of_writes(&md, 0);
    let backup = md.meta.contents();
    generation_of_writes(&md, 2);
    let meta = Arc::new(SimDisk::from_image(backup, "meta", Arc::default()));
    let opts = OpenOptions {
        writable: false,
        accept_stale: true,
        for_check: true,
        aux_dir: Some(common::lsm_dir(md.aux.path())),
        ..Default::default()
    };
    let r = Device::open(
        Box::new(md.data.clone()) as Box<dyn BlockFile>,
        Box::new(meta),
        &opts,
        None,
    );
    assert!(matches!(r, Err(Error::Stale { .. })), "{:?}", r.map(|_| ()));
}

#[test]
fn a_device_made_before_generations_opens_and_starts_recording_them() {
    let md = format("sparse");
    let written = generation_of_writes(&md, 4);
    // The old data header: its identity sealed over the whole 4 KiB.
    let mut header = vec![0u8; 4096];
    md.data.read_at(&mut header, 0).unwrap();
    header[48..].fill(0);
    let crc = crc32c::crc32c(&header[..4092]);
    header[4092..].copy_from_slice(&crc.to_le_bytes());
    md.data.write_at(&header, 0).unwrap();

    let dev = md.open().unwrap();
    assert_eq!(common::read_all(&dev), written);
    dev.close().unwrap();
    drop(dev);
    let g = dedup_core::generation::read(md.data.as_ref(), &md.cfg.uuid)
        .unwrap()
        .generation;
    let sb = Superblock::read(md.meta.as_ref(), Path::new("meta")).unwrap();
    assert_eq!(g, sb.generation);
    assert_eq!(common::read_all(&md.open().unwrap()), written);
}

#[test]
fn an_interrupted_repair_leaves_the_device_refused_not_served_unverified() {
    // Was: keeping stale metadata raised its generation at open, before
    // the verification; a repair killed during it left metadata that the
    // next serve took as current, unverified.
    for &variant in common::VARIANTS {
        let md = format(variant);
        let (_, meta) = backup_put_back(&md);
        // The repair dies before it is done: here, the data device refuses
        // its writes, so the open fails somewhere after the metadata's.
        let faulty = common::FaultyBlockFile::new(md.data.clone());
        faulty
            .fail_writes
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let opts = OpenOptions {
            writable: true,
            accept_stale: true,
            aux_dir: Some(common::lsm_dir(md.aux.path())),
            ..Default::default()
        };
        let interrupted = Device::open(Box::new(faulty), Box::new(meta.clone()), &opts, None);
        assert!(interrupted.is_err(), "{variant}: the repair was to fail");
        drop(interrupted);
        match open(&md, &meta, false) {
            Err(Error::Stale { .. }) => {}
            other => panic!(
                "{variant}: after an interrupted repair the device must still be refused, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}
