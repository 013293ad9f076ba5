//! `Device::map_known`, what a restore by fingerprint writes instead of
//! the data (issue 39), on every variant against a plain disk: an image
//! is remembered by its chunks' fingerprints, the device is churned, and
//! the image is put back by mapping every fingerprint the device still
//! holds and writing only the rest. The device then reads the image,
//! before and after a reopen, its metadata checks clean, and a collection
//! takes nothing it needs. Verify mode maps nothing (it shares a chunk
//! only after comparing bytes); an LBN past the end is refused.

use crate::common;

use common::{assert_consistent, read_all, variant_device, ModelDisk, Patterns, VARIANTS};
use dedup_core::fingerprint::{Fingerprint, HashAlgo};
use dedup_core::testrig::MemDevice;
use dedup_core::Device;
use rand::{rngs::StdRng, Rng, SeedableRng};

const CS: usize = 4096;
const CHUNKS: u64 = 256;

fn device(variant: &str) -> MemDevice {
    variant_device(variant, CS as u32, CHUNKS, CHUNKS * 2)
}

/// Random writes of a few patterns over 1-4 chunks, and trims, on the
/// device and the model alike.
fn churn(dev: &Device, model: &mut ModelDisk, patterns: &Patterns, rng: &mut StdRng, n: usize) {
    for _ in 0..n {
        let lbn = rng.random_range(0..CHUNKS - 4);
        let len = rng.random_range(1..=4usize) * CS;
        let offset = lbn * CS as u64;
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

/// Put `image` back on `dev` by fingerprint: zero chunks trimmed, the
/// rest mapped where the device holds them and written where it does
/// not. Returns the chunks written.
fn put_back(dev: &Device, image: &ModelDisk) -> usize {
    let mut known: Vec<(u64, Fingerprint)> = Vec::new();
    for lbn in 0..image.chunks() {
        let chunk = image.chunk(lbn);
        if chunk.iter().all(|&b| b == 0) {
            dev.discard((lbn * CS) as u64, CS as u64, false).unwrap();
        } else {
            known.push((lbn as u64, HashAlgo::Blake3.fingerprint(chunk)));
        }
    }
    let done = dev.map_known(&known).unwrap();
    assert_eq!(done.len(), known.len());
    let mut written = 0;
    for (&(lbn, _), ok) in known.iter().zip(done) {
        if !ok {
            dev.write(lbn * CS as u64, image.chunk(lbn as usize), false)
                .unwrap();
            written += 1;
        }
    }
    dev.flush().unwrap();
    written
}

#[test]
fn an_image_put_back_by_fingerprint_reads_back_on_every_variant() {
    let patterns = Patterns::new(24, CS);
    for (seed, variant) in VARIANTS.iter().enumerate() {
        let mem = device(variant);
        let mut rng = StdRng::seed_from_u64(seed as u64);
        let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
        let image = {
            let dev = mem.open().unwrap();
            churn(&dev, &mut model, &patterns, &mut rng, 150);
            let image = model.clone();
            churn(&dev, &mut model, &patterns, &mut rng, 150);
            // Half the time a collection first takes what the churn
            // dropped, which must then be written again.
            let collected = seed % 2 == 1 && dev.gc().unwrap().reclaimed > 0;
            let written = put_back(&dev, &image);
            assert_eq!(
                read_all(&dev),
                image.bytes,
                "{variant}: the image, put back"
            );
            if !collected {
                assert_eq!(written, 0, "{variant}: every content is still stored");
            }
            assert_consistent(&dev);
            dev.gc().unwrap();
            assert_eq!(read_all(&dev), image.bytes, "{variant}: after gc");
            dev.close().unwrap();
            image
        };
        let dev = mem.open().unwrap();
        assert_eq!(read_all(&dev), image.bytes, "{variant}: after a reopen");
        assert_consistent(&dev);
        // The same image again changes nothing: every chunk is already
        // where it belongs.
        let before = dev.stats();
        assert_eq!(put_back(&dev, &image), 0, "{variant}");
        let after = dev.stats();
        assert_eq!(after.chunks_stored, before.chunks_stored, "{variant}");
        assert_eq!(
            after.counters.unique_writes, before.counters.unique_writes,
            "{variant}"
        );
        assert_consistent(&dev);
    }
}

/// A chunk overwritten (held by the hash index alone, awaiting a
/// collection) is taken back by a mapping; once collected, it is missing
/// and left to the caller.
#[test]
fn garbage_is_taken_back_until_collected() {
    let patterns = Patterns::new(4, CS);
    let mem = device("sparse/lz4");
    let dev = mem.open().unwrap();
    let (a, b) = (patterns.chunk(1).to_vec(), patterns.chunk(2).to_vec());
    let fa = HashAlgo::Blake3.fingerprint(&a);
    dev.write(0, &a, false).unwrap();
    dev.write(0, &b, false).unwrap();
    assert_eq!(dev.stats().chunks_awaiting_gc, 1);
    assert_eq!(dev.map_known(&[(7, fa)]).unwrap(), vec![true]);
    assert_eq!(dev.stats().chunks_awaiting_gc, 0);
    let mut buf = vec![0u8; CS];
    dev.read(7 * CS as u64, &mut buf).unwrap();
    assert_eq!(buf, a);
    // Overwritten again and collected: gone, so left to the caller.
    dev.write(7 * CS as u64, &b, false).unwrap();
    dev.gc().unwrap();
    assert_eq!(dev.map_known(&[(9, fa)]).unwrap(), vec![false]);
    dev.read(9 * CS as u64, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 0), "a miss changes nothing");
    assert_consistent(&dev);
}

#[test]
fn verify_mode_maps_nothing_and_an_lbn_past_the_end_is_refused() {
    let patterns = Patterns::new(4, CS);
    let a = patterns.chunk(1).to_vec();
    let fa = HashAlgo::Blake3.fingerprint(&a);
    let mem = MemDevice::with(CS as u32, CHUNKS, CHUNKS, HashAlgo::Blake3, true);
    let dev = mem.open().unwrap();
    dev.write(0, &a, false).unwrap();
    assert_eq!(dev.map_known(&[(3, fa)]).unwrap(), vec![false]);

    let mem = MemDevice::new(CS as u32, CHUNKS, CHUNKS);
    let dev = mem.open().unwrap();
    dev.write(0, &a, false).unwrap();
    assert!(dev.map_known(&[(CHUNKS, fa)]).is_err());
    assert!(dev.map_known(&[(u64::MAX, fa)]).is_err());
    // Refused whole: the block before the bad one was not mapped either.
    assert!(dev.map_known(&[(1, fa), (CHUNKS, fa)]).is_err());
    assert_eq!(dev.inspect_lbn(1).unwrap(), None);
    assert_consistent(&dev);
}
