//! The exact table of the sparse store's hash index: the fingerprint's
//! first 8 bytes and the PBN, 16 bytes an entry, in an open-addressing
//! table that doubles as it fills. The index starts with it, because it
//! grows with the data (the compact table's size is fixed), and keeps it
//! on a device whose group numbers leave the compact table too short a tag.

use crate::config::Pbn;

/// Bytes an entry of the table costs.
pub const ENTRY_BYTES: u64 = 16;
/// The table starts with this many slots.
pub const MIN_SLOTS: usize = 1 << 12;

#[derive(Clone, Copy, Default)]
struct Slot {
    key: u64,
    /// PBN + 1; 0 = empty.
    pbn1: u64,
}

pub struct ExactTable {
    slots: Vec<Slot>,
    len: usize,
}

fn bucket(key: u64, slots: usize) -> usize {
    // The key's mixed high bits scaled to the table (no power-of-two mask,
    // so the table can fill its budget); sampling tests the low bits.
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h as u128 * slots as u128) >> 64) as usize
}

/// The slot after `i`, wrapping.
fn next(i: usize, slots: usize) -> usize {
    if i + 1 == slots {
        0
    } else {
        i + 1
    }
}

impl ExactTable {
    pub fn new(slots: usize) -> ExactTable {
        ExactTable {
            slots: vec![Slot::default(); slots],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Load the slot where `get` or `put` of `key` starts: a plain read
    /// whose value is thrown away, so a loop of them has many misses in
    /// flight at once.
    pub fn touch(&self, key: u64) {
        if let Some(s) = self.slots.get(bucket(key, self.slots.len())) {
            std::hint::black_box(s.key);
        }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn bytes(&self) -> u64 {
        self.slots.len() as u64 * ENTRY_BYTES
    }

    /// One more entry would pass the 7/8 load the probes stay short at.
    pub fn full(&self) -> bool {
        (self.len + 1) * 8 > self.slots.len() * 7
    }

    pub fn get(&self, key: u64) -> Option<Pbn> {
        let mut i = bucket(key, self.slots.len());
        loop {
            let s = self.slots[i];
            if s.pbn1 == 0 {
                return None;
            }
            if s.key == key {
                return Some(s.pbn1 - 1);
            }
            i = next(i, self.slots.len());
        }
    }

    /// Remember `key -> pbn`; the newest chunk with a key wins.
    pub fn put(&mut self, key: u64, pbn: Pbn) {
        let n = self.slots.len();
        let mut i = bucket(key, n);
        loop {
            let s = &mut self.slots[i];
            if s.pbn1 == 0 {
                *s = Slot { key, pbn1: pbn + 1 };
                self.len += 1;
                return;
            }
            if s.key == key {
                s.pbn1 = pbn + 1;
                return;
            }
            i = next(i, n);
        }
    }

    /// Every entry, (key, PBN).
    pub fn entries(&self) -> impl Iterator<Item = (u64, Pbn)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.pbn1 != 0)
            .map(|s| (s.key, s.pbn1 - 1))
    }

    /// Rebuild with `slots` slots, keeping the entries `keep` accepts.
    pub fn rebuild(&mut self, slots: usize, keep: impl Fn(u64) -> bool) {
        let old = std::mem::replace(self, ExactTable::new(slots));
        for (key, pbn) in old.entries() {
            if keep(key) {
                self.put(key, pbn);
            }
        }
    }

    /// Forget `key` where it names `pbn`.
    pub fn remove(&mut self, key: u64, pbn: Pbn) {
        let n = self.slots.len();
        let mut i = bucket(key, n);
        loop {
            let s = self.slots[i];
            if s.pbn1 == 0 {
                return;
            }
            if s.key == key {
                if s.pbn1 != pbn + 1 {
                    return;
                }
                break;
            }
            i = next(i, n);
        }
        // Backward-shift deletion keeps every probe chain unbroken.
        let mut hole = i;
        let mut j = i;
        loop {
            j = next(j, n);
            let s = self.slots[j];
            if s.pbn1 == 0 {
                break;
            }
            let home = bucket(s.key, n);
            // Move s into the hole unless its home lies cyclically in (hole, j].
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = Slot::default();
        self.len -= 1;
    }

    /// The slots as bytes (key, PBN + 1), for a checkpoint.
    #[cfg(test)]
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.encode_range(0..self.slots.len(), out)
    }

    /// Slots `range` as `encode_into` writes them.
    pub fn encode_range(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        out.reserve(range.len() * ENTRY_BYTES as usize);
        for s in &self.slots[range] {
            out.extend_from_slice(&s.key.to_le_bytes());
            out.extend_from_slice(&s.pbn1.to_le_bytes());
        }
    }

    /// A table from `encode_into`'s bytes, or `None` if they are not a
    /// table of `slots` slots under 7/8 load whose keys `keep` accepts.
    pub fn decode(slots: usize, body: &[u8], keep: impl Fn(u64) -> bool) -> Option<ExactTable> {
        if body.len() != slots * ENTRY_BYTES as usize {
            return None;
        }
        let mut t = ExactTable::new(slots);
        for (s, c) in body.chunks_exact(ENTRY_BYTES as usize).enumerate() {
            let key = u64::from_le_bytes(c[..8].try_into().ok()?);
            let pbn1 = u64::from_le_bytes(c[8..].try_into().ok()?);
            if pbn1 != 0 {
                if !keep(key) {
                    return None;
                }
                t.len += 1;
            }
            t.slots[s] = Slot { key, pbn1 };
        }
        (t.len * 8 <= slots * 7).then_some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> u64 {
        i.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(17) ^ 0x5555
    }

    #[test]
    fn finds_what_it_holds_and_forgets_what_is_removed() {
        let mut t = ExactTable::new(1 << 17);
        for i in 0..50_000 {
            t.put(key(i), i);
        }
        for i in 0..50_000 {
            assert_eq!(t.get(key(i)), Some(i), "{i}");
        }
        for i in (0..50_000).step_by(3) {
            t.remove(key(i), i);
        }
        // Removing with the wrong PBN leaves the entry.
        t.remove(key(1), 999_999);
        for i in 0..50_000 {
            let want = (i % 3 != 0).then_some(i);
            assert_eq!(t.get(key(i)), want, "{i}");
        }
        let mut b = Vec::new();
        t.encode_into(&mut b);
        let d = ExactTable::decode(1 << 17, &b, |_| true).unwrap();
        assert_eq!(d.len(), t.len());
        assert!(ExactTable::decode(1 << 16, &b, |_| true).is_none());
    }
}
