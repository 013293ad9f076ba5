//! Compression with fragment packing (issue 7): compressible chunks share
//! blocks, the rest are stored raw; repacking under random overwrites and
//! trims keeps every read equal to a plain disk's; a damaged fragment
//! fails its own chunk's read and nothing else; the hash index bound is
//! an ENOSPC that loses nothing.

use crate::common;

use common::{assert_consistent, config, read_all, MemDevice, ModelDisk};
use dedup_core::backends::BackendParams;
use dedup_core::blockfile::BlockFile;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::placement::packed::RAW_SLOT;
use dedup_core::{pack, Device, Error};
use rand::{Rng, SeedableRng};

const CS: usize = 4096;

/// A chunk whose compressibility `kind` picks: 0 random (raw), 1 a
/// quarter random (a ~1.1 KiB fragment), 2 an eighth random (~600 bytes).
fn chunk(seed: u64, kind: u8) -> Vec<u8> {
    let random = dedup_core::testdata::noise(seed, CS);
    match kind {
        0 => random,
        1 => (0..CS)
            .map(|i| {
                if i < CS / 4 {
                    random[i]
                } else {
                    random[i % 64]
                }
            })
            .collect(),
        _ => (0..CS)
            .map(|i| {
                if i < CS / 8 {
                    random[i]
                } else {
                    random[i % 64]
                }
            })
            .collect(),
    }
}

fn device(variant: &str, logical: u64, physical: u64) -> MemDevice {
    let cfg = config(
        variant,
        CS as u32,
        logical,
        physical,
        HashAlgo::Blake3,
        false,
    );
    MemDevice::format(cfg, &BackendParams::default())
}

#[test]
fn compressible_chunks_share_blocks_and_the_rest_are_stored_raw() {
    for variant in ["inram/lz4", "disktable/zstd", "lsm/lz4"] {
        let md = device(variant, 256, 256);
        let dev = md.open().unwrap();
        let mut model = ModelDisk::new(256 * CS, CS);
        for lbn in 0..96u64 {
            let c = chunk(lbn, if lbn % 6 == 0 { 0 } else { 2 });
            dev.write(lbn * CS as u64, &c, false).unwrap();
            model.write(lbn * CS as u64, &c);
        }
        // Readable from the open bins before any flush, and after.
        assert_eq!(read_all(&dev), model.read(0, 256 * CS), "{variant}");
        dev.flush().unwrap();
        let s = dev.stats();
        let p = s.packing.clone().expect("a packing device reports packing");
        assert_eq!(s.incompressible_chunks, 16, "{variant}");
        assert_eq!(p.raw_blocks, 16, "{variant}");
        assert_eq!(p.fragments, 80, "{variant}");
        assert!(p.fragments_per_block >= 2.0, "{variant}: {p:?}");
        assert_eq!(s.data_blocks_used, p.raw_blocks + p.packed_blocks);
        assert!(s.space_ratio > 2.0, "{variant}: {}", s.space_ratio);
        assert!(
            s.compression_ratio > 2.0,
            "{variant}: {}",
            s.compression_ratio
        );
        assert_eq!(s.compression, md.cfg.compression.to_string());
        assert_consistent(&dev);
        dev.close().unwrap();
        drop(dev);
        // The block map is rebuilt from the metadata at open.
        let dev = md.open().unwrap();
        assert_eq!(
            read_all(&dev),
            model.read(0, 256 * CS),
            "{variant} reopened"
        );
        let again = dev.stats();
        assert_eq!(again.data_blocks_used, s.data_blocks_used, "{variant}");
        assert_eq!(again.packing.unwrap().fragments, 80);
        dev.close().unwrap();
    }
}

/// Random overwrites and trims of chunks of mixed compressibility, GC
/// (with repacking) at random points, a reopen now and then: after every
/// step the device reads exactly as a plain disk, and `check` agrees.
#[test]
fn repacking_under_random_overwrites_and_trims_matches_a_model() {
    for (variant, seed) in [
        ("inram/lz4", 1u64),
        ("disktable/lz4", 2),
        ("cowbtree/zstd", 3),
    ] {
        const LOGICAL: u64 = 96;
        let md = device(variant, LOGICAL, 64);
        let mut dev = Some(md.open().unwrap());
        let mut model = ModelDisk::new(LOGICAL as usize * CS, CS);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (mut repacked, mut moved) = (0u64, 0u64);
        for step in 0..400 {
            let d = dev.as_ref().unwrap();
            match rng.random_range(0..100) {
                0..60 => {
                    let lbn = rng.random_range(0..LOGICAL);
                    let n = rng.random_range(1..4).min(LOGICAL - lbn);
                    let mut buf = Vec::new();
                    for _ in 0..n {
                        // A small pool of contents, so duplicates are common.
                        let id = rng.random_range(0..40u64);
                        buf.extend(chunk(id, (id % 3) as u8));
                    }
                    let fua = rng.random_range(0..8) == 0;
                    match d.write(lbn * CS as u64, &buf, fua) {
                        Ok(()) => model.write(lbn * CS as u64, &buf),
                        Err(Error::NoSpace { .. }) => {
                            // Nothing changed: the model stays as it is.
                        }
                        Err(e) => panic!("{variant} step {step}: {e}"),
                    }
                }
                60..80 => {
                    let lbn = rng.random_range(0..LOGICAL);
                    let n = rng.random_range(1..8).min(LOGICAL - lbn);
                    d.discard(lbn * CS as u64, n * CS as u64, false).unwrap();
                    model.zero(lbn * CS as u64, n * CS as u64);
                }
                80..90 => {
                    let r = d.gc().unwrap();
                    repacked += r.blocks_repacked;
                    moved += r.fragments_moved;
                    assert!(r.repack_blocks_written <= r.blocks_repacked);
                }
                90..95 => d.flush().unwrap(),
                _ => {
                    dev.take().unwrap().close().unwrap();
                    dev = Some(md.open().unwrap());
                }
            }
            let d = dev.as_ref().unwrap();
            assert_eq!(
                read_all(d),
                model.read(0, LOGICAL as usize * CS),
                "{variant}: step {step}"
            );
        }
        let d = dev.take().unwrap();
        assert_consistent(&d);
        assert!(
            repacked > 0 && moved > 0,
            "{variant}: no repack happened ({repacked} blocks, {moved} fragments)"
        );
        d.close().unwrap();
    }
}

/// After overwriting most of what was written, GC gives the space of the
/// dead fragments back by repacking the survivors.
#[test]
fn gc_repacks_mostly_dead_blocks_into_fewer() {
    let md = device("disktable/lz4", 512, 512);
    let dev = md.open().unwrap();
    for lbn in 0..400u64 {
        dev.write(lbn * CS as u64, &chunk(1000 + lbn, 1), false)
            .unwrap();
    }
    dev.flush().unwrap();
    let before = dev.stats().data_blocks_used;
    // Keep every fourth chunk.
    for lbn in (0..400u64).filter(|l| l % 4 != 0) {
        dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
    }
    let r = dev.gc().unwrap();
    let after = dev.stats();
    assert!(r.blocks_repacked > 0, "{r:?}");
    assert!(
        after.data_blocks_used * 3 <= before,
        "{before} blocks before, {} after: {r:?}",
        after.data_blocks_used
    );
    assert_eq!(
        r.bytes_reclaimed,
        (before - after.data_blocks_used) * CS as u64
    );
    for lbn in (0..400u64).filter(|l| l % 4 == 0) {
        let mut b = vec![0u8; CS];
        dev.read(lbn * CS as u64, &mut b).unwrap();
        assert_eq!(b, chunk(1000 + lbn, 1), "lbn {lbn}");
    }
    assert_consistent(&dev);
}

fn find(dev: &Device, lbn: u64) -> (u64, u64) {
    let (pbn, _) = dev.inspect_lbn(lbn).unwrap().expect("mapped");
    dev.config().addressing().split(pbn)
}

#[test]
fn a_damaged_fragment_fails_its_own_chunk_only() {
    let md = device("inram/lz4", 64, 64);
    let dev = md.open().unwrap();
    for lbn in 0..8u64 {
        dev.write(lbn * CS as u64, &chunk(lbn, 2), false).unwrap();
    }
    dev.flush().unwrap();
    let (block, slot) = find(&dev, 3);
    assert_ne!(slot, RAW_SLOT);
    let at = md.cfg.pbn_offset(block);
    let mut b = vec![0u8; CS];
    md.data.read_at(&mut b, at).unwrap();
    let (off, len, _) = pack::slots(&b).unwrap()[slot as usize];
    let mut bad = b.clone();
    bad[off + len / 2] ^= 0x20;
    md.data.write_at(&bad, at).unwrap();
    let mut out = vec![0u8; CS];
    let e = dev.read(3 * CS as u64, &mut out).unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(e.to_string().contains("slot"), "{e}");
    for lbn in (0..8u64).filter(|&l| l != 3) {
        dev.read(lbn * CS as u64, &mut out).unwrap();
        assert_eq!(out, chunk(lbn, 2), "lbn {lbn}");
    }
    let report = dev.check(true).unwrap();
    assert!(!report.is_clean(), "check sees the damaged chunk");
    // A torn slot table fails every chunk of that block, and only those.
    let mut torn = b.clone();
    torn[9] ^= 1;
    md.data.write_at(&torn, at).unwrap();
    for lbn in 0..8u64 {
        let r = dev.read(lbn * CS as u64, &mut out);
        if find(&dev, lbn).0 == block {
            assert_eq!(r.unwrap_err().errno(), libc::EIO);
        } else {
            r.unwrap();
            assert_eq!(out, chunk(lbn, 2));
        }
    }
    // A repack leaves a damaged block alone rather than copy garbage.
    for lbn in 4..8u64 {
        dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
    }
    let r = dev.gc().unwrap();
    assert!(r.damaged_blocks >= 1, "{r:?}");
}

#[test]
fn a_full_hash_index_is_enospc_and_loses_nothing() {
    // 2 blocks, lz4: the index has room for 8 chunks.
    let md = device("inram/lz4", 64, 2);
    let dev = md.open().unwrap();
    let mut written = 0u64;
    let err = loop {
        match dev.write(written * CS as u64, &chunk(7000 + written, 2), false) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written <= 8, "the index bound was not enforced");
    };
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert_eq!(written, 8);
    dev.flush().unwrap();
    for lbn in 0..written {
        let mut b = vec![0u8; CS];
        dev.read(lbn * CS as u64, &mut b).unwrap();
        assert_eq!(b, chunk(7000 + lbn, 2));
    }
    assert_consistent(&dev);
}

#[test]
fn thin_takes_lz4_or_none_and_large_chunks_do_not_pack() {
    let mut c = config("thin", CS as u32, 64, 64, HashAlgo::Blake3, false);
    c.compression = dedup_core::compress::Compression::Zstd(3);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("lz4 or none"), "{e}");
    let mut c = config("disktable/lz4", 128 << 10, 64, 64, HashAlgo::Blake3, false);
    c.chunk_size = 128 << 10;
    c.logical_size = 64 * (128 << 10);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("--compression none"), "{e}");
}

/// Review regression: a full packing device whose space was trimmed takes
/// new writes at once (the blocks freed wait only for the commit that
/// making room gives them).
#[test]
fn a_full_device_takes_writes_again_after_a_trim() {
    for variant in ["inram/lz4", "disktable/lz4", "lsm/lz4"] {
        let md = device(variant, 64, 16);
        let dev = md.open().unwrap();
        let mut n = 0u64;
        while n < 64 && dev.write(n * CS as u64, &chunk(500 + n, 0), false).is_ok() {
            n += 1;
        }
        assert_eq!(n, 16, "{variant}: raw chunks fill one block each");
        dev.flush().unwrap();
        dev.discard(0, 8 * CS as u64, false).unwrap();
        dev.write(0, &chunk(9999, 0), false)
            .unwrap_or_else(|e| panic!("{variant}: {e}"));
        assert_consistent(&dev);
    }
}

/// Review regression: blocks whose every slot lives cannot be merged, so
/// GC neither rewrites them nor loops over them; and a nearly full device
/// still repacks what its free blocks can take.
#[test]
fn gc_leaves_full_slot_blocks_alone_and_repacks_near_full() {
    let md = device("inram/lz4", 512, 64);
    let dev = md.open().unwrap();
    // Tiny fragments: 14 to a block, every slot live.
    for lbn in 0..140u64 {
        let mut c = vec![0u8; CS];
        c[..8].copy_from_slice(&(lbn + 1).to_le_bytes());
        dev.write(lbn * CS as u64, &c, false).unwrap();
    }
    dev.flush().unwrap();
    let r = dev.gc().unwrap();
    assert_eq!(r.fragments_moved, 0, "{r:?}");
    let r = dev.gc().unwrap();
    assert_eq!(r.fragments_moved, 0, "{r:?}");
    // Fill the rest with ~1.1 KiB fragments, then kill two of each three.
    let mut lbn = 140u64;
    while lbn < 512 && dev.write(lbn * CS as u64, &chunk(lbn, 1), false).is_ok() {
        lbn += 1;
    }
    dev.flush().unwrap();
    let full = dev.stats().data_blocks_used;
    for l in (140..lbn).filter(|l| l % 3 != 0) {
        dev.discard(l * CS as u64, CS as u64, false).unwrap();
    }
    let r = dev.gc().unwrap();
    assert!(r.blocks_repacked > 0, "{r:?}");
    assert!(dev.stats().data_blocks_used < full);
    for l in (140..lbn).filter(|l| l % 3 == 0) {
        let mut b = vec![0u8; CS];
        dev.read(l * CS as u64, &mut b).unwrap();
        assert_eq!(b, chunk(l, 1));
    }
    assert_consistent(&dev);
}
