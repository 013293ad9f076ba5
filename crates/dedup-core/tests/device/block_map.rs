//! `Device::block_map`, what a backup by fingerprint reads instead of the
//! data (issue 39): every logical chunk is unmapped exactly when it reads
//! as zeros, and a mapped one is named by the fingerprint of the bytes it
//! reads, on the default store (which keeps a fingerprint per chunk),
//! across a reopen; a store that keeps none by PBN says `Unknown`, never a
//! wrong fingerprint.

use dedup_core::config::Lbn;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::options::BackendParams;
use dedup_core::testrig::{config, MemDevice};
use dedup_core::{ChunkState, Device};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

const CS: usize = 4096;
const CHUNKS: u64 = 700;

/// Random writes (repeating contents), zero writes and trims.
fn churn(dev: &Device, rng: &mut StdRng) {
    for _ in 0..600 {
        let lbn = rng.random_range(0..CHUNKS - 4);
        let n = rng.random_range(1..4usize);
        let offset = lbn * CS as u64;
        match rng.random_range(0..8) {
            0 => dev.discard(offset, (n * CS) as u64, false).unwrap(),
            1 => dev.write_zeroes(offset, (n * CS) as u64, false).unwrap(),
            _ => {
                let mut buf = vec![0u8; n * CS];
                for piece in buf.chunks_mut(CS) {
                    StdRng::seed_from_u64(rng.random_range(0..200)).fill_bytes(piece);
                }
                dev.write(offset, &buf, false).unwrap();
            }
        }
    }
}

/// Check every chunk's state against what it reads; the count of each.
fn check(dev: &Device, first: Lbn, count: u64) -> (u64, u64, u64) {
    let states = dev.block_map(first, count).unwrap();
    assert_eq!(states.len() as u64, count);
    let mut seen = (0, 0, 0);
    let mut buf = vec![0u8; CS];
    for (i, state) in states.iter().enumerate() {
        let lbn = first + i as u64;
        dev.read(lbn * CS as u64, &mut buf).unwrap();
        match state {
            ChunkState::Unmapped => {
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "LBN {lbn} unmapped but not zeros"
                );
                seen.0 += 1;
            }
            ChunkState::Known(fp) => {
                assert_eq!(*fp, HashAlgo::Blake3.fingerprint(&buf), "LBN {lbn}");
                seen.1 += 1;
            }
            ChunkState::Unknown => seen.2 += 1,
        }
    }
    seen
}

#[test]
fn the_default_store_names_every_mapped_chunk_by_its_bytes() {
    let mem = MemDevice::new(CS as u32, CHUNKS, CHUNKS);
    let mut rng = StdRng::seed_from_u64(3);
    {
        let dev = mem.open().unwrap();
        churn(&dev, &mut rng);
        let (unmapped, known, unknown) = check(&dev, 0, CHUNKS);
        assert!(unmapped > 0 && known > 0, "{unmapped} {known}");
        assert_eq!(unknown, 0);
        dev.close().unwrap();
    }
    let dev = mem.open().unwrap();
    let (_, _, unknown) = check(&dev, 0, CHUNKS);
    assert_eq!(unknown, 0);
    // A window in the middle, and refusals past the end.
    check(&dev, 123, 45);
    assert!(dev.block_map(CHUNKS - 1, 2).is_err());
    assert!(dev.block_map(u64::MAX / 2, 1).is_err());
}

#[test]
fn a_store_without_fingerprints_by_chunk_says_unknown() {
    let cfg = config("inram", CS as u32, CHUNKS, CHUNKS, HashAlgo::Blake3, false);
    let mem = MemDevice::format(cfg, &BackendParams::default());
    let dev = mem.open().unwrap();
    churn(&dev, &mut StdRng::seed_from_u64(5));
    let (unmapped, known, unknown) = check(&dev, 0, CHUNKS);
    assert_eq!(known, 0);
    assert!(unmapped > 0 && unknown > 0, "{unmapped} {unknown}");
}

/// After an unclean stop (the device dropped without a close), a device
/// opened only to read recovers in RAM, and its map is what it reads.
#[test]
fn after_an_unclean_stop_the_map_is_what_the_device_reads() {
    let mem = MemDevice::new(CS as u32, CHUNKS, CHUNKS);
    let mut rng = StdRng::seed_from_u64(9);
    {
        let dev = mem.open().unwrap();
        churn(&dev, &mut rng);
        dev.flush().unwrap();
        churn(&dev, &mut rng);
        // Dropped without `close`: what was written since the flush is
        // recovered or not, as a crash leaves it.
    }
    let dev = mem
        .open_opts(dedup_core::OpenOptions {
            writable: false,
            ..mem.options()
        })
        .unwrap();
    let (unmapped, known, unknown) = check(&dev, 0, CHUNKS);
    assert!(unmapped > 0 && known > 0, "{unmapped} {known}");
    assert_eq!(unknown, 0);
}

/// A lean open (what a backup by fingerprint uses) of a packing device
/// skips rebuilding the block map and reads the same bytes and map as a
/// full open, before and after an unclean stop.
#[test]
fn a_lean_open_reads_what_a_full_open_reads() {
    let cfg = config(
        "sparse/lz4",
        CS as u32,
        CHUNKS,
        CHUNKS,
        HashAlgo::Blake3,
        false,
    );
    let mem = MemDevice::format(cfg, &BackendParams::default());
    let mut rng = StdRng::seed_from_u64(11);
    for clean in [true, false] {
        {
            let dev = mem.open_with(true).unwrap();
            churn(&dev, &mut rng);
            dev.flush().unwrap();
            if clean {
                dev.close().unwrap();
            }
        }
        let open = |lean| {
            mem.open_opts(dedup_core::OpenOptions {
                writable: false,
                lean,
                ..mem.options()
            })
            .unwrap()
        };
        let (full, lean) = (open(false), open(true));
        let mut a = vec![0u8; (CHUNKS as usize) * CS];
        let mut b = a.clone();
        full.read(0, &mut a).unwrap();
        lean.read(0, &mut b).unwrap();
        assert!(a == b, "clean {clean}: the same bytes");
        assert_eq!(
            full.block_map(0, CHUNKS).unwrap(),
            lean.block_map(0, CHUNKS).unwrap(),
            "clean {clean}"
        );
        check(&lean, 0, CHUNKS);
    }
}
