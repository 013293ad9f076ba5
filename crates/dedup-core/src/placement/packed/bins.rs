//! Open bins: packed blocks being filled (VDO's packer). A new compressed
//! fragment goes to the open bin it fits best (least room left after it),
//! so a block's leftover space is taken by the fragments that fit it.
//! A bin is sealed (written) when it is full, when it is the fullest and
//! a fragment fits nowhere with every bin open, when it has waited its
//! time, and at every commit (FLUSH, FUA), so packing never holds back an
//! acknowledgement that promises durability.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pack::Packer;

/// Bins open at once. More bins pack better (each fragment has more
/// gaps to choose from) and cost a block of RAM each.
pub const MAX_OPEN: usize = 16;
/// Longest a bin waits for more fragments before it is written.
pub const WAIT: Duration = Duration::from_millis(500);
/// Room below which a bin is as full as it will get.
const FULL_BELOW: usize = 48;

pub struct Bin {
    pub block: u64,
    pub packer: Packer,
    /// Each slot's chunk as written, for reads before the bin is on disk.
    pub chunks: Vec<Arc<[u8]>>,
    opened: Instant,
}

impl Bin {
    fn full(&self) -> bool {
        self.packer.room_for_next().is_none_or(|r| r < FULL_BELOW)
    }
}

pub struct Bins {
    block_size: usize,
    open: Vec<Bin>,
}

/// Where a fragment went, and the bins that must be written now.
pub struct Placed {
    pub block: u64,
    pub slot: usize,
    pub sealed: Vec<Bin>,
}

impl Bins {
    pub fn new(block_size: usize) -> Bins {
        Bins {
            block_size,
            open: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// The staged chunk at (block, slot), if that block is an open bin.
    pub fn staged(&self, block: u64, slot: usize) -> Option<Arc<[u8]>> {
        self.open
            .iter()
            .find(|b| b.block == block)
            .and_then(|b| b.chunks.get(slot).cloned())
    }

    /// Put `fragment` (the compressed form of `chunk`) in the best-fitting
    /// bin; `new_block` gives a block for a new bin (None: the device is
    /// full). Returns None when no bin has room and no block is free.
    pub fn place(
        &mut self,
        fragment: &[u8],
        chunk: Arc<[u8]>,
        mut new_block: impl FnMut() -> Option<u64>,
    ) -> Option<Placed> {
        let mut sealed = Vec::new();
        let best = self
            .open
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.packer.slack_after(fragment.len()).map(|left| (left, i)))
            .min()
            .map(|(_, i)| i);
        let i = match best {
            Some(i) => i,
            None => {
                if self.open.len() >= MAX_OPEN {
                    // Write the fullest bin to make way for a new one.
                    let fullest = (0..self.open.len())
                        .min_by_key(|&i| self.open[i].packer.room_for_next().unwrap_or(0))
                        .expect("MAX_OPEN bins are open");
                    sealed.push(self.open.swap_remove(fullest));
                }
                let Some(block) = new_block() else {
                    // Give the sealed bin back its place: nothing changed.
                    self.open.append(&mut sealed);
                    return None;
                };
                self.open.push(Bin {
                    block,
                    packer: Packer::new(self.block_size),
                    chunks: Vec::new(),
                    opened: Instant::now(),
                });
                self.open.len() - 1
            }
        };
        let bin = &mut self.open[i];
        let slot = bin
            .packer
            .add(fragment)
            .expect("the bin was chosen for having room");
        bin.chunks.push(chunk);
        let block = bin.block;
        if bin.full() {
            sealed.push(self.open.swap_remove(i));
        }
        Some(Placed {
            block,
            slot,
            sealed,
        })
    }

    /// Bins that have waited `wait` or longer.
    pub fn expired(&mut self, now: Instant, wait: Duration) -> Vec<Bin> {
        if !self
            .open
            .iter()
            .any(|b| now.duration_since(b.opened) >= wait)
        {
            return Vec::new();
        }
        let (old, young): (Vec<Bin>, Vec<Bin>) = std::mem::take(&mut self.open)
            .into_iter()
            .partition(|b| now.duration_since(b.opened) >= wait);
        self.open = young;
        old
    }

    /// Every open bin (a commit writes them all).
    pub fn take_all(&mut self) -> Vec<Bin> {
        std::mem::take(&mut self.open)
    }

    /// Put bins back (their write failed; they stay readable from RAM).
    pub fn restore(&mut self, bins: Vec<Bin>) {
        self.open.extend(bins);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(bins: &mut Bins, len: usize, next: &mut u64) -> Placed {
        let frag = vec![len as u8; len];
        bins.place(&frag, Arc::from(vec![0u8; 4096]), || {
            *next += 1;
            Some(*next - 1)
        })
        .unwrap()
    }

    #[test]
    fn best_fit_fills_gaps_and_full_bins_are_sealed() {
        let mut bins = Bins::new(4096);
        let mut next = 0;
        let a = place(&mut bins, 3000, &mut next);
        let b = place(&mut bins, 2500, &mut next);
        assert_ne!(a.block, b.block, "3000 + 2500 do not share a block");
        // 1000 fits both gaps; the tighter one (after 3000) takes it.
        let c = place(&mut bins, 1000, &mut next);
        assert_eq!(c.block, a.block);
        assert_eq!(c.slot, 1);
        // 1500 fits only beside 2500, and leaves less than FULL_BELOW? no.
        let d = place(&mut bins, 1500, &mut next);
        assert_eq!(d.block, b.block);
        // Filling a bin's last bytes seals it.
        let room = bins
            .open
            .iter()
            .find(|x| x.block == a.block)
            .unwrap()
            .packer
            .room_for_next()
            .unwrap();
        let e = place(&mut bins, room, &mut next);
        assert_eq!(e.block, a.block);
        assert_eq!(e.sealed.len(), 1);
        assert_eq!(e.sealed[0].block, a.block);
        assert!(bins.staged(a.block, 0).is_none(), "sealed bins leave");
        assert!(bins.staged(b.block, 1).is_some());
    }

    #[test]
    fn with_every_bin_open_the_fullest_is_written_to_make_way() {
        let mut bins = Bins::new(4096);
        let mut next = 0;
        for i in 0..MAX_OPEN {
            place(&mut bins, 2200 + i, &mut next);
        }
        assert_eq!(bins.len(), MAX_OPEN);
        let p = place(&mut bins, 3000, &mut next);
        assert_eq!(p.sealed.len(), 1);
        assert_eq!(p.sealed[0].packer.used(), 2200 + MAX_OPEN - 1);
        // No block free: nothing changes.
        let before = bins.len();
        assert!(bins
            .place(&[1u8; 3900], Arc::from(vec![0u8; 4096]), || None)
            .is_none());
        assert_eq!(bins.len(), before);
        let old = bins.expired(Instant::now() + WAIT, WAIT);
        assert_eq!(old.len(), MAX_OPEN);
        assert!(bins.is_empty());
    }
}
