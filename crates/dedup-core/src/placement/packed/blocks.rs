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

use super::{Addressing, RAW_SLOT};

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

/// What the map knows of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// Bit s set = address (block, s) has references.
    live: u16,
    hold: Hold,
    /// Packed: fragment slots in its table (0 = unknown).
    slots: u8,
    /// Packed: bytes of its live fragments when last known.
    fill: u32,
}

const FREE: Entry = Entry {
    live: 0,
    hold: Hold::None,
    slots: 0,
    fill: UNKNOWN,
};

impl Entry {
    fn in_use(&self) -> bool {
        self.live != 0 || self.hold != Hold::None
    }
}

/// Blocks per page of the map. A page exists only while one of its blocks
/// is in use, so the map's RAM follows the data stored (about 12 bytes per
/// block of the regions written), not the size of the data device.
const PAGE: usize = 4096;

struct Page {
    entries: Box<[Entry]>,
    in_use: u32,
}

pub struct Blocks {
    addressing: Addressing,
    pages: Vec<Option<Page>>,
    count: u64,
    quarantine: Vec<u64>,
    retired: Vec<u64>,
    cursor: u64,
    /// Blocks neither live nor held.
    free: u64,
}

impl Blocks {
    pub fn new(blocks: u64, addressing: Addressing) -> Blocks {
        Blocks {
            addressing,
            pages: (0..(blocks as usize).div_ceil(PAGE))
                .map(|_| None)
                .collect(),
            count: blocks,
            quarantine: Vec::new(),
            retired: Vec::new(),
            cursor: 0,
            free: blocks,
        }
    }

    /// Blocks on the data device.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn get(&self, block: u64) -> Entry {
        let b = block as usize;
        self.pages[b / PAGE]
            .as_ref()
            .map_or(FREE, |p| p.entries[b % PAGE])
    }

    /// Change a block's entry, keeping its page's count of blocks in use
    /// (a page with none left is dropped); returns whether it was in use.
    fn update(&mut self, block: u64, f: impl FnOnce(&mut Entry)) -> bool {
        let b = block as usize;
        let slot = &mut self.pages[b / PAGE];
        let page = slot.get_or_insert_with(|| Page {
            entries: vec![FREE; PAGE].into_boxed_slice(),
            in_use: 0,
        });
        let e = &mut page.entries[b % PAGE];
        let was = e.in_use();
        f(e);
        match (was, e.in_use()) {
            (false, true) => page.in_use += 1,
            (true, false) => page.in_use -= 1,
            _ => {}
        }
        if page.in_use == 0 {
            *slot = None;
        }
        was
    }

    /// Mark an address referenced (at open, at allocation, and when a
    /// repair gives a count back).
    pub fn revive(&mut self, pbn: Pbn) {
        let (b, s) = self.addressing.split(pbn);
        if self.get(b).hold == Hold::Quarantine {
            self.quarantine.retain(|&q| q != b);
        }
        let was = self.update(b, |e| {
            if e.hold == Hold::Quarantine {
                e.hold = Hold::None;
            }
            e.live |= 1 << s;
        });
        if !was {
            self.free -= 1;
        }
    }

    /// An address lost its last reference. A block left with none is
    /// quarantined (or, if it is an open bin or retired, stays as it is).
    pub fn kill(&mut self, pbn: Pbn) {
        let (b, s) = self.addressing.split(pbn);
        if self.get(b).live & (1 << s) == 0 {
            // Not live here (a repair zeroing a count the map never saw).
            return;
        }
        let mut quarantined = false;
        self.update(b, |e| {
            e.live &= !(1 << s);
            if e.live == 0 && e.hold == Hold::None {
                e.hold = Hold::Quarantine;
                quarantined = true;
            }
        });
        if quarantined {
            self.quarantine.push(b);
        }
    }

    pub fn live(&self, block: u64) -> u16 {
        self.get(block).live
    }

    pub fn is_raw(&self, block: u64) -> bool {
        self.get(block).live & (1 << RAW_SLOT) != 0
    }

    pub fn hold(&self, block: u64) -> Hold {
        self.get(block).hold
    }

    /// A free block for a raw chunk (`live` = its raw bit) or a new bin
    /// (`hold` = `Bin`, no live bits yet), searching on from the last one
    /// handed out (sequential data writes, as Dmdedup §2.6.1); full pages
    /// are skipped whole.
    pub fn alloc(&mut self, hold: Hold, live: u16) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let n = self.count;
        let mut step = 0;
        while step < n {
            let b = (self.cursor + step) % n;
            let page = &self.pages[b as usize / PAGE];
            if page.as_ref().is_some_and(|p| p.in_use as usize == PAGE) {
                step += PAGE as u64 - b % PAGE as u64;
                continue;
            }
            if !self.get(b).in_use() {
                self.update(b, |e| *e = Entry { live, hold, ..FREE });
                self.free -= 1;
                self.cursor = (b + 1) % n;
                return Some(b);
            }
            step += 1;
        }
        None
    }

    /// A bin was written: its block now lives by its live bits.
    pub fn sealed(&mut self, block: u64, slots: usize, fill: u32) {
        let mut quarantined = false;
        self.update(block, |e| {
            e.hold = Hold::None;
            e.slots = slots as u8;
            e.fill = fill;
            if e.live == 0 {
                // Every fragment died before the bin was written.
                e.hold = Hold::Quarantine;
                quarantined = true;
            }
        });
        if quarantined {
            self.quarantine.push(block);
        }
    }

    /// An open bin given up without being written (all its fragments died
    /// or its write failed and the device stops): nothing names it durably.
    pub fn drop_bin(&mut self, block: u64) {
        self.update(block, |e| e.hold = Hold::None);
        if self.get(block).live == 0 {
            self.free += 1;
        }
    }

    pub fn slots(&self, block: u64) -> u8 {
        self.get(block).slots
    }

    pub fn fill(&self, block: u64) -> u32 {
        self.get(block).fill
    }

    pub fn set_layout(&mut self, block: u64, slots: usize, fill: u32) {
        if !self.get(block).in_use() {
            return;
        }
        self.update(block, |e| {
            e.slots = slots as u8;
            e.fill = fill;
        });
    }

    /// A repack moved every live fragment out of `block`.
    pub fn retire(&mut self, block: u64) {
        self.update(block, |e| {
            e.live = 0;
            e.hold = Hold::Retired;
        });
        self.retired.push(block);
    }

    /// Readers that could hold a retired block's addresses are gone: the
    /// blocks wait for the next commit like any freed block.
    pub fn release_retired(&mut self) {
        for b in std::mem::take(&mut self.retired) {
            self.update(b, |e| e.hold = Hold::Quarantine);
            self.quarantine.push(b);
        }
    }

    /// The transaction committed: quarantined blocks are free. Returns
    /// them (to be given back to the host).
    pub fn commit(&mut self) -> Vec<u64> {
        let mut freed = Vec::new();
        for b in std::mem::take(&mut self.quarantine) {
            let e = self.get(b);
            if e.hold == Hold::Quarantine && e.live == 0 {
                self.update(b, |e| e.hold = Hold::None);
                self.free += 1;
                freed.push(b);
            }
        }
        freed
    }

    pub fn free(&self) -> u64 {
        self.free
    }

    /// Blocks freed that only a commit (or a drain, then a commit) releases.
    pub fn waiting(&self) -> bool {
        !self.quarantine.is_empty() || !self.retired.is_empty()
    }

    pub fn used(&self) -> u64 {
        self.count - self.free
    }

    /// (raw blocks, packed blocks, live fragments) now.
    pub fn census(&self) -> (u64, u64, u64) {
        let (mut raw, mut packed, mut frags) = (0, 0, 0);
        for page in self.pages.iter().flatten() {
            for e in page.entries.iter() {
                let l = e.live;
                if l & (1 << RAW_SLOT) != 0 {
                    raw += 1;
                } else if l != 0 {
                    packed += 1;
                    frags += l.count_ones() as u64;
                }
            }
        }
        (raw, packed, frags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_wait_for_the_commit_and_retired_ones_for_readers_too() {
        let mut b = Blocks::new(4, Addressing::Slots);
        let raw = b.alloc(Hold::None, 1 << RAW_SLOT).unwrap();
        let bin = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(Addressing::Slots.addr(bin, 0));
        b.revive(Addressing::Slots.addr(bin, 1));
        b.sealed(bin, 2, 3000);
        assert_eq!(b.free(), 2);
        b.kill(Addressing::Slots.addr(bin, 0));
        assert_eq!(b.free(), 2, "one fragment still lives");
        b.kill(Addressing::Slots.addr(bin, 1));
        b.kill(Addressing::Slots.addr(raw, RAW_SLOT));
        assert_eq!(b.free(), 2, "quarantined until the commit");
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), Some(2));
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), Some(3));
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), None);
        let mut punched = b.commit();
        punched.sort_unstable();
        assert_eq!(
            punched,
            vec![raw, bin],
            "the commit hands back what it freed"
        );
        assert_eq!(b.free(), 2);
        // A revived quarantined block is live again, never handed out.
        let x = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(Addressing::Slots.addr(x, 3));
        b.sealed(x, 4, 1000);
        b.retire(x);
        assert!(b.commit().is_empty(), "a retired block is not free yet");
        assert_eq!(b.free(), 1, "retired blocks survive a commit");
        b.release_retired();
        assert_eq!(b.commit(), vec![x]);
        assert_eq!(b.free(), 2);
        assert_eq!(b.used(), 2);
    }

    #[test]
    fn pages_exist_only_while_a_block_in_them_is_in_use() {
        let mut b = Blocks::new(10 * PAGE as u64, Addressing::Slots);
        assert_eq!(b.pages.iter().flatten().count(), 0);
        let first = b.alloc(Hold::None, 1 << RAW_SLOT).unwrap();
        assert_eq!(b.pages.iter().flatten().count(), 1);
        // A full page is skipped whole.
        for _ in 1..PAGE {
            b.alloc(Hold::None, 1 << RAW_SLOT).unwrap();
        }
        assert_eq!(b.alloc(Hold::None, 1 << RAW_SLOT), Some(PAGE as u64));
        for blk in 0..PAGE as u64 {
            b.kill(Addressing::Slots.addr(blk, RAW_SLOT));
        }
        b.commit();
        assert_eq!(
            b.pages.iter().flatten().count(),
            1,
            "the emptied page is gone"
        );
        assert_eq!(b.free(), 10 * PAGE as u64 - 1);
        assert_eq!(b.live(first), 0);
        assert_eq!(b.fill(first), UNKNOWN);
    }

    #[test]
    fn a_bin_whose_fragments_all_died_is_quarantined_when_sealed() {
        let mut b = Blocks::new(2, Addressing::Slots);
        let bin = b.alloc(Hold::Bin, 0).unwrap();
        b.revive(Addressing::Slots.addr(bin, 0));
        b.kill(Addressing::Slots.addr(bin, 0));
        assert_eq!(b.hold(bin), Hold::Bin);
        b.sealed(bin, 1, 100);
        assert_eq!(b.hold(bin), Hold::Quarantine);
        b.commit();
        assert_eq!(b.free(), 2);
    }
}
