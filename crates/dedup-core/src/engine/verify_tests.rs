//! Verify mode against real fingerprint collisions. A 4-bit test-only hash
//! (`HashAlgo::Weak4`) makes distinct chunks collide all the time; with
//! verify on, the device must still behave exactly like a plain disk.

use rand::{Rng, SeedableRng};

use crate::engine::Device;
use crate::fingerprint::HashAlgo;
use crate::testrig::MemDevice;

const CS: usize = 4096;
const CHUNKS: u64 = 16;

/// The crate's in-memory device of the default store, 4-bit fingerprints,
/// verify on.
fn device(physical_chunks: u64) -> MemDevice {
    MemDevice::with(CS as u32, CHUNKS, physical_chunks, HashAlgo::Weak4, true)
}

fn content(n: u8) -> Vec<u8> {
    (0..CS)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(n.wrapping_mul(97)) | 1)
        .collect()
}

fn read_all(dev: &Device) -> Vec<u8> {
    let mut b = vec![0u8; (CHUNKS as usize) * CS];
    dev.read(0, &mut b).unwrap();
    b
}

fn assert_clean(dev: &Device) {
    let r = dev.check(true).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
}

#[test]
fn two_colliding_chunks_in_one_request_are_both_kept() {
    let (a, b) = (0..=255u8)
        .flat_map(|x| (0..=255u8).map(move |y| (x, y)))
        .find(|&(x, y)| {
            x != y
                && HashAlgo::Weak4.fingerprint(&content(x))
                    == HashAlgo::Weak4.fingerprint(&content(y))
        })
        .expect("4-bit fingerprints collide");
    let mem = device(CHUNKS);
    let dev = mem.open().unwrap();
    let mut buf = content(a);
    buf.extend_from_slice(&content(b));
    dev.write(0, &buf, false).unwrap();
    assert_eq!(
        read_all(&dev)[..2 * CS],
        buf[..],
        "each LBN reads its own bytes"
    );
    assert_eq!(dev.stats().counters.verify_mismatches, 1);
    dev.write(4 * CS as u64, &buf, false).unwrap();
    assert_eq!(read_all(&dev)[4 * CS..6 * CS], buf[..]);
    assert_clean(&dev);
}

#[test]
fn random_workloads_with_constant_collisions_match_a_plain_disk() {
    for seed in 0..40u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mem = device(if seed % 2 == 0 {
            CHUNKS + 8
        } else {
            3 * CHUNKS
        });
        let mut dev = mem.open().unwrap();
        let size = CHUNKS as usize * CS;
        let mut model = vec![0u8; size];
        for step in 0..300 {
            match rng.random_range(0..10) {
                0..=4 => {
                    let lbn = rng.random_range(0..CHUNKS) as usize;
                    let n = rng.random_range(1..=4).min(CHUNKS as usize - lbn);
                    let buf: Vec<u8> = (0..n)
                        .flat_map(|_| content(rng.random_range(0..24)))
                        .collect();
                    if dev.write((lbn * CS) as u64, &buf, false).is_ok() {
                        model[lbn * CS..lbn * CS + buf.len()].copy_from_slice(&buf);
                    } else {
                        // ENOSPC: resync the model from what the device holds.
                        model = read_all(&dev);
                    }
                }
                5..=6 => {
                    let off = rng.random_range(0..size);
                    let len = rng.random_range(1..=(size - off).min(3 * CS));
                    let fill = rng.random::<u8>();
                    let buf = vec![fill; len];
                    if dev.write(off as u64, &buf, false).is_ok() {
                        model[off..off + len].copy_from_slice(&buf);
                    } else {
                        model = read_all(&dev);
                    }
                }
                7 => {
                    let lbn = rng.random_range(0..CHUNKS) as usize;
                    dev.discard((lbn * CS) as u64, CS as u64, false).unwrap();
                    model[lbn * CS..(lbn + 1) * CS].fill(0);
                }
                8 => {
                    dev.gc().unwrap();
                }
                _ => {
                    dev.close().unwrap();
                    drop(dev);
                    dev = mem.open().unwrap();
                }
            }
            assert_eq!(read_all(&dev), model, "seed {seed} step {step}");
            assert_clean(&dev);
        }
        assert!(
            dev.stats().counters.verify_mismatches > 0 || seed > 0,
            "collisions happened"
        );
    }
}
