//! A block device in RAM for the tests of backups by fingerprint
//! (`backup_blocks.rs`, beside the repository; `rpc_blocks.rs`, through a
//! server): each block zero or its bytes, with the fingerprint its
//! metadata recorded or none, optional changed-block tracking, and reads
//! counted or made to fail.
#![allow(dead_code)] // each test file uses part of it

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use dedup_store::backup_blocks::{BlockMap, BlockSource, BlockState};
use rand::{rngs::StdRng, Rng};

/// A device in RAM: each block zero (`None`) or its bytes, with the
/// fingerprint its metadata recorded (`None`: it keeps none).
pub struct Model {
    pub block_size: usize,
    pub blocks: Vec<Option<(Vec<u8>, Option<Fingerprint>)>>,
    pub reads: AtomicU64,
    /// What the next read does instead of reading, once.
    pub fault: Mutex<Option<Fault>>,
    /// Called with each window's first block as it is mapped.
    pub on_map: Option<Box<dyn Fn(u64) + Sync>>,
    /// Changed-block tracking, when the model keeps it: the mark and the
    /// regions (of `REGION` blocks) changed since.
    pub tracking: Option<Tracking>,
}

/// The model's tracking: its mark and the regions changed since, if any.
pub type Tracking = Mutex<Option<(u64, HashSet<u64>)>>;

/// Blocks in a tracked region of the model: as small as a device's, so
/// a walk's step of 1,024 blocks holds changed and unchanged regions.
pub const REGION: u64 = 64;
/// Regions of the models the tracking tests back up: 4,096 blocks, four
/// steps.
pub const REGIONS: u64 = 64;

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// `ErrorKind::Interrupted`: try again.
    Interrupted,
    Fails,
    Panics,
}

impl Model {
    pub fn new(blocks: usize, block_size: usize) -> Model {
        Model {
            block_size,
            blocks: vec![None; blocks],
            reads: AtomicU64::new(0),
            fault: Mutex::new(None),
            on_map: None,
            tracking: None,
        }
    }

    pub fn write(&mut self, block: usize, bytes: Vec<u8>, recorded: bool) {
        let fp = recorded.then(|| HashAlgo::Blake3.fingerprint(&bytes));
        self.blocks[block] = Some((bytes, fp));
        self.note(block);
    }

    pub fn trim(&mut self, block: usize) {
        self.blocks[block] = None;
        self.note(block);
    }

    /// A change to `block`, for the tracking.
    pub fn note(&mut self, block: usize) {
        if let Some(Some((_, changed))) = self.tracking.as_mut().map(|t| t.get_mut().unwrap()) {
            changed.insert(block as u64 / REGION);
        }
    }

    /// Blocks with bytes and no fingerprint.
    pub fn unknown(&self) -> usize {
        self.blocks
            .iter()
            .flatten()
            .filter(|b| b.1.is_none())
            .count()
    }

    pub fn image(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.blocks.len() * self.block_size);
        for b in &self.blocks {
            match b {
                Some((bytes, _)) => out.extend_from_slice(bytes),
                None => out.resize(out.len() + self.block_size, 0),
            }
        }
        out
    }
}

impl BlockMap for Model {
    fn block_size(&self) -> u32 {
        self.block_size as u32
    }
    fn blocks(&self) -> u64 {
        self.blocks.len() as u64
    }
    fn hash(&self) -> HashAlgo {
        HashAlgo::Blake3
    }
    fn map(&self, first: u64, count: u64) -> io::Result<Vec<BlockState>> {
        if let Some(hook) = &self.on_map {
            hook(first);
        }
        Ok(self.blocks[first as usize..(first + count) as usize]
            .iter()
            .map(|b| match b {
                None => BlockState::Zero,
                Some((_, Some(fp))) => BlockState::Known(*fp),
                Some((_, None)) => BlockState::Unknown,
            })
            .collect())
    }
}

impl BlockSource for Model {
    fn read(&self, first: u64, buf: &mut [u8]) -> io::Result<()> {
        let fault = self.fault.lock().unwrap().take();
        match fault {
            None => {}
            Some(Fault::Interrupted) => return Err(io::ErrorKind::Interrupted.into()),
            Some(Fault::Fails) => return Err(io::Error::other("the disk said no")),
            Some(Fault::Panics) => panic!("a source that panics"),
        }
        for (i, out) in buf.chunks_mut(self.block_size).enumerate() {
            self.reads.fetch_add(1, Ordering::Relaxed);
            match &self.blocks[first as usize + i] {
                Some((bytes, _)) => out.copy_from_slice(bytes),
                None => out.fill(0),
            }
        }
        Ok(())
    }
    fn describe(&self, block: u64) -> String {
        format!("model block {block}")
    }
    fn device_id(&self) -> Option<[u8; 16]> {
        self.tracking.as_ref().map(|_| [9; 16])
    }
    fn tracking_mark(&self) -> Option<u64> {
        let t = self.tracking.as_ref()?.lock().unwrap();
        t.as_ref().map(|(mark, _)| *mark)
    }
    fn changed_since_mark(&self, first: u64, count: u64) -> bool {
        let Some(t) = &self.tracking else { return true };
        match &*t.lock().unwrap() {
            Some((_, changed)) => {
                (first / REGION..=(first + count - 1) / REGION).any(|r| changed.contains(&r))
            }
            None => true,
        }
    }
    fn start_tracking(&self, mark: u64) -> io::Result<()> {
        if let Some(t) = &self.tracking {
            *t.lock().unwrap() = Some((mark, HashSet::new()));
        }
        Ok(())
    }
}

impl Model {
    /// Up to 50 writes (some unrecorded) and trims within two random
    /// regions of the first `regions`, contents from `content`.
    pub fn change_two_regions(
        &mut self,
        rng: &mut StdRng,
        regions: u64,
        content: impl Fn(&mut StdRng) -> Vec<u8>,
    ) {
        let two = [rng.random_range(0..regions), rng.random_range(0..regions)];
        for _ in 0..rng.random_range(1..50) {
            let r = two[rng.random_range(0..2)];
            let block = (r * REGION + rng.random_range(0..REGION)) as usize;
            match rng.random_range(0..5) {
                0 => self.trim(block),
                1 => self.write(block, content(rng), false),
                _ => self.write(block, content(rng), true),
            }
        }
    }
}

impl Model {
    /// The tracking lost, as after a crash or a repair.
    pub fn untrack(&self) {
        *self.tracking.as_ref().unwrap().lock().unwrap() = None;
    }

    /// Another mark than the one set, as a damaged or foreign file has.
    pub fn foreign_mark(&self) {
        let t = &mut *self.tracking.as_ref().unwrap().lock().unwrap();
        t.as_mut().unwrap().0 ^= 1;
    }
}
