//! Backups of a served dedup device through a snapshot (issue 39), with
//! the real engine under them and a plain disk as the model: random
//! writes (some unaligned) and trims, then backups by fingerprint while a
//! writer thread goes on writing, trimming and collecting on the device.
//! Every backup restores as the disk at its snapshot's instant, across
//! deletes and repository collections; the device's changed-block
//! tracking, restarted from each snapshot, lets the next backup skip what
//! did not change; a tracking reset on purpose, or a snapshot whose
//! backup failed, makes the next backup walk what it must, and the image
//! is exact either way. Each backup is also restored by fingerprint onto
//! a second device, which then reads as the disk at the freeze.

use crate::blocks_support;

use std::io;
use std::path::Path;

use blocks_support::{content, options, BS};
use dedup_common::fingerprint::Fingerprint;
use dedup_common::fingerprint::HashAlgo;
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::{Changes, ChunkState, Device, OpenOptions};
use dedup_store::backup_blocks::{BlockMap, BlockSource, BlockState, BlocksReport};
use dedup_store::BlockTarget;
use dedup_store::{CheckOptions, GcOptions, Repository, Segmenting};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Four regions of the tracking.
const BLOCKS: u64 = 4 * Changes::REGION_CHUNKS;

/// A snapshot of `dev`, as a block source; ended (without restarting
/// the tracking) when dropped.
struct Snapshot<'a> {
    dev: &'a Device,
    id: u64,
    changes: Option<Changes>,
    can_track: bool,
}

impl<'a> Snapshot<'a> {
    fn start(dev: &'a Device) -> Snapshot<'a> {
        let s = dev.snapshot_start().unwrap();
        Snapshot {
            dev,
            id: s.id,
            changes: s.changes,
            can_track: s.can_track,
        }
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        self.dev.snapshot_end(self.id, None).unwrap();
    }
}

impl BlockMap for Snapshot<'_> {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn blocks(&self) -> u64 {
        BLOCKS
    }
    fn hash(&self) -> HashAlgo {
        HashAlgo::Blake3
    }
    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>> {
        let states = self
            .dev
            .snapshot_map(first, count)
            .map_err(io::Error::other)?;
        Ok(states.into_iter().map(block_state).collect())
    }
}

impl BlockSource for Snapshot<'_> {
    fn read(&self, first: u64, buf: &mut [u8]) -> io::Result<()> {
        self.dev.snapshot_read(first, buf).map_err(io::Error::other)
    }
    fn describe(&self, block: u64) -> String {
        format!("block {block}")
    }
    fn device_id(&self) -> Option<[u8; 16]> {
        self.can_track.then_some(self.dev.config().uuid)
    }
    fn tracking_mark(&self) -> Option<u64> {
        self.changes.as_ref().map(|c| c.mark)
    }
    fn changed_since_mark(&self, first: u64, count: u64) -> bool {
        self.changes
            .as_ref()
            .is_none_or(|c| c.changed(first, count))
    }
    fn start_tracking(&self, mark: u64) -> io::Result<()> {
        match self.dev.snapshot_end(self.id, Some(mark)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(io::Error::other("tracking not restarted")),
            Err(e) => Err(io::Error::other(e)),
        }
    }
}

/// A second device, written by a restore by fingerprint.
struct Target<'a>(&'a Device);

impl BlockMap for Target<'_> {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn blocks(&self) -> u64 {
        BLOCKS
    }
    fn hash(&self) -> HashAlgo {
        HashAlgo::Blake3
    }
    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>> {
        let states = self.0.block_map(first, count).map_err(io::Error::other)?;
        Ok(states.into_iter().map(block_state).collect())
    }
}

impl BlockTarget for Target<'_> {
    fn map_known(&self, blocks: &[(u64, Fingerprint)]) -> io::Result<Vec<bool>> {
        self.0.map_known(blocks).map_err(io::Error::other)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(offset, data, false).map_err(io::Error::other)
    }
    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.discard(offset, len, false).map_err(io::Error::other)
    }
    fn flush(&self) -> io::Result<()> {
        self.0.flush().map_err(io::Error::other)
    }
}

fn block_state(s: ChunkState) -> BlockState {
    match s {
        ChunkState::Unmapped => BlockState::Zero,
        ChunkState::Known(fp) => BlockState::Known(fp),
        ChunkState::Unknown => BlockState::Unknown,
    }
}

fn read_all(dev: &Device) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCKS as usize * BS];
    dev.read(0, &mut buf).unwrap();
    buf
}

fn device(dir: &Path) -> Device {
    let mut opts = CreateOptions::new(BLOCKS * BS as u64);
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

/// Random writes (from a pool, so blocks repeat; some at 512-byte
/// offsets) and trims, within `regions` only, on the device and the model.
fn churn(dev: &Device, model: &mut [u8], rng: &mut StdRng, n: usize, regions: &[u64]) {
    for _ in 0..n {
        let region = regions[rng.random_range(0..regions.len())];
        let lbn = region * Changes::REGION_CHUNKS + rng.random_range(0..Changes::REGION_CHUNKS - 3);
        let offset = lbn * BS as u64
            + match rng.random_range(0..4) {
                0 => rng.random_range(1..8u64) * 512,
                _ => 0,
            };
        let len = rng.random_range(1..=3usize) * BS;
        let at = offset as usize..offset as usize + len;
        if rng.random_range(0..8) == 0 {
            dev.discard(offset, len as u64, false).unwrap();
            model[at].fill(0);
        } else {
            let data: Vec<u8> = (0..len / BS).flat_map(|_| content(rng, 300)).collect();
            dev.write(offset, &data, false).unwrap();
            model[at].copy_from_slice(&data);
        }
    }
}

fn restore(repo: &Repository, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    repo.restore(name, &mut out).unwrap();
    out
}

#[test]
fn backups_of_a_served_device_are_its_image_at_the_snapshot_while_writes_race_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = device(&tmp.path().join("dev"));
    let repo = Repository::init_with(
        tmp.path().join("repo"),
        options(Segmenting::Fixed { size: BS as u32 }),
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(39);
    let mut model = vec![0u8; BLOCKS as usize * BS];
    let all: Vec<u64> = (0..BLOCKS / Changes::REGION_CHUNKS).collect();
    churn(&dev, &mut model, &mut rng, 600, &all);
    let mut live: Vec<(String, Vec<u8>)> = Vec::new();
    let copy = device(&tmp.path().join("copy"));
    for round in 0..8u64 {
        // Between backups and during them, only regions 1 to 3 change:
        // region 0 is left to the tracking.
        churn(&dev, &mut model, &mut rng, 80, &[2, 3]);
        if round == 5 {
            // Tracking reset on purpose: a mark no backup recorded.
            dev.start_changes(0x5eed).unwrap();
        }
        let frozen = model.clone();
        let name = format!("b{round}");
        let snap = Snapshot::start(&dev);
        let (report, racing): (BlocksReport, Vec<u8>) = std::thread::scope(|s| {
            let writer = s.spawn(|| {
                let mut rng = StdRng::seed_from_u64(round + 100);
                let mut model = model.clone();
                for _ in 0..4 {
                    churn(&dev, &mut model, &mut rng, 40, &[1, 2]);
                    dev.gc().unwrap();
                }
                model
            });
            let (_, report) = repo
                .backup_blocks(&name, "dev", &snap, &mut |_| {})
                .unwrap();
            (report, writer.join().unwrap())
        });
        drop(snap);
        assert!(report.by_fingerprint, "{report:?}");
        assert!(report.tracking, "round {round}: {report:?}");
        match round {
            0 => assert_eq!(report.blocks_unwalked, 0, "nothing tracked yet"),
            5 => assert_eq!(report.blocks_unwalked, 0, "a reset tracking is not trusted"),
            7 => assert_eq!(report.blocks_unwalked, 0, "every region changed since b6"),
            _ => assert!(report.blocks_unwalked > 0, "round {round}: {report:?}"),
        }
        model = racing;
        live.push((name, frozen));
        for (name, image) in &live {
            assert!(restore(&repo, name) == *image, "round {round}: {name}");
        }
        // Restored by fingerprint onto a second device, which keeps what
        // earlier rounds restored: only what it lacks is written.
        let restored = repo
            .restore_blocks(&format!("b{round}"), &Target(&copy), &mut |_, _| {})
            .unwrap();
        assert!(restored.by_fingerprint, "{restored:?}");
        if round > 0 {
            // Region 0 changes only in round 6, and then only a little.
            assert!(
                restored.blocks_unchanged >= Changes::REGION_CHUNKS / 2,
                "round {round}: {restored:?}"
            );
        }
        assert!(
            read_all(&copy) == live.last().unwrap().1,
            "round {round}: restored by fingerprint"
        );
        if round % 3 == 2 {
            let (name, _) = live.remove(0);
            repo.delete_backup(&name).unwrap();
            repo.gc(&GcOptions::default()).unwrap();
        }
        if round == 6 {
            // A snapshot whose backup never committed, region 0 written
            // meanwhile: the tracking goes on from the last committed
            // backup's mark, so the next backup walks region 0 too.
            let snap = Snapshot::start(&dev);
            churn(&dev, &mut model, &mut rng, 20, &[0]);
            drop(snap);
        }
    }
    let check = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(check.is_clean(), "{check:?}");
    for d in [&dev, &copy] {
        let report = d.check(true).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
    }
    dev.close().unwrap();
    copy.close().unwrap();
}
