//! In-memory allocation map for the persistent backends: one bit per PBN
//! (set = allocated), rebuilt at open from the stored reference counts.
//!
//! PBNs freed in the open transaction are quarantined: they stay marked
//! until the commit that frees them is durable. Otherwise a freed chunk
//! could be reallocated and overwritten, and a crash rolling the metadata
//! back to the previous commit would map an LBN to another chunk's bytes
//! (Dmdedup §2.6.3: no data overwrite within a transaction).

use crate::config::Pbn;

pub struct SpaceMap {
    bits: Vec<u64>,
    total: u64,
    /// Bits set, quarantined PBNs included.
    marked: u64,
    quarantine: Vec<Pbn>,
    cursor: Pbn,
}

impl SpaceMap {
    pub fn new(total: u64) -> SpaceMap {
        SpaceMap {
            bits: vec![0; total.div_ceil(64) as usize],
            total,
            marked: 0,
            quarantine: Vec::new(),
            cursor: 0,
        }
    }

    fn set(&mut self, pbn: Pbn, on: bool) {
        let w = &mut self.bits[(pbn / 64) as usize];
        let mask = 1u64 << (pbn % 64);
        if on != (*w & mask != 0) {
            *w ^= mask;
            if on {
                self.marked += 1;
            } else {
                self.marked -= 1;
            }
        }
    }

    /// This PBN holds data (at open, or when a repair gives a freed PBN its
    /// references back, which also takes it out of quarantine).
    pub fn mark_used(&mut self, pbn: Pbn) {
        if !self.quarantine.is_empty() {
            self.quarantine.retain(|&p| p != pbn);
        }
        self.set(pbn, true);
    }

    /// Where sequential allocation resumes (persisted by the backends).
    pub fn cursor(&self) -> Pbn {
        self.cursor
    }

    pub fn set_cursor(&mut self, cursor: Pbn) {
        self.cursor = if cursor < self.total { cursor } else { 0 };
    }

    /// The next free PBN at or after the cursor, wrapping (Dmdedup §2.6.1's
    /// sequential allocation, which turns random LBN writes into sequential
    /// data writes).
    pub fn alloc(&mut self) -> Option<Pbn> {
        if self.marked >= self.total {
            return None;
        }
        let words = self.bits.len() as u64;
        let start_word = self.cursor / 64;
        for step in 0..=words {
            let w = (start_word + step) % words;
            let mut free = !self.bits[w as usize];
            if step == 0 {
                // Skip bits below the cursor in its own word (revisited last).
                free &= u64::MAX << (self.cursor % 64);
            }
            if free != 0 {
                let pbn = w * 64 + free.trailing_zeros() as u64;
                // Bits past `total` in the last word are never allocatable.
                if pbn < self.total {
                    self.set(pbn, true);
                    self.cursor = pbn + 1;
                    return Some(pbn);
                }
            }
        }
        // Unreachable while `marked` counts the set bits: the last step
        // revisits the cursor's word without the mask.
        None
    }

    /// The PBN's count reached 0: reusable once the current transaction commits.
    pub fn free(&mut self, pbn: Pbn) {
        self.quarantine.push(pbn);
    }

    /// The transaction committed: quarantined PBNs become allocatable.
    pub fn commit(&mut self) {
        for pbn in std::mem::take(&mut self.quarantine) {
            self.set(pbn, false);
        }
    }

    /// PBNs the map covers.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// PBNs holding data (allocated and not freed).
    pub fn used(&self) -> u64 {
        self.marked - self.quarantine.len() as u64
    }

    /// PBNs `alloc` can hand out now.
    pub fn allocatable(&self) -> u64 {
        self.total - self.marked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_sequentially_and_wraps() {
        let mut s = SpaceMap::new(130);
        for want in 0..130 {
            assert_eq!(s.alloc(), Some(want));
        }
        assert_eq!(s.alloc(), None);
        s.free(5);
        s.free(129);
        assert_eq!(s.alloc(), None, "freed PBNs wait for the commit");
        assert_eq!(s.used(), 128);
        s.commit();
        assert_eq!(s.allocatable(), 2);
        assert_eq!(s.alloc(), Some(5), "wraps around to the first free PBN");
        assert_eq!(s.alloc(), Some(129));
    }

    #[test]
    fn cursor_in_the_middle_of_a_word_still_finds_lower_free_bits() {
        let mut s = SpaceMap::new(64);
        for p in 0..64 {
            s.mark_used(p);
        }
        s.free(3);
        s.commit();
        s.set_cursor(10);
        assert_eq!(s.alloc(), Some(3));
    }
}
