//! The compact table of the sparse store's hash index: 4-byte entries at
//! up to 98 % load, 4.08 bytes per fingerprint, so a full index of a TB
//! (10^12 bytes) of unique 4 KiB chunks fits in 1 GB of RAM, as VDO's
//! dense index does.
//!
//! An entry names the *group* holding a chunk (the chunks of
//! `GROUP_BLOCKS` data blocks, Guo's container), not the chunk: a hit
//! loads the group's records into the prefetch cache (which a hit does
//! anyway, §3.2.1), and the cache gives the PBN. With the PBN gone from the entry, what is left is a short
//! tag of the fingerprint beside the group number; the bucket's position
//! holds the fingerprint's other bits, as a cuckoo filter's does.
//!
//! - Buckets of `BUCKET` entries; a fingerprint may live in two buckets, its
//!   home (from the key's high half) and `alt(home, tag)`, an involution of
//!   the bucket and the tag, so an entry can be moved without its key
//!   (partial-key cuckoo hashing). Tables of any bucket count, so a budget
//!   is used whole.
//! - A tag that matches by chance (about `2 * BUCKET / 2^tag_bits` of the
//!   lookups of new data at full load) costs one group read that finds no
//!   match: the index is advice, every hint is confirmed.
//! - Progressive sampling keeps entries whose tag's low `shift` bits are
//!   zero (the same key bits the exact table samples on), so halving the
//!   rate is a sweep over the table.

/// Entries per bucket: half a cache line, and at this width cuckoo
/// insertion fills 99.8 % of the slots before it fails (the table stops
/// at 98 %).
pub const BUCKET: usize = 8;
/// Bytes an entry costs.
pub const SLOT_BYTES: u64 = 4;
/// Tags shorter than this match by chance too often; such a device keeps
/// the exact table.
pub const MIN_TAG_BITS: u32 = 8;
/// Displacements tried before an insertion counts the table as full.
const MAX_KICKS: usize = 256;

/// A fingerprint the table could not place (its bucket and entry).
#[derive(Clone, Copy, Debug)]
pub struct Homeless {
    bucket: usize,
    entry: u32,
}

pub struct CompactTable {
    slots: Vec<u32>,
    buckets: usize,
    group_bits: u32,
    tag_bits: u32,
    len: usize,
    /// Rotates the slot a displacement takes, so kicks do not cycle.
    kick: usize,
}

/// Bits the number `group + 1` needs for every group below `groups`
/// (0 marks an empty slot).
pub fn group_bits(groups: u64) -> u32 {
    64 - groups.leading_zeros()
}

fn mix(x: u64) -> u64 {
    let x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

impl CompactTable {
    /// A table of `bytes` for `groups` groups, or `None` if the group
    /// numbers leave too short a tag or the bytes hold no bucket.
    pub fn new(bytes: u64, groups: u64) -> Option<CompactTable> {
        let group_bits = group_bits(groups);
        let tag_bits = 32u32.checked_sub(group_bits)?;
        let buckets = (bytes / (BUCKET as u64 * SLOT_BYTES)) as usize;
        if tag_bits < MIN_TAG_BITS || buckets < 2 {
            return None;
        }
        Some(CompactTable {
            slots: vec![0; buckets * BUCKET],
            buckets,
            group_bits,
            tag_bits,
            len: 0,
            kick: 0,
        })
    }

    pub fn tag_bits(&self) -> u32 {
        self.tag_bits
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Fingerprints the table holds at its fullest.
    pub fn capacity(&self) -> usize {
        self.slots.len() * 49 / 50
    }

    pub fn bytes(&self) -> u64 {
        self.slots.len() as u64 * SLOT_BYTES
    }

    /// Full: sample more before adding.
    pub fn full(&self) -> bool {
        self.len >= self.capacity()
    }

    fn tag(&self, key: u64) -> u32 {
        (key as u32) & ((1u32 << self.tag_bits) - 1)
    }

    fn home(&self, key: u64) -> usize {
        (((key >> 32) * self.buckets as u64) >> 32) as usize
    }

    /// The other bucket of an entry with `tag` in bucket `i`:
    /// `h(tag) - i` (mod buckets), so `alt(alt(i)) == i`.
    fn alt(&self, i: usize, tag: u32) -> usize {
        let h = (mix(tag as u64) % self.buckets as u64) as usize;
        (h + self.buckets - i) % self.buckets
    }

    fn entry(&self, tag: u32, group: u64) -> u32 {
        (tag << self.group_bits) | (group + 1) as u32
    }

    fn entry_tag(&self, e: u32) -> u32 {
        // A shift by 32 (no group bits) is not possible: `new` keeps
        // tag_bits <= 32 - 1.
        e >> self.group_bits
    }

    fn entry_group(&self, e: u32) -> u64 {
        (e & ((1u32 << self.group_bits) - 1)) as u64 - 1
    }

    fn bucket(&self, i: usize) -> &[u32] {
        &self.slots[i * BUCKET..(i + 1) * BUCKET]
    }

    /// The groups of the entries whose tag is `key`'s, in its two
    /// buckets, passed to `found` (each a hint to confirm).
    pub fn candidates(&self, key: u64, mut found: impl FnMut(u64)) {
        let tag = self.tag(key);
        let home = self.home(key);
        let alt = self.alt(home, tag);
        for (n, i) in [home, alt].into_iter().enumerate() {
            if n == 1 && i == home {
                break;
            }
            for &e in self.bucket(i) {
                if e != 0 && self.entry_tag(e) == tag {
                    found(self.entry_group(e));
                }
            }
        }
    }

    /// Put the entry in bucket `i` or its other one if either has a free
    /// slot; `true` if placed (or there already).
    fn place(&mut self, i: usize, e: u32) -> bool {
        let j = self.alt(i, self.entry_tag(e));
        for b in [i, j] {
            if self.bucket(b).contains(&e) {
                return true;
            }
        }
        for b in [i, j] {
            if let Some(s) = self.bucket(b).iter().position(|&x| x == 0) {
                self.slots[b * BUCKET + s] = e;
                self.len += 1;
                return true;
            }
        }
        false
    }

    /// Add `key -> group`, displacing entries to their other bucket when
    /// both of its are full. `Err`: some entry (maybe another one) found no
    /// slot; the caller samples more and offers it again with `reinsert`.
    pub fn insert(&mut self, key: u64, group: u64) -> Result<(), Homeless> {
        let e = self.entry(self.tag(key), group);
        self.settle(Homeless {
            bucket: self.home(key),
            entry: e,
        })
    }

    fn settle(&mut self, h: Homeless) -> Result<(), Homeless> {
        let (mut i, mut e) = (h.bucket, h.entry);
        for _ in 0..MAX_KICKS {
            if self.place(i, e) {
                return Ok(());
            }
            // Both buckets full: take a slot of the other bucket and move
            // its entry on to that entry's other bucket.
            i = self.alt(i, self.entry_tag(e));
            self.kick = (self.kick + 1) % BUCKET;
            let s = i * BUCKET + self.kick;
            e = std::mem::replace(&mut self.slots[s], e);
        }
        Err(Homeless {
            bucket: i,
            entry: e,
        })
    }

    /// Offer an entry `insert` could not place again, if it is still
    /// sampled at `shift`.
    pub fn reinsert(&mut self, h: Homeless, shift: u32) -> Result<(), Homeless> {
        if !self.keeps(h.entry, shift) {
            return Ok(());
        }
        self.settle(h)
    }

    fn keeps(&self, e: u32, shift: u32) -> bool {
        shift < 32 && self.entry_tag(e) & ((1u32 << shift) - 1) == 0
    }

    /// Keep only the entries sampled at `shift` (their tag's low `shift`
    /// bits zero).
    pub fn sample(&mut self, shift: u32) {
        for s in 0..self.slots.len() {
            let e = self.slots[s];
            if e != 0 && !self.keeps(e, shift) {
                self.slots[s] = 0;
                self.len -= 1;
            }
        }
    }

    /// Forget the entry for `key` in `group`, if there is one.
    pub fn remove(&mut self, key: u64, group: u64) {
        let e = self.entry(self.tag(key), group);
        let home = self.home(key);
        for b in [home, self.alt(home, self.tag(key))] {
            if let Some(s) = self.bucket(b).iter().position(|&x| x == e) {
                self.slots[b * BUCKET + s] = 0;
                self.len -= 1;
                return;
            }
        }
    }

    /// The slots as bytes, for a checkpoint.
    #[cfg(test)]
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.encode_range(0..self.slots.len(), out)
    }

    /// Slots `range` as `encode_into` writes them.
    pub fn encode_range(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        out.reserve(range.len() * SLOT_BYTES as usize);
        for s in &self.slots[range] {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }

    /// A table of `bytes` for `groups` groups from `encode_into`'s bytes,
    /// or `None` if they do not describe one (every group number in range,
    /// every entry in one of its two buckets, sampled at `shift`).
    pub fn decode(bytes: u64, groups: u64, shift: u32, body: &[u8]) -> Option<CompactTable> {
        let mut t = CompactTable::new(bytes, groups)?;
        if body.len() != t.slots.len() * SLOT_BYTES as usize || shift > t.tag_bits {
            return None;
        }
        let mut len = 0;
        for (s, c) in body.chunks_exact(4).enumerate() {
            let e = u32::from_le_bytes(c.try_into().ok()?);
            if e != 0 {
                let group1 = (e & ((1u32 << t.group_bits) - 1)) as u64;
                if group1 == 0 || group1 > groups || !t.keeps(e, shift) {
                    return None;
                }
                len += 1;
            }
            t.slots[s] = e;
        }
        t.len = len;
        (len <= t.slots.len()).then_some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> u64 {
        i.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(17) ^ 0x5555
    }

    fn groups_of(t: &CompactTable, k: u64) -> Vec<u64> {
        let mut v = Vec::new();
        t.candidates(k, |g| v.push(g));
        v
    }

    #[test]
    fn holds_what_it_is_given_to_98_percent_load() {
        let mut t = CompactTable::new(1 << 20, 1 << 18).unwrap();
        assert_eq!(t.tag_bits(), 13);
        let n = t.capacity() as u64;
        for i in 0..n {
            t.insert(key(i), i % (1 << 18)).expect("fits below 98 %");
        }
        assert_eq!(t.len() as u64, n);
        for i in 0..n {
            assert!(groups_of(&t, key(i)).contains(&(i % (1 << 18))), "{i}");
        }
        // Chance matches stay near 2 * BUCKET / 2^13 per lookup.
        let chance: usize = (n..n + 100_000).map(|i| groups_of(&t, key(i)).len()).sum();
        assert!(
            chance < 100_000 * 2 * BUCKET / (1 << 13) * 3 / 2,
            "{chance}"
        );
    }

    #[test]
    fn removes_exactly_and_samples_by_tag() {
        let mut t = CompactTable::new(1 << 16, 1000).unwrap();
        for i in 0..4000 {
            t.insert(key(i), i % 1000).unwrap();
        }
        for i in (0..4000).step_by(2) {
            t.remove(key(i), i % 1000);
        }
        t.remove(key(1), 999 - 1); // the wrong group: kept
        for i in 0..4000 {
            let has = groups_of(&t, key(i)).contains(&(i % 1000));
            assert_eq!(has, i % 2 == 1, "{i}");
        }
        let before = t.len();
        t.sample(1);
        assert!(t.len() * 10 > before * 4 && t.len() * 10 < before * 6);
        for i in (1..4000).step_by(2) {
            let sampled = key(i) & 1 == 0;
            assert_eq!(groups_of(&t, key(i)).contains(&(i % 1000)), sampled);
        }
    }

    #[test]
    fn refuses_groups_that_leave_too_short_a_tag() {
        assert!(CompactTable::new(1 << 20, 1 << 24).is_none());
        assert!(CompactTable::new(1 << 20, (1 << 23) - 1).is_some());
    }

    #[test]
    fn round_trips_and_rejects_foreign_bytes() {
        let mut t = CompactTable::new(1 << 14, 500).unwrap();
        for i in 0..800 {
            t.insert(key(i), i % 500).unwrap();
        }
        let mut b = Vec::new();
        t.encode_into(&mut b);
        let d = CompactTable::decode(1 << 14, 500, 0, &b).unwrap();
        assert_eq!(d.len(), t.len());
        assert_eq!(d.slots, t.slots);
        assert!(
            CompactTable::decode(1 << 14, 400, 0, &b).is_none(),
            "group out of range"
        );
        assert!(
            CompactTable::decode(1 << 15, 500, 0, &b).is_none(),
            "length"
        );
        assert!(
            CompactTable::decode(1 << 14, 500, 3, &b).is_none(),
            "unsampled entries"
        );
    }
}
