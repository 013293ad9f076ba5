//! The block map of a packing device: which data blocks hold what, and
//! which are free to allocate. Rebuilt at open from the addresses the LBN
//! map and hash index name, kept up to date from reference counts after.
//!
//! A block is in use while any address in it has a reference (its `live`
//! bits), while it is an open bin, or while it waits:
//! - **quarantine**: its last reference went in the open transaction; the
//!   committed metadata may still name it, so it is not reused before the
//!   next commit (Dmdedup §2.6.3: no data overwrite within a transaction);
//! - **retired**: a repack moved its fragments away, but a reader that
//!   looked its address up before the move may still be reading it; the
//!   engine drains readers before handing it to quarantine.

use crate::config::Pbn;

use super::{split, RAW_SLOT};

/// Why a block with no live address is still held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    None,
    Bin,
    Quarantine,
    Retired,
}

/// Slot count or fill not known (blocks found at open, until a repack
/// scan reads their table).
pub const UNKNOWN: u32 = u32::MAX;

pub struct Blocks {
    /// Per block: bit s set = address (block, s) has references.
    live: Vec<u16>,
    hold: Vec<Hold>,
    /// Per packed block: fragment slots in its table (0 = unknown).
    slots: Vec<u8>,
    /// Per packed block: bytes of its live fragments when last known.
    fill: Vec<u32>,
    quarantine: Vec<u64>,
    retired: Vec<u64>,
    cursor: u64,
    /// Blocks neither live nor held.
    free: u64,
}

impl Blocks {
    pub fn new(blocks: u64) -> Blocks {
        let n = blocks as usize;
        Blocks {
            live: vec![0; n],
            hold: vec![Hold::None; n],
            slots: vec![0; n],
            fill: vec![UNKNOWN; n],
            quarantine: Vec::new(),
            retired: Vec::new(),
            cursor: 0,
            free: blocks,
        }
    }

    /// Blocks on the data device.
    pub fn count(&self) -> u64 {
        self.live.len() as u64
    }

    fn in_use(&self, b: usize) -> bool {
        self.live[b] != 0 || self.hold[b] != Hold::None
    }

    /// Mark an address referenced (at open, at allocation, and when a
    /// repair gives a count back).
    pub fn revive(&mut self, pbn: Pbn) {
        let (b, s) = split(pbn);
        let b = b as usize;
        let was = self.in_use(b);
        if self.hold[b] == Hold::Quarantine {
            self.quarantine.retain(|&q| q != b as u64);
            self.hold[b] = Hold::None;
        }
        self.live[b] |= 1 << s;
        if !was {
            self.free -= 1;
        }
    }

    /// An address lost its last reference. A block left with none is
    /// quarantined (or, if it is an open bin or retired, stays as it is).
    pub fn kill(&mut self, pbn: Pbn) {
        let (b, s) = split(pbn);
        let b = b as usize;
        if self.live[b] & (1 << s) == 0 {
            // Not live here (a repair zeroing a count the map never saw).
            return;
        }
        self.live[b] &= !(1 << s);
        if self.live[b] == 0 && self.hold[b] == Hold::None {
            self.hold[b] = Hold::Quarantine;
            self.quarantine.push(b as u64);
        }
    }

    pub fn live(&self, block: u64) -> u16 {
        self.live[block as usize]
    }

    pub fn is_raw(&self, block: u64) -> bool {
        self.live[block as usize] & (1 << RAW_SLOT) != 0
    }

    pub fn hold(&self, block: u64) -> Hold {
        self.hold[block as usize]
    }

    /// A free block for a raw chunk (`live` = its raw bit) or a new bin
    /// (`hold` = `Bin`, no live bits yet), searching on from the last one
    /// handed out (sequential data writes, as Dmdedup §2.6.1).
    pub fn alloc(&mut self, hold: Hold, live: u16) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let n = self.count();
        for step in 0..n {
            let b = (self.cursor + step) % n;
            if !self.in_use(b as usize) {
                self.hold[b as usize] = hold;
                self.live[b as usize] = live;
                self.slots[b as usize] = 0;
                self.fill[b as usize] = UNKNOWN;
                self.free -= 1;
                self.cursor = (b + 1) % n;
                return Some(b);
            }
        }
        None
    }

    /// A bin was written: its block now lives by its live bits.
    pub fn sealed(&mut self, block: u64, slots: usize, fill: u32) {
        let b = block as usize;
        self.hold[b] = Hold::None;
        self.slots[b] = slots as u8;
        self.fill[b] = fill;
        if self.live[b] == 0 {
            // Every fragment died before the bin was written.
            self.hold[b] = Hold::Quarantine;
            self.quarantine.push(block);
        }
    }

    /// An open bin given up without being written (all its fragments died
    /// or its write failed and the device stops): nothing names it durably.
    pub fn drop_bin(&mut self, block: u64) {
        let b = block as usize;
        self.hold[b] = Hold::None;
        if self.live[b] == 0 {
            self.free += 1;
        }
    }

    pub fn slots(&self, block: u64) -> u8 {
        self.slots[block as usize]
    }

    pub fn fill(&self, block: u64) -> u32 {
        self.fill[block as usize]
    }

    pub fn set_layout(&mut self, block: u64, slots: usize, fill: u32) {
        self.slots[block as usize] = slots as u8;
        self.fill[block as usize] = fill;
    }

    /// A repack moved every live fragment out of `block`.
    pub fn retire(&mut self, block: u64) {
        let b = block as usize;
        self.live[b] = 0;
        self.hold[b] = Hold::Retired;
        self.retired.push(block);
    }

    /// Readers that could hold a retired block's addresses are gone: the
    /// blocks wait for the next commit like any freed block.
    pub fn release_retired(&mut self) {
        for b in std::mem::take(&mut self.retired) {
            self.hold[b as usize] = Hold::Quarantine;
            self.quarantine.push(b);
        }
    }

    /// The transaction committed: quarantined blocks are free.
    pub fn commit(&mut self) {
        for b in std::mem::take(&mut self.quarantine) {
            let b = b as usize;
            if self.hold[b] == Hold::Quarantine && self.live[b] == 0 {
                self.hold[b] = Hold::None;
                self.free += 1;
            }
        }
    }

    pub fn free(&self) -> u64 {
        self.free
    }

    /// Blocks freed that only a commit (or a drain, then a commit) releases.
    pub fn waiting(&self) -> bool {
        !self.quarantine.is_empty() || !self.retired.is_empty()
    }

    pub fn used(&self) -> u64 {
        self.count() - self.free
    }

    /// (raw blocks, packed blocks, live fragments) now.
    pub fn census(&self) -> (u64, u64, u64) {
        let (mut raw, mut packed, mut frags) = (0, 0, 0);
        for &l in &self.live {
            if l & (1 << RAW_SLOT) != 0 {
                raw += 1;
            } else if l != 0 {
                packed += 1;
                frags += l.count_ones() as u64;
            }
        }
        (raw, packed, frags)
    }
}

#[cfg(test)]
mod tests {
    use super::super::addr;
    use super::*;

    #[test]
    fn freed_blocks_wait_for_the_commit_and_retired_ones_for_readers_too() {
        let mut b = Blocks::new(4);
        let raw = b.alloc(Hold::None, 1 << RAW_SLOT).unwrap();
        let bin = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(addr(bin, 0));
        b.revive(addr(bin, 1));
        b.sealed(bin, 2, 3000);
        assert_eq!(b.free(), 2);
        b.kill(addr(bin, 0));
        assert_eq!(b.free(), 2, "one fragment still lives");
        b.kill(addr(bin, 1));
        b.kill(addr(raw, RAW_SLOT));
        assert_eq!(b.free(), 2, "quarantined until the commit");
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), Some(2));
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), Some(3));
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), None);
        b.commit();
        assert_eq!(b.free(), 2);
        // A revived quarantined block is live again, never handed out.
        let x = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(addr(x, 3));
        b.sealed(x, 4, 1000);
        b.retire(x);
        b.commit();
        assert_eq!(b.free(), 1, "retired blocks survive a commit");
        b.release_retired();
        b.commit();
        assert_eq!(b.free(), 2);
        assert_eq!(b.used(), 2);
    }

    #[test]
    fn a_bin_whose_fragments_all_died_is_quarantined_when_sealed() {
        let mut b = Blocks::new(2);
        let bin = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(addr(bin, 0));
        b.kill(addr(bin, 0));
        assert_eq!(b.hold(bin), Hold::Bin);
        b.sealed(bin, 1, 100);
        assert_eq!(b.hold(bin), Hold::Quarantine);
        b.commit();
        assert_eq!(b.free(), 2);
    }
}
