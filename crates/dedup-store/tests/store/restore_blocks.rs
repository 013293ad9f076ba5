//! Restores of stream backups onto a deduplicating device by fingerprint
//! (issue 39), against a plain model of the device: a RAM image beside
//! the chunks the device stores, by fingerprint. Random writes and trims,
//! backups, deletes, repository collections and device collections (the
//! chunks no block holds dropped) in any order; every restore of a live
//! backup leaves the device reading that backup's image, and writes the
//! bytes of exactly the blocks whose contents the device no longer held.
//! A repository whose segments cannot be the device's chunks writes the
//! image whole and says why; damage is named and written as zeros; a
//! device too small is refused with nothing changed.

use crate::blocks_support;

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

use blocks_support::{content, encrypted, options, BS};
use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use dedup_store::backup_blocks::{BlockMap, BlockState};
use dedup_store::config::KeyedOf;
use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::{
    container_name, BlockTarget, BlocksRestored, GcOptions, RepoOptions, Repository, RestorePass,
    Segmenting,
};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A deduplicating device in RAM: what it reads, and the chunks it keeps
/// by fingerprint (those blocks hold, and garbage until `collect`).
struct Device {
    inner: Mutex<Inner>,
    /// Whether `map` names blocks by fingerprint (else `Unknown`).
    names_blocks: bool,
}

struct Inner {
    image: Vec<u8>,
    stored: HashMap<Fingerprint, Vec<u8>>,
    /// Bytes written by `write`, blocks mapped by `map_known`.
    written: u64,
    mapped: u64,
}

fn fp(bytes: &[u8]) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(bytes)
}

impl Device {
    fn new(blocks: usize) -> Device {
        Device {
            inner: Mutex::new(Inner {
                image: vec![0; blocks * BS],
                stored: HashMap::new(),
                written: 0,
                mapped: 0,
            }),
            names_blocks: true,
        }
    }

    fn image(&self) -> Vec<u8> {
        self.inner.lock().unwrap().image.clone()
    }

    /// A client's write of whole blocks from `block`.
    fn put(&self, block: usize, data: &[u8]) {
        self.inner.lock().unwrap().store(block * BS, data);
    }

    /// Drop every stored chunk no block holds (the device's gc).
    fn collect(&self) {
        let mut d = self.inner.lock().unwrap();
        let held: std::collections::HashSet<Fingerprint> = d.image.chunks(BS).map(fp).collect();
        d.stored.retain(|f, _| held.contains(f));
    }

    /// Whether the device stores these bytes now.
    fn holds(&self, bytes: &[u8]) -> bool {
        self.inner.lock().unwrap().stored.contains_key(&fp(bytes))
    }

    fn counts(&self) -> (u64, u64) {
        let d = self.inner.lock().unwrap();
        (d.written, d.mapped)
    }
}

impl Inner {
    fn store(&mut self, offset: usize, data: &[u8]) {
        self.image[offset..offset + data.len()].copy_from_slice(data);
        let (first, last) = (offset / BS, (offset + data.len()).div_ceil(BS));
        for b in first..last {
            let chunk = self.image[b * BS..(b + 1) * BS].to_vec();
            if chunk.iter().any(|&x| x != 0) {
                self.stored.insert(fp(&chunk), chunk);
            }
        }
    }
}

impl BlockMap for Device {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn blocks(&self) -> u64 {
        (self.inner.lock().unwrap().image.len() / BS) as u64
    }
    fn hash(&self) -> HashAlgo {
        HashAlgo::Blake3
    }
    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>> {
        let d = self.inner.lock().unwrap();
        let blocks = d.image.chunks(BS).skip(first as usize).take(count as usize);
        Ok(blocks
            .map(|b| match b.iter().all(|&x| x == 0) {
                true => BlockState::Zero,
                false if self.names_blocks => BlockState::Known(fp(b)),
                false => BlockState::Unknown,
            })
            .collect())
    }
}

impl BlockTarget for Device {
    fn map_known(&self, blocks: &[(u64, Fingerprint)]) -> io::Result<Vec<bool>> {
        let mut d = self.inner.lock().unwrap();
        Ok(blocks
            .iter()
            .map(|(block, f)| match d.stored.get(f).cloned() {
                Some(bytes) => {
                    let at = *block as usize * BS;
                    d.image[at..at + BS].copy_from_slice(&bytes);
                    d.mapped += 1;
                    true
                }
                None => false,
            })
            .collect())
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut d = self.inner.lock().unwrap();
        d.written += data.len() as u64;
        d.store(offset as usize, data);
        Ok(())
    }
    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut d = self.inner.lock().unwrap();
        d.image[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

fn fixed(dir: &std::path::Path) -> Repository {
    Repository::init_with(dir, options(Segmenting::Fixed { size: 4096 })).unwrap()
}

/// Writes and trims over `n` random runs of 1-8 blocks.
fn churn(dev: &Device, rng: &mut StdRng, n: usize, pool: u64) {
    let blocks = dev.blocks() as usize;
    for _ in 0..n {
        let first = rng.random_range(0..blocks - 8);
        let count = rng.random_range(1..=8);
        if rng.random_range(0..5) == 0 {
            dev.zero((first * BS) as u64, (count * BS) as u64).unwrap();
            continue;
        }
        let mut data = Vec::with_capacity(count * BS);
        for _ in 0..count {
            data.extend_from_slice(&content(rng, pool));
        }
        dev.put(first, &data);
    }
}

fn restore(repo: &Repository, name: &str, dev: &Device) -> BlocksRestored {
    let (mut compared, mut wrote) = (0u64, 0u64);
    let r = repo
        .restore_blocks(name, dev, &mut |pass, done| match pass {
            RestorePass::Compare => {
                assert!(done >= compared);
                compared = done;
            }
            RestorePass::Write => {
                assert!(done >= wrote);
                wrote = done;
            }
        })
        .unwrap();
    if r.by_fingerprint {
        assert_eq!(compared, r.bytes, "the first pass reaches the end");
    }
    r
}

/// The blocks of `image` whose (non-zero) contents `dev` does not hold.
fn lacking(dev: &Device, image: &[u8]) -> u64 {
    (image.chunks(BS))
        .filter(|b| b.iter().any(|&x| x != 0) && !dev.holds(b))
        .count() as u64
}

/// The blocks of `image` whose (non-zero) contents no block of `dev`
/// holds: what a restore from an encrypted repository writes, since it
/// finds plain fingerprints in the device's map (chunks stored but mapped
/// nowhere are not found).
fn lacking_mapped(dev: &Device, image: &[u8]) -> u64 {
    let now = dev.image();
    let held: std::collections::HashSet<&[u8]> = now.chunks(BS).collect();
    (image.chunks(BS))
        .filter(|b| b.iter().any(|&x| x != 0) && !held.contains(b))
        .count() as u64
}

/// The (non-zero) blocks of `image` that `dev` does not hold where they
/// are.
fn differing(dev: &Device, image: &[u8]) -> u64 {
    let now = dev.image();
    (image.chunks(BS).zip(now.chunks(BS)))
        .filter(|(b, d)| b.iter().any(|&x| x != 0) && b != d)
        .count() as u64
}

#[test]
fn restores_by_fingerprint_write_only_what_the_device_lacks() {
    for seed in 0..8u64 {
        let tmp = tempfile::tempdir().unwrap();
        // The last two encrypted: blocks are compared through the keyed
        // fingerprints, and mapped by the plain ones the device's map
        // gives.
        let sealed = seed >= 6;
        let _p = sealed.then(|| for_this_thread(b"device restores"));
        let repo = match sealed {
            true => Repository::init_with(tmp.path(), encrypted(Segmenting::Fixed { size: 4096 }))
                .unwrap(),
            false => fixed(tmp.path()),
        };
        // Recipes of many parts, so steps and parts end apart.
        if seed % 2 == 1 {
            repo.set_recipe_part_segments(300);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let dev = Device::new(3 * 1024 + 300);
        let mut live: Vec<(String, Vec<u8>)> = Vec::new();
        for round in 0..16 {
            match rng.random_range(0..6) {
                0 if live.len() > 1 => {
                    let (name, _) = live.remove(rng.random_range(0..live.len()));
                    repo.delete_backup(&name).unwrap();
                    repo.gc(&GcOptions::default()).unwrap();
                }
                1 | 2 if !live.is_empty() => {
                    if rng.random_bool(0.5) {
                        dev.collect();
                    }
                    let (name, image) = &live[rng.random_range(0..live.len())];
                    let lacks = lacking(&dev, image);
                    let differs = differing(&dev, image);
                    let lacks_mapped = lacking_mapped(&dev, image);
                    let before = dev.counts();
                    let r = restore(&repo, name, &dev);
                    assert!(
                        dev.image() == *image,
                        "seed {seed} round {round}: {name} restored"
                    );
                    assert!(r.by_fingerprint && r.damaged.is_empty(), "{r:?}");
                    let (written, mapped) = dev.counts();
                    assert_eq!(r.bytes_written, written - before.0);
                    assert_eq!(r.blocks_mapped, mapped - before.1);
                    if sealed {
                        assert_eq!(
                            r.bytes_written,
                            lacks_mapped * BS as u64,
                            "seed {seed} round {round}: written only what no block held"
                        );
                        assert_eq!(r.blocks_mapped, differs - lacks_mapped);
                        assert_eq!(
                            r.blocks_unchanged + r.blocks_mapped + r.blocks_zeroed + lacks_mapped,
                            r.blocks
                        );
                        continue;
                    }
                    assert_eq!(
                        r.bytes_written,
                        lacks * BS as u64,
                        "seed {seed} round {round}: written only what it lacked"
                    );
                    assert_eq!(
                        r.blocks_unchanged + r.blocks_mapped + r.blocks_zeroed + lacks,
                        r.blocks
                    );
                }
                _ => {
                    let n = rng.random_range(1..400);
                    churn(&dev, &mut rng, n, 3000);
                    let name = format!("dev-{round}");
                    let image = dev.image();
                    repo.backup_stream(&name, "dev", &image[..]).unwrap();
                    live.push((name, image));
                }
            }
        }
        // The newest backup onto the device as it is: nothing at all to do.
        if let Some((name, image)) = live.last() {
            restore(&repo, name, &dev);
            let before = dev.counts();
            let r = restore(&repo, name, &dev);
            assert!(dev.image() == *image);
            assert_eq!(dev.counts(), before, "{r:?}");
            assert_eq!(r.blocks_unchanged, r.blocks);
        }
    }
}

/// From an encrypted repository, blocks whose bytes the device holds
/// elsewhere are mapped, not written, even where the only block holding
/// them is trimmed by the same restore (the trims wait for the walk that
/// finds plain fingerprints).
#[test]
fn an_encrypted_restore_maps_what_the_device_holds_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let _p = for_this_thread(b"device restores");
    let repo =
        Repository::init_with(tmp.path(), encrypted(Segmenting::Fixed { size: 4096 })).unwrap();
    let mut rng = StdRng::seed_from_u64(9);
    let (a, b) = (content(&mut rng, 1 << 30), content(&mut rng, 1 << 30));
    let dev = Device::new(64);
    dev.put(0, &[a.clone(), b.clone()].concat());
    // The image: b, zeros, a; the device holds a, b.
    let mut image = vec![0u8; 64 * BS];
    image[..BS].copy_from_slice(&b);
    image[2 * BS..3 * BS].copy_from_slice(&a);
    repo.backup_stream("swapped", "dev", &image[..]).unwrap();
    let before = dev.counts();
    let r = restore(&repo, "swapped", &dev);
    assert!(dev.image() == image);
    assert_eq!(r.bytes_written, 0, "{r:?}");
    assert_eq!(r.blocks_mapped, 2, "{r:?}");
    assert_eq!(r.blocks_zeroed, 1, "{r:?}");
    assert_eq!(dev.counts(), (before.0, before.1 + 2));
}

/// A device that names no block by fingerprint: every block is handed to
/// it to map, and it is still exact.
#[test]
fn a_device_that_names_no_block_still_maps_by_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixed(tmp.path());
    let mut rng = StdRng::seed_from_u64(3);
    let mut dev = Device::new(2000);
    dev.names_blocks = false;
    churn(&dev, &mut rng, 300, 500);
    let image = dev.image();
    repo.backup_stream("a", "dev", &image[..]).unwrap();
    churn(&dev, &mut rng, 100, 500);
    let r = restore(&repo, "a", &dev);
    assert!(dev.image() == image);
    assert_eq!(r.bytes_written, 0, "every content was still stored");
    assert!(r.blocks_mapped > 0);
}

/// A stream of any length (its last segment short), and repositories
/// whose segments cannot be the device's chunks: written whole, exactly.
#[test]
fn what_cannot_be_named_is_written_and_the_report_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let repo = fixed(&tmp.path().join("fixed"));
    let dev = Device::new(1000);
    churn(&dev, &mut rng, 200, 400);
    let mut image = dev.image();
    image.truncate(image.len() - 1000);
    repo.backup_stream("odd", "dev", &image[..]).unwrap();
    let target = Device::new(1000);
    target.put(999, &[7u8; BS]);
    let r = restore(&repo, "odd", &target);
    assert!(r.by_fingerprint);
    assert_eq!(target.image()[..image.len()], image[..]);
    assert_eq!(
        target.image()[image.len()..],
        [7u8; 1000],
        "past the image: untouched"
    );

    let fastcdc =
        Repository::init_with(tmp.path().join("cdc"), options(Segmenting::fastcdc(8192))).unwrap();
    let _p = for_this_thread(b"device restores");
    // Encrypted as builds before config version 3 made them.
    let keyed_bytes = Repository::init_with(
        tmp.path().join("enc"),
        RepoOptions {
            keyed_of: KeyedOf::Bytes,
            ..encrypted(Segmenting::Fixed { size: 4096 })
        },
    )
    .unwrap();
    for (repo, why) in [
        (&fastcdc, "content-defined"),
        (&keyed_bytes, "keyed over segments' bytes"),
    ] {
        repo.backup_stream("img", "dev", &image[..]).unwrap();
        let target = Device::new(1000);
        churn(&target, &mut rng, 50, 400);
        let r = restore(repo, "img", &target);
        assert!(!r.by_fingerprint);
        let because = r.written_because.clone().unwrap();
        assert!(because.contains(why), "{because}");
        assert_eq!(target.image()[..image.len()], image[..], "{why}");
    }
}

#[test]
fn a_device_too_small_is_refused_with_nothing_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixed(tmp.path());
    let mut rng = StdRng::seed_from_u64(8);
    let dev = Device::new(600);
    churn(&dev, &mut rng, 100, 100);
    repo.backup_stream("big", "dev", &dev.image()[..]).unwrap();
    let small = Device::new(599);
    churn(&small, &mut rng, 50, 100);
    let before = small.image();
    let e = repo
        .restore_blocks("big", &small, &mut |_, _| {})
        .expect_err("too small");
    assert!(e.to_string().contains("grow it first"), "{e}");
    assert!(small.image() == before);
}

/// A container gone: its blocks are named and written as zeros, never
/// left holding the device's other bytes; every other block is restored.
#[test]
fn damage_is_named_and_written_as_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = fixed(tmp.path());
    let mut rng = StdRng::seed_from_u64(13);
    let dev = Device::new(3000);
    // Unique blocks, so the lost container's blocks are only there.
    for b in 0..3000 {
        dev.put(b, &content(&mut rng, 1 << 40));
    }
    let image = dev.image();
    repo.backup_stream("img", "dev", &image[..]).unwrap();
    let (_, recipe) = repo.recipe("img").unwrap();
    let lost = recipe.segments[1500].container;
    std::fs::remove_file(tmp.path().join(container_name(lost))).unwrap();
    // The device now holds other bytes everywhere, and none of the image.
    for b in 0..3000 {
        dev.put(b, &content(&mut rng, 1 << 40));
    }
    dev.collect();
    let r = restore(&repo, "img", &dev);
    assert!(!r.damaged.is_empty());
    let got = dev.image();
    let mut at = 0usize;
    let mut lost_bytes = 0;
    for s in &recipe.segments {
        let range = at..at + s.len as usize;
        if s.container == lost {
            assert!(got[range.clone()].iter().all(|&x| x == 0), "zeros at {at}");
            assert!(
                r.damaged.iter().any(|d| d.offset as usize <= at
                    && at < (d.offset + d.len) as usize
                    && d.error.contains(&container_name(lost))),
                "{at} named: {:?}",
                r.damaged
            );
            lost_bytes += s.len as u64;
        } else {
            assert!(got[range.clone()] == image[range], "intact at {at}");
        }
        at += s.len as usize;
    }
    let named: u64 = r.damaged.iter().map(|d| d.len).sum();
    assert_eq!(named, lost_bytes);
}
