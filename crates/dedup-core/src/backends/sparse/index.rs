//! The sparse store's hash index: advice in RAM, within a memory budget
//! (Guo & Efstathopoulos §3.2). Correctness never depends on it: every
//! candidate it gives is confirmed against the chunk record (the
//! fingerprint stored with the chunk, on the metadata device) before the
//! store returns it, so a lost, stale or sampled index costs missed
//! deduplication only, never wrong data.
//!
//! - **Compact entries** (16 bytes: the fingerprint's first 8 bytes as the
//!   key, and the PBN) in an open-addressing table that grows with the data
//!   until it reaches the budget.
//! - **Progressive sampling** (§3.2.2): at the budget, the sampling rate
//!   halves (R = 2^-shift) and entries whose key's low `shift` bits are
//!   not all zero are dropped; only sampled fingerprints are inserted from
//!   then on.
//! - **Prefetch by locality** (§3.2.1): a confirmed hit loads the
//!   fingerprints of the chunks stored around it (a *group*: the records of
//!   `GROUP_PBNS` consecutive PBNs, which sequential allocation fills with
//!   chunks written together) into a cache with container-LRU eviction, so
//!   a duplicate stream keeps deduplicating between sampled hooks.

use std::collections::HashMap;

use lru::LruCache;

use crate::backend::IndexFigures;
use crate::config::Pbn;

/// PBNs whose records one prefetch loads: the paper's container. With 4 KiB
/// chunks, 1,024 chunks (4 MiB of data written together). Guo's Eq. 2 with
/// T_min = 1,024 predicts 97 % of full-index dedup at a sampling rate of
/// 1/32.
pub const GROUP_PBNS: u64 = 1024;
/// Bytes an entry of the table costs.
pub const ENTRY_BYTES: u64 = 16;
/// Bytes a prefetched fingerprint costs (map entry and group list).
const CACHED_BYTES: u64 = 40;
/// The table starts with this many slots and doubles as it fills.
const MIN_SLOTS: usize = 1 << 12;

#[derive(Clone, Copy, Default)]
struct Slot {
    key: u64,
    /// PBN + 1; 0 = empty.
    pbn1: u64,
}

pub struct SampledIndex {
    slots: Vec<Slot>,
    len: usize,
    /// Most slots the budget allows (a power of two).
    max_slots: usize,
    shift: u32,
    /// Prefetched key -> PBN, and the keys each group brought.
    cached: HashMap<u64, Pbn>,
    groups: LruCache<u64, Vec<u64>>,
    max_cached: usize,
    budget: u64,
    pub stats: IndexFigures,
}

/// The share of a budget kept for prefetched fingerprints: an eighth, and
/// at least one group's.
fn cache_share(budget: u64) -> u64 {
    (budget / 8).max(GROUP_PBNS * CACHED_BYTES)
}

/// The most slots a budget allows: what the prefetch cache leaves of it,
/// any number, not only a power of two.
fn max_slots(budget: u64) -> usize {
    let table = budget.saturating_sub(cache_share(budget));
    (table / ENTRY_BYTES).max(MIN_SLOTS as u64) as usize
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

impl SampledIndex {
    /// An empty index within `budget` bytes: an eighth (at least a group's
    /// worth) for prefetched fingerprints, the rest for the table.
    pub fn new(budget: u64) -> SampledIndex {
        let max_slots = max_slots(budget);
        let max_cached = (cache_share(budget) / CACHED_BYTES) as usize;
        SampledIndex {
            slots: vec![Slot::default(); MIN_SLOTS.min(max_slots)],
            len: 0,
            max_slots,
            shift: 0,
            cached: HashMap::new(),
            groups: LruCache::unbounded(),
            max_cached,
            budget,
            stats: IndexFigures {
                budget_bytes: budget,
                sampling_period: 1,
                ..Default::default()
            },
        }
    }

    /// Fingerprints a full (unsampled) index holds within `budget`.
    pub fn full_capacity(budget: u64) -> u64 {
        max_slots(budget) as u64 * 7 / 8
    }

    fn sampled(&self, key: u64) -> bool {
        key & ((1u64 << self.shift) - 1) == 0
    }

    /// Candidate PBNs for a fingerprint key: the table's, then the
    /// prefetch cache's (each to be confirmed by the caller).
    pub fn candidates(&self, key: u64) -> [Option<Pbn>; 2] {
        let mut i = bucket(key, self.slots.len());
        let mut from_table = None;
        loop {
            let s = self.slots[i];
            if s.pbn1 == 0 {
                break;
            }
            if s.key == key {
                from_table = Some(s.pbn1 - 1);
                break;
            }
            i = next(i, self.slots.len());
        }
        let from_cache = self
            .cached
            .get(&key)
            .copied()
            .filter(|p| Some(*p) != from_table);
        [from_table, from_cache]
    }

    /// Remember `key -> pbn` if it is sampled at the current rate.
    pub fn insert(&mut self, key: u64, pbn: Pbn) {
        if !self.sampled(key) {
            return;
        }
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            if self.slots.len() < self.max_slots {
                self.resize((self.slots.len() * 2).min(self.max_slots));
            } else {
                // Full at the budget: halve the sampling rate (§3.2.2).
                self.shift += 1;
                self.stats.sampling_period = 1 << self.shift;
                self.resize(self.slots.len());
                if !self.sampled(key) {
                    return;
                }
            }
        }
        self.put(key, pbn);
    }

    fn put(&mut self, key: u64, pbn: Pbn) {
        let n = self.slots.len();
        let mut i = bucket(key, n);
        loop {
            let s = &mut self.slots[i];
            if s.pbn1 == 0 {
                *s = Slot { key, pbn1: pbn + 1 };
                self.len += 1;
                break;
            }
            if s.key == key {
                // Advice: the newest chunk with this key wins.
                s.pbn1 = pbn + 1;
                break;
            }
            i = next(i, n);
        }
        self.stats.entries = self.len as u64;
    }

    /// Rebuild with `slots` slots, keeping the entries sampled at the
    /// current rate.
    fn resize(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); slots]);
        self.len = 0;
        for s in old.into_iter().filter(|s| s.pbn1 != 0) {
            if self.sampled(s.key) {
                self.put(s.key, s.pbn1 - 1);
            }
        }
        self.stats.entries = self.len as u64;
    }

    /// Forget `key` where it names `pbn` (the chunk was freed or moved).
    pub fn remove(&mut self, key: u64, pbn: Pbn) {
        if self.cached.get(&key) == Some(&pbn) {
            self.cached.remove(&key);
        }
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
        self.stats.entries = self.len as u64;
    }

    /// The table as bytes for a checkpoint: sampling shift, slot count,
    /// entries, then every slot (key, PBN + 1).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20 + self.slots.len() * ENTRY_BYTES as usize);
        out.extend_from_slice(&self.shift.to_le_bytes());
        out.extend_from_slice(&(self.slots.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        for s in &self.slots {
            out.extend_from_slice(&s.key.to_le_bytes());
            out.extend_from_slice(&s.pbn1.to_le_bytes());
        }
        out
    }

    /// An index within `budget` from `encode`'s bytes, or `None` if they do
    /// not describe one this budget allows (the caller rebuilds instead).
    /// Every entry stays advice: lookups confirm it against the records.
    pub fn decode(budget: u64, bytes: &[u8]) -> Option<SampledIndex> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let shift = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        let slots = word(4)? as usize;
        let len = word(12)? as usize;
        let mut ix = SampledIndex::new(budget);
        if shift > 63 || slots < MIN_SLOTS.min(ix.max_slots) || slots > ix.max_slots || len > slots
        {
            return None;
        }
        if bytes.len() != 20 + slots * ENTRY_BYTES as usize {
            return None;
        }
        ix.shift = shift;
        ix.slots = bytes[20..]
            .chunks_exact(16)
            .map(|c| Slot {
                key: u64::from_le_bytes(c[..8].try_into().expect("8 bytes")),
                pbn1: u64::from_le_bytes(c[8..].try_into().expect("8 bytes")),
            })
            .collect();
        let found = ix.slots.iter().filter(|s| s.pbn1 != 0).count();
        if found != len || found * 8 > slots * 7 {
            return None;
        }
        ix.len = len;
        ix.stats.sampling_period = 1 << shift;
        ix.stats.entries = len as u64;
        Some(ix)
    }

    /// Whether the group of `pbn` is in the prefetch cache already.
    pub fn has_group(&mut self, pbn: Pbn) -> bool {
        self.groups.get(&(pbn / GROUP_PBNS)).is_some()
    }

    /// The fingerprint keys of group `pbn / GROUP_PBNS`'s chunks, read from
    /// their records after a hit there: cache them, evicting the least
    /// recently prefetched groups (container LRU) to stay in budget.
    pub fn prefetched(&mut self, pbn: Pbn, entries: Vec<(u64, Pbn)>) {
        let group = pbn / GROUP_PBNS;
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
                if self.cached.get(&k).is_some_and(|p| p / GROUP_PBNS == old) {
                    self.cached.remove(&k);
                }
            }
        }
        self.stats.prefetched_fingerprints = self.cached.len() as u64;
    }

    /// RAM the index holds now.
    pub fn bytes(&self) -> u64 {
        self.slots.len() as u64 * ENTRY_BYTES + self.cached.len() as u64 * CACHED_BYTES
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> u64 {
        // Uniform keys, as fingerprints' first bytes are.
        i.wrapping_mul(0xD6E8_FEB8_6659_FD93).rotate_left(17) ^ 0x5555
    }

    #[test]
    fn finds_what_it_holds_and_forgets_what_is_removed() {
        let mut ix = SampledIndex::new(64 << 20);
        for i in 0..50_000 {
            ix.insert(key(i), i);
        }
        assert_eq!(ix.stats.sampling_period, 1);
        for i in 0..50_000 {
            assert_eq!(ix.candidates(key(i))[0], Some(i), "{i}");
        }
        for i in (0..50_000).step_by(3) {
            ix.remove(key(i), i);
        }
        // Removing with the wrong PBN leaves the entry.
        ix.remove(key(1), 999_999);
        for i in 0..50_000 {
            let want = (i % 3 != 0).then_some(i);
            assert_eq!(ix.candidates(key(i))[0], want, "{i}");
        }
    }

    #[test]
    fn samples_progressively_within_its_budget() {
        let budget = 1 << 20;
        let mut ix = SampledIndex::new(budget);
        for i in 0..400_000 {
            ix.insert(key(i), i);
        }
        assert!(ix.stats.sampling_period > 1, "{:?}", ix.stats);
        assert!(ix.bytes() <= budget, "{} > {budget}", ix.bytes());
        // Every sampled key is still found; about 1/period of all are.
        let found = (0..400_000)
            .filter(|&i| ix.candidates(key(i))[0] == Some(i))
            .count() as u64;
        let expect = 400_000 / ix.stats.sampling_period;
        assert!(
            found * 10 > expect * 7 && found * 10 < expect * 13,
            "{found} vs {expect}"
        );
    }

    #[test]
    fn prefetched_groups_are_evicted_whole_least_recent_first() {
        let mut ix = SampledIndex::new(1 << 20);
        let per_group = GROUP_PBNS as usize;
        let groups = ix.max_cached / per_group + 2;
        for g in 0..groups as u64 {
            let entries = (0..GROUP_PBNS)
                .map(|i| (key(g * GROUP_PBNS + i), g * GROUP_PBNS + i))
                .collect();
            ix.prefetched(g * GROUP_PBNS, entries);
        }
        assert!(ix.cached.len() <= ix.max_cached);
        assert_eq!(ix.candidates(key(0))[1], None, "oldest group evicted");
        let last = (groups as u64 - 1) * GROUP_PBNS;
        assert_eq!(ix.candidates(key(last))[1], Some(last));
    }
}
