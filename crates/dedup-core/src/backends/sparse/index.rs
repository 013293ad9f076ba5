//! The sparse store's hash index: advice in RAM, within a memory budget
//! (Guo & Efstathopoulos §3.2). Correctness never depends on it: every
//! candidate it gives is confirmed against the chunk record (the
//! fingerprint stored with the chunk, on the metadata device) before the
//! store returns it, so a lost, stale or sampled index costs missed
//! deduplication only, never wrong data.
//!
//! - **Two tables.** It starts with the exact table (`exact.rs`: key and
//!   PBN, 16 bytes an entry), which grows with the data. Once that would
//!   pass a quarter of the compact table's size, its entries move into the
//!   compact table (`compact.rs`: 4 bytes an entry, naming the chunk's
//!   group), sized to the budget, where the index stays.
//! - **Progressive sampling** (§3.2.2): at the budget, the sampling rate
//!   halves (R = 2^-shift) and entries whose key's low `shift` bits are
//!   not all zero are dropped; only sampled fingerprints are inserted from
//!   then on.
//! - **Prefetch by locality** (§3.2.1): a confirmed hit loads the
//!   fingerprints of the chunks stored around it (a *group*: the chunks
//!   stored in `GROUP_BLOCKS` consecutive data blocks, which sequential
//!   allocation fills with chunks written together) into a cache with
//!   container-LRU eviction, so a duplicate stream keeps deduplicating
//!   between sampled hooks. The store says which group a PBN is in.

use std::ops::Range;

use lru::LruCache;
use rustc_hash::FxHashMap;

use super::compact::{CompactTable, Homeless};
use super::exact::{ExactTable, ENTRY_BYTES, MIN_SLOTS};
use crate::backend::IndexFigures;
use crate::config::{Addressing, Pbn};

/// Data blocks whose chunks one prefetch loads: the paper's container, 4 MiB
/// of data written together in 4 KiB blocks, and at least 1,024 chunks
/// (more when packed). Guo's Eq. 2 with T_min = 1,024 predicts 97 % of
/// full-index dedup at a sampling rate of 1/32.
pub const GROUP_BLOCKS: u64 = 1024;
/// Bytes a prefetched fingerprint costs (map entry and group list).
const CACHED_BYTES: u64 = 40;

/// What the table knows of a fingerprint: where its chunk is (exact
/// table), or which group holds it (compact table). Either is confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    Pbn(Pbn),
    Group(u64),
}

/// At most this many hints per lookup are followed (more mean chance tag
/// matches in a crowded bucket).
pub const MAX_HINTS: usize = 4;

enum Table {
    Exact(ExactTable),
    Compact(CompactTable),
}

/// Which group a PBN's chunk is in: the data block holding it (through the
/// packing's addressing, if the device packs), by `GROUP_BLOCKS`.
#[derive(Clone, Copy, Debug)]
pub struct Grouping {
    addressing: Option<Addressing>,
    blocks: u64,
}

impl Grouping {
    /// For a device of `blocks` data blocks, addressed by `addressing` if it
    /// packs (else a PBN is a block).
    pub fn new(addressing: Option<Addressing>, blocks: u64) -> Grouping {
        Grouping { addressing, blocks }
    }

    pub fn groups(&self) -> u64 {
        self.blocks.div_ceil(GROUP_BLOCKS).max(1)
    }

    pub fn group(&self, pbn: Pbn) -> u64 {
        let block = match self.addressing {
            Some(a) => a.split(pbn).0,
            None => pbn,
        };
        block / GROUP_BLOCKS
    }

    /// The PBNs whose chunks group `g` may hold: the raw chunks of its
    /// blocks, and the fragments packed in them.
    pub fn ranges(&self, g: u64) -> [Range<Pbn>; 2] {
        let first = (g * GROUP_BLOCKS).min(self.blocks);
        let end = (first + GROUP_BLOCKS).min(self.blocks);
        match self.addressing {
            None => [first..end, 0..0],
            Some(a @ Addressing::DenseRaw { .. }) => [first..end, a.addr(first, 0)..a.addr(end, 0)],
            Some(a @ Addressing::Slots) => [a.addr(first, 0)..a.addr(end, 0), 0..0],
        }
    }
}

pub struct SampledIndex {
    table: Table,
    pub grouping: Grouping,
    /// Most slots the exact table may grow to.
    max_exact_slots: usize,
    /// Bytes of the compact table, and the groups its entries name; `None`
    /// when the exact table is the only one (too many groups for a tag).
    compact: Option<(u64, u64)>,
    shift: u32,
    /// Prefetched key -> PBN, and the keys each group brought.
    cached: FxHashMap<u64, Pbn>,
    groups: LruCache<u64, Vec<u64>>,
    max_cached: usize,
    index_memory: u64,
    cache: u64,
    pub stats: IndexFigures,
}

/// The share of a budget kept for prefetched fingerprints unless told
/// otherwise: an eighth, but at least `STREAM_CACHE` while that leaves
/// half for the table, and at least one unpacked group's.
pub fn default_cache(index_memory: u64) -> u64 {
    (index_memory / 8)
        .max(STREAM_CACHE.min(index_memory / 2))
        .max(GROUP_BLOCKS * CACHED_BYTES)
}

/// A prefetch cache that holds the groups duplicate streams go back to
/// (52 K fingerprints): measured on successive image versions, a table at
/// 1/32 of the full index behind it kept 98 % of the deduplication, behind
/// a 40 KiB cache 63 %. A starved cache costs more than a sampled table.
const STREAM_CACHE: u64 = 2 << 20;

/// The compact table's bytes for a table share and a number of groups, if
/// its tags are long enough.
fn compact_shape(table: u64, groups: u64) -> Option<(u64, u64)> {
    let groups = groups.max(1);
    CompactTable::new(table.min(1 << 12), groups)?;
    Some((table, groups))
}

/// The most slots the exact table may take: the whole table share, or a
/// quarter of the compact table's bytes when that takes over.
fn max_exact_slots(table: u64, compact: Option<(u64, u64)>) -> usize {
    let bytes = match compact {
        Some((c, _)) => c / 4,
        None => table,
    };
    // A floor of a few slots: tiny budgets are for tests that make the
    // index sample on a few chunks.
    (bytes / ENTRY_BYTES).max(4) as usize
}

impl SampledIndex {
    /// An empty index within `index_memory` bytes for a store grouped by
    /// `grouping`: an eighth (at least a group's worth) for prefetched
    /// fingerprints, the rest for the table.
    pub fn new(index_memory: u64, grouping: Grouping) -> SampledIndex {
        SampledIndex::with_cache(index_memory, default_cache(index_memory), grouping)
    }

    /// An empty index within `index_memory` bytes, `cache` of them for
    /// prefetched fingerprints (a research knob: how big a prefetch cache
    /// the streams need does not follow from the table's size).
    pub fn with_cache(index_memory: u64, cache: u64, grouping: Grouping) -> SampledIndex {
        let table = index_memory.saturating_sub(cache);
        let compact = compact_shape(table, grouping.groups());
        let max_exact_slots = max_exact_slots(table, compact);
        let max_cached = (cache.min(index_memory) / CACHED_BYTES) as usize;
        SampledIndex {
            grouping,
            table: Table::Exact(ExactTable::new(MIN_SLOTS.min(max_exact_slots))),
            max_exact_slots,
            compact,
            shift: 0,
            cached: FxHashMap::default(),
            groups: LruCache::unbounded(),
            max_cached,
            index_memory,
            cache,
            stats: IndexFigures {
                index_memory,
                sampling_period: 1,
                ..Default::default()
            },
        }
    }

    /// Fingerprints a full (unsampled) index holds within `index_memory`.
    pub fn full_capacity(index_memory: u64, grouping: Grouping) -> u64 {
        let table = index_memory.saturating_sub(default_cache(index_memory));
        match compact_shape(table, grouping.groups()).and_then(|(b, g)| CompactTable::new(b, g)) {
            Some(t) => t.capacity() as u64,
            None => max_exact_slots(table, None) as u64 * 7 / 8,
        }
    }

    fn sampled(&self, key: u64) -> bool {
        key & ((1u64 << self.shift) - 1) == 0
    }

    /// Count a lookup of `key` that the sample covers (the table holds
    /// every sampled key, so its outcome is the truth about `key`): the
    /// evidence `missed_estimate` scales up.
    pub fn note_lookup(&mut self, key: u64, found: bool) {
        if self.sampled(key) {
            // Sampled with probability 1/period: a hit stands for period
            // duplicates (Horvitz-Thompson), so rate changes do not bias it.
            self.stats.sampled_lookups += 1;
            self.stats.duplicates_seen += (found as u64) << self.shift;
        }
    }

    /// A prefetched fingerprint's PBN, to be confirmed by the caller.
    pub fn cached(&self, key: u64) -> Option<Pbn> {
        self.cached.get(&key).copied()
    }

    /// `ExactTable::touch` for a key about to be looked up.
    pub fn touch(&self, key: u64) {
        if let (true, Table::Exact(t)) = (self.sampled(key), &self.table) {
            t.touch(key);
        }
    }

    /// The table's hints for a fingerprint key (each to be confirmed by the
    /// caller), at most `MAX_HINTS`.
    pub fn hints(&self, key: u64) -> ([Hint; MAX_HINTS], usize) {
        let mut out = [Hint::Pbn(0); MAX_HINTS];
        let mut n = 0;
        if !self.sampled(key) {
            // The table holds sampled keys only.
            return (out, 0);
        }
        match &self.table {
            Table::Exact(t) => {
                if let Some(p) = t.get(key) {
                    out[0] = Hint::Pbn(p);
                    n = 1;
                }
            }
            Table::Compact(t) => t.candidates(key, |g| {
                if n < MAX_HINTS && !out[..n].contains(&Hint::Group(g)) {
                    out[n] = Hint::Group(g);
                    n += 1;
                }
            }),
        }
        (out, n)
    }

    /// Remember that `key`'s chunk is at `pbn`, if it is sampled at the
    /// current rate.
    pub fn insert(&mut self, key: u64, pbn: Pbn) {
        // A group in the prefetch cache stays whole: a compact-table hint
        // names the group, and the cache must then hold its new chunks too.
        let group = self.grouping.group(pbn);
        if let Some(keys) = self.groups.peek_mut(&group) {
            keys.push(key);
            self.cached.insert(key, pbn);
            self.stats.prefetched_fingerprints = self.cached.len() as u64;
        }
        if !self.sampled(key) {
            return;
        }
        if let Table::Exact(t) = &mut self.table {
            if t.full() && t.slots() < self.max_exact_slots {
                let slots = (t.slots() * 2).min(self.max_exact_slots);
                let shift = self.shift;
                t.rebuild(slots, |k| k & ((1u64 << shift) - 1) == 0);
            } else if t.full() && self.compact.is_some() {
                self.move_to_compact();
            }
        }
        // Full at the budget: halve the sampling rate (§3.2.2) until there
        // is room, or the key is no longer sampled.
        while matches!(&self.table, Table::Exact(t) if t.full()) {
            if !self.halve() || !self.sampled(key) {
                return;
            }
        }
        match &mut self.table {
            Table::Exact(t) => t.put(key, pbn),
            Table::Compact(_) => self.insert_compact(key, group),
        }
        self.stats.entries = self.len() as u64;
    }

    fn insert_compact(&mut self, key: u64, group: u64) {
        let Table::Compact(t) = &mut self.table else {
            return;
        };
        if t.full() {
            self.halve();
            if !self.sampled(key) {
                return;
            }
        }
        let Table::Compact(t) = &mut self.table else {
            return;
        };
        let mut homeless: Result<(), Homeless> = t.insert(key, group);
        // Displacements found no slot: sample more until the entry in hand
        // has one or is not sampled any more.
        while let Err(h) = homeless {
            if !self.halve() {
                break;
            }
            let Table::Compact(t) = &mut self.table else {
                return;
            };
            homeless = t.reinsert(h, self.shift);
        }
    }

    /// Move the exact table's entries into the compact table.
    fn move_to_compact(&mut self) {
        let Some((bytes, groups)) = self.compact else {
            return;
        };
        let Some(compact) = CompactTable::new(bytes, groups) else {
            return;
        };
        let Table::Exact(exact) = std::mem::replace(&mut self.table, Table::Compact(compact))
        else {
            return;
        };
        for (key, pbn) in exact.entries() {
            self.insert_compact(key, self.grouping.group(pbn));
        }
    }

    /// Halve the sampling rate and drop the entries it no longer keeps;
    /// `false` if the rate cannot fall further.
    fn halve(&mut self) -> bool {
        let limit = match &self.table {
            Table::Exact(_) => 63,
            Table::Compact(t) => t.tag_bits(),
        };
        if self.shift >= limit {
            return false;
        }
        self.shift += 1;
        self.stats.sampling_period = 1 << self.shift;
        let shift = self.shift;
        match &mut self.table {
            Table::Exact(t) => {
                let slots = t.slots();
                t.rebuild(slots, |k| k & ((1u64 << shift) - 1) == 0);
            }
            Table::Compact(t) => t.sample(shift),
        }
        self.stats.entries = self.len() as u64;
        true
    }

    fn len(&self) -> usize {
        match &self.table {
            Table::Exact(t) => t.len(),
            Table::Compact(t) => t.len(),
        }
    }

    /// Forget `key` where it names `pbn` (the chunk was freed or moved).
    pub fn remove(&mut self, key: u64, pbn: Pbn) {
        if self.cached.get(&key) == Some(&pbn) {
            self.cached.remove(&key);
            self.stats.prefetched_fingerprints = self.cached.len() as u64;
        }
        match &mut self.table {
            Table::Exact(t) => t.remove(key, pbn),
            Table::Compact(t) => t.remove(key, self.grouping.group(pbn)),
        }
        self.stats.entries = self.len() as u64;
    }

    /// The table as bytes for a checkpoint: which table (0 exact, 1
    /// compact), the sampling shift, the slot count, then the slots.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_parts(|piece| {
            out.extend_from_slice(piece);
            Ok(())
        })
        .expect("a Vec takes every piece");
        out
    }

    /// `encode`'s bytes, handed to `sink` a piece at a time (a checkpoint of
    /// a large table is written without a second copy of it in RAM).
    pub fn encode_parts(
        &self,
        mut sink: impl FnMut(&[u8]) -> crate::error::Result<()>,
    ) -> crate::error::Result<()> {
        let (kind, slots) = match &self.table {
            Table::Exact(t) => (0u32, t.slots()),
            Table::Compact(t) => (1u32, (t.bytes() / super::compact::SLOT_BYTES) as usize),
        };
        let mut piece = Vec::with_capacity(1 << 20);
        piece.extend_from_slice(&kind.to_le_bytes());
        piece.extend_from_slice(&self.shift.to_le_bytes());
        piece.extend_from_slice(&(slots as u64).to_le_bytes());
        sink(&piece)?;
        const SLOTS_PER_PIECE: usize = 1 << 16;
        for start in (0..slots).step_by(SLOTS_PER_PIECE) {
            let range = start..(start + SLOTS_PER_PIECE).min(slots);
            piece.clear();
            match &self.table {
                Table::Exact(t) => t.encode_range(range, &mut piece),
                Table::Compact(t) => t.encode_range(range, &mut piece),
            }
            sink(&piece)?;
        }
        Ok(())
    }

    /// An index within `index_memory` for `grouping` from `encode`'s bytes,
    /// or `None` if they do not describe one this budget allows (the caller
    /// rebuilds instead). Every entry stays advice: lookups confirm it.
    pub fn decode(index_memory: u64, grouping: Grouping, bytes: &[u8]) -> Option<SampledIndex> {
        SampledIndex::new(index_memory, grouping).load(bytes)
    }

    /// This (empty) index with the table `encode`'s bytes describe, or
    /// `None` if they do not fit its budget and grouping.
    pub fn load(self, bytes: &[u8]) -> Option<SampledIndex> {
        let kind = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        let shift = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
        let slots = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
        let body = &bytes[16..];
        let mut ix = self;
        if shift > 63 {
            return None;
        }
        ix.table = match kind {
            0 => {
                let slots = usize::try_from(slots).ok()?;
                if slots < MIN_SLOTS.min(ix.max_exact_slots) || slots > ix.max_exact_slots {
                    return None;
                }
                Table::Exact(ExactTable::decode(slots, body, |k| {
                    k & ((1u64 << shift) - 1) == 0
                })?)
            }
            1 => {
                let (b, groups) = ix.compact?;
                let t = CompactTable::decode(b, groups, shift, body)?;
                if t.bytes() / super::compact::SLOT_BYTES != slots {
                    return None;
                }
                Table::Compact(t)
            }
            _ => return None,
        };
        ix.shift = shift;
        ix.stats.sampling_period = 1 << shift;
        ix.stats.entries = ix.len() as u64;
        Some(ix)
    }

    /// Whether the group of `pbn` is in the prefetch cache already.
    pub fn has_group(&mut self, group: u64) -> bool {
        self.groups.get(&group).is_some()
    }

    /// The fingerprint keys of group `group`'s chunks, read from
    /// their records after a hit there: cache them, evicting the least
    /// recently prefetched groups (container LRU) to stay in budget.
    pub fn prefetched(&mut self, group: u64, entries: Vec<(u64, Pbn)>) {
        let keys: Vec<u64> = entries.iter().map(|(k, _)| *k).collect();
        for (k, p) in entries {
            self.cached.insert(k, p);
        }
        self.groups.put(group, keys);
        while self.cached.len() > self.max_cached && self.groups.len() > 1 {
            let Some((old, keys)) = self.groups.pop_lru() else {
                break;
            };
            for k in keys {
                if self
                    .cached
                    .get(&k)
                    .is_some_and(|p| self.grouping.group(*p) == old)
                {
                    self.cached.remove(&k);
                }
            }
        }
        self.stats.prefetched_fingerprints = self.cached.len() as u64;
    }

    /// RAM the index holds now.
    pub fn bytes(&self) -> u64 {
        let table = match &self.table {
            Table::Exact(t) => t.bytes(),
            Table::Compact(t) => t.bytes(),
        };
        table + self.cached.len() as u64 * CACHED_BYTES
    }

    pub fn index_memory(&self) -> u64 {
        self.index_memory
    }

    /// An empty index of this one's budget, cache and grouping.
    pub fn emptied(&self) -> SampledIndex {
        SampledIndex::with_cache(self.index_memory, self.cache, self.grouping)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> u64 {
        // Uniform keys, as fingerprints' first bytes are.
        i.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(17) ^ 0x5555
    }

    /// An unpacked device of `blocks` blocks.
    fn grouping(blocks: u64) -> Grouping {
        Grouping::new(None, blocks)
    }

    fn finds(ix: &SampledIndex, i: u64) -> bool {
        let (hints, n) = ix.hints(key(i));
        hints[..n]
            .iter()
            .any(|h| *h == Hint::Pbn(i) || *h == Hint::Group(i / GROUP_BLOCKS))
    }

    #[test]
    fn grows_exact_then_moves_to_the_compact_table() {
        let index_memory = 4 << 20;
        let mut ix = SampledIndex::new(index_memory, grouping(1 << 30));
        for i in 0..20_000 {
            ix.insert(key(i), i);
        }
        assert!(matches!(ix.table, Table::Exact(_)));
        assert_eq!(ix.hints(key(7)).0[0], Hint::Pbn(7));
        for i in 20_000..200_000 {
            ix.insert(key(i), i);
        }
        assert!(matches!(ix.table, Table::Compact(_)));
        assert_eq!(ix.stats.sampling_period, 1);
        assert_eq!(ix.stats.entries, 200_000);
        assert!((0..200_000).all(|i| finds(&ix, i)));
        assert!(ix.bytes() <= index_memory);
        let slots = (index_memory - default_cache(index_memory)) / 32 * 8;
        assert_eq!(
            SampledIndex::full_capacity(index_memory, grouping(1 << 30)),
            slots * 49 / 50
        );
    }

    #[test]
    fn samples_progressively_within_its_budget() {
        // Compact (a small PBN space) and exact only (a PBN space too big
        // for the compact table's tags).
        for pbn_space in [1u64 << 30, 1 << 50] {
            let index_memory = 1 << 20;
            let mut ix = SampledIndex::new(index_memory, grouping(pbn_space));
            for i in 0..1_000_000 {
                ix.insert(key(i), i);
            }
            assert!(ix.stats.sampling_period > 1, "{:?}", ix.stats);
            assert!(
                ix.bytes() <= index_memory,
                "{} > {index_memory}",
                ix.bytes()
            );
            // Every sampled key is still found; about 1/period of all are.
            let found = (0..1_000_000).filter(|&i| finds(&ix, i)).count() as u64;
            let expect = 1_000_000 / ix.stats.sampling_period;
            assert!(
                found * 10 > expect * 7 && found * 10 < expect * 13,
                "{pbn_space}: {found} vs {expect}"
            );
            let sampled_found = (0..1_000_000)
                .filter(|&i| ix.sampled(key(i)))
                .all(|i| finds(&ix, i));
            assert!(sampled_found, "{pbn_space}: a sampled key was lost");
        }
    }

    #[test]
    fn checkpoints_round_trip_and_reject_another_shape() {
        for n in [3_000u64, 200_000] {
            let (index_memory, space) = (4 << 20, 1 << 30);
            let mut ix = SampledIndex::new(index_memory, grouping(space));
            for i in 0..n {
                ix.insert(key(i), i);
            }
            let bytes = ix.encode();
            let back =
                SampledIndex::decode(index_memory, grouping(space), &bytes).expect("decodes");
            assert_eq!(back.stats.entries, n);
            assert!((0..n).all(|i| finds(&back, i)));
            assert!(SampledIndex::decode(64 << 10, grouping(space), &bytes).is_none());
            assert!(
                SampledIndex::decode(index_memory, grouping(space), &bytes[..bytes.len() - 1])
                    .is_none()
            );
        }
    }

    /// A checkpoint is read from disk: damaged bytes must give an index
    /// that passes its own checks, or none, never a panic.
    #[test]
    fn damaged_checkpoints_decode_to_none_or_a_valid_index() {
        let (index_memory, space) = (1 << 20, 1 << 30);
        for n in [2_000u64, 150_000] {
            let mut ix = SampledIndex::new(index_memory, grouping(space));
            for i in 0..n {
                ix.insert(key(i), i);
            }
            let good = ix.encode();
            let mut rng = 0x9E37_79B9u64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            for round in 0..300 {
                let mut b = good.clone();
                for _ in 0..1 + round % 4 {
                    let at = (next() % b.len() as u64) as usize;
                    b[at] ^= 1 << (next() % 8);
                }
                if round % 7 == 0 {
                    b.truncate((next() % b.len() as u64) as usize);
                }
                if let Some(d) = SampledIndex::decode(index_memory, grouping(space), &b) {
                    // Usable: lookups and inserts work on what it holds.
                    let _ = d.hints(key(1));
                    let mut d = d;
                    d.insert(key(n + 1), n + 1);
                    assert!(d.bytes() <= index_memory);
                }
            }
        }
    }

    #[test]
    fn a_group_holds_the_raw_chunks_and_the_fragments_of_its_blocks() {
        let a = Addressing::DenseRaw { blocks: 3000 };
        let g = Grouping::new(Some(a), 3000);
        assert_eq!(g.groups(), 3);
        let frag = a.addr(1500, 7);
        assert_eq!(g.group(frag), 1);
        assert_eq!(g.group(a.addr(1500, crate::config::RAW_SLOT)), 1);
        let [raw, frags] = g.ranges(1);
        assert_eq!(raw, 1024..2048);
        assert!(frags.contains(&frag) && frags.contains(&a.addr(1024, 0)));
        assert!(!frags.contains(&a.addr(2048, 0)) && !frags.contains(&a.addr(1023, 13)));
        assert_eq!(g.ranges(2)[0], 2048..3000);
        assert_eq!(Grouping::new(None, 3000).ranges(2), [2048..3000, 0..0]);
    }

    #[test]
    fn prefetched_groups_are_evicted_whole_least_recent_first() {
        let mut ix = SampledIndex::new(1 << 20, grouping(1 << 30));
        let per_group = GROUP_BLOCKS as usize;
        let groups = ix.max_cached / per_group + 2;
        for g in 0..groups as u64 {
            let entries = (0..GROUP_BLOCKS)
                .map(|i| (key(g * GROUP_BLOCKS + i), g * GROUP_BLOCKS + i))
                .collect();
            ix.prefetched(g, entries);
        }
        assert!(ix.cached.len() <= ix.max_cached);
        assert_eq!(ix.cached(key(0)), None, "oldest group evicted");
        let last = (groups as u64 - 1) * GROUP_BLOCKS;
        assert_eq!(ix.cached(key(last)), Some(last));
    }
}
