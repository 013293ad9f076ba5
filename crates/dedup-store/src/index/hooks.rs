//! The hook table: the sampled part of the index that lives in RAM (§3.2),
//! fingerprint → container, held within a memory budget by progressive
//! sampling (§3.2.2).
//!
//! A hook keys on the fingerprint's 64-bit prefix only, and keeps the
//! container in the other 8 bytes of a 16-byte slot (the top bit marks the
//! pinned hook): 17 bytes a slot with hashbrown's control byte, where the
//! whole fingerprint made it 49. A hook is advice that a catalog confirms
//! (by the whole fingerprint), so two fingerprints sharing a prefix (odds
//! about n/2^64) cost at most a wasted prefetch, never a wrong answer.
//!
//! A Bloom filter sits in front of the table, as in front of the paper's
//! index dhash (§3.2.3): most lookups of a new segment end there, in a
//! filter of 1 to 2 bytes a hook (about 2 % false positives), without a
//! probe of the 17-byte slots. It never forgets a hook the table holds;
//! hooks removed stay in it until it is rebuilt (when the table outgrows
//! it, or R halves), which only lets more lookups through to the table.
//!
//! Each container keeps one *pinned* hook whatever R is (its first
//! fingerprint not already a hook), the paper's minimum of one hook per
//! container that seeds catalog prefetch (§3.2.1). Every other hook is a
//! fingerprint sampled at the current R; halving R drops exactly the
//! unpinned hooks the new R no longer samples.

use std::collections::{HashMap, HashSet};

use dedup_common::fingerprint::Fingerprint;

use super::sampling::SamplingRate;

/// A hook's slot: an 8-byte key and an 8-byte value, plus hashbrown's
/// control byte.
pub const HOOK_SLOT_BYTES: u64 = 17;

/// The value's top bit: the container's pinned hook.
const PINNED: u64 = 1 << 63;

/// The highest container id a hook can name (the top bit is `PINNED`); a
/// repository never hands out more.
pub const MAX_CONTAINER: u64 = PINNED - 1;

/// E: the most RAM a hook costs. hashbrown keeps a power-of-two number
/// of slots, between 7/16 and 7/8 of them full, so a table of n hooks
/// holds at most 2 · 8/7 · n slots: 38.9 bytes a hook; the filter adds
/// at most 2. A budget of M bytes is held to M/E hooks, so the table and
/// its filter stay within M (half of M to M) between inserts; while
/// hashbrown moves to a larger table, or the filter is rebuilt, old and
/// new are held together for a moment.
pub const HOOK_BYTES: u64 = 41;

/// The filter's bits per hook it is sized for; it is sized for twice the
/// hooks it holds at most (it doubles as the table grows).
pub(super) const FILTER_BITS_PER_HOOK: usize = 8;
const MIN_FILTER_HOOKS: usize = 1024;

/// The fewest hooks a table of `max_hooks` sizes its filter for: a
/// kilobyte's worth, unless the budget is smaller.
fn least_filter_hooks(max_hooks: usize) -> usize {
    MIN_FILTER_HOOKS.min(2 * max_hooks).max(1)
}

/// The bytes a table holding up to `capacity` hooks has allocated
/// (hashbrown's `capacity()` is 7/8 of its slots, or slots - 1 below 8).
pub(super) fn table_bytes(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let slots = if capacity < 7 {
        (capacity as u64 + 1).next_power_of_two()
    } else {
        (capacity as u64 * 8).div_ceil(7).next_power_of_two()
    };
    slots * HOOK_SLOT_BYTES
}

type Map = HashMap<u64, u64, foldhash::fast::FixedState>;
type Filter = fastbloom::BloomFilter<foldhash::fast::FixedState>;

/// An empty filter sized for `hooks` hooks.
fn filter_for(hooks: usize) -> Filter {
    fastbloom::BloomFilter::with_num_bits(hooks * FILTER_BITS_PER_HOOK)
        .hasher(foldhash::fast::FixedState::default())
        .expected_items(hooks)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub container: u64,
    /// The container's minimum hook, kept at every R.
    pub pinned: bool,
}

pub struct HookTable {
    /// Fingerprint prefix → container, `PINNED` set on the pinned hook.
    map: Map,
    rate: SamplingRate,
    max_hooks: usize,
    /// Every fingerprint inserted, sampled or not: C/S in Eq. 1.
    fingerprints: u64,
    /// Pinned hooks in `map`, kept by `put` and `keep`: when they are all
    /// it holds, halving R frees nothing (known without a scan; past the
    /// paper's capacity limit every insert would otherwise scan the table).
    pinned: usize,
    /// Every prefix in `map`, and perhaps some removed since.
    filter: Filter,
    /// The hooks `filter` is sized for.
    filter_hooks: usize,
}

impl HookTable {
    /// A table holding at most `max_hooks` hooks, starting at R = 1.
    pub fn new(max_hooks: usize) -> HookTable {
        HookTable::with_rate(max_hooks, SamplingRate::FULL)
    }

    pub fn with_rate(max_hooks: usize, rate: SamplingRate) -> HookTable {
        HookTable {
            map: Map::default(),
            rate,
            max_hooks,
            fingerprints: 0,
            pinned: 0,
            filter: filter_for(least_filter_hooks(max_hooks)),
            filter_hooks: least_filter_hooks(max_hooks),
        }
    }

    pub fn get(&self, fp: &Fingerprint) -> Option<Hook> {
        let prefix = fp.prefix_u64();
        if !self.filter.contains(&prefix) {
            return None;
        }
        self.map.get(&prefix).map(|&v| hook(v))
    }

    /// Whether the filter lets `fp` through to the table (for tests and
    /// figures: a hook always passes).
    pub fn passes_filter(&self, fp: &Fingerprint) -> bool {
        self.filter.contains(&fp.prefix_u64())
    }

    /// Add `prefix` to the map and the filter, growing the filter first
    /// if the map would outgrow it; true if the prefix was not a hook.
    fn put(&mut self, prefix: u64, value: u64) -> bool {
        let old = self.map.insert(prefix, value);
        self.pinned += usize::from(value & PINNED != 0);
        self.pinned -= usize::from(old.is_some_and(|v| v & PINNED != 0));
        let new = old.is_none();
        if new {
            if self.map.len() > self.filter_hooks {
                self.rebuild_filter();
            } else {
                self.filter.insert(&prefix);
            }
        }
        new
    }

    /// A filter of exactly the hooks held, sized for twice as many (at
    /// least a kilobyte, unless the budget is smaller).
    fn rebuild_filter(&mut self) {
        self.filter_hooks = (2 * self.map.len()).max(least_filter_hooks(self.max_hooks));
        self.filter = filter_for(self.filter_hooks);
        for p in self.map.keys() {
            self.filter.insert(p);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The bytes the table has allocated for its slots, and its filter:
    /// the index's RAM.
    pub fn ram_bytes(&self) -> u64 {
        table_bytes(self.map.capacity()) + (self.filter_hooks * FILTER_BITS_PER_HOOK / 8) as u64
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn rate(&self) -> SamplingRate {
        self.rate
    }

    pub fn max_hooks(&self) -> usize {
        self.max_hooks
    }

    pub fn fingerprints(&self) -> u64 {
        self.fingerprints
    }

    /// More than the budget holds: only possible when the pinned hooks
    /// alone exceed it (the paper's capacity limit C ≤ M·K·2^10/E).
    pub fn over_budget(&self) -> bool {
        self.map.len() > self.max_hooks
    }

    /// Every hook, by fingerprint prefix.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Hook)> + '_ {
        self.map.iter().map(|(&k, &v)| (k, hook(v)))
    }

    /// Add the hooks of a sealed container, halving R first as often as
    /// the budget needs, so the table never grows past it (its slots are
    /// allocated by doubling: growing and then halving R would have held
    /// twice the budget for a moment).
    pub fn insert(&mut self, container: u64, fingerprints: &[Fingerprint]) {
        self.fingerprints += fingerprints.len() as u64;
        if container & PINNED != 0 {
            // An id no repository hands out (a foreign object's name):
            // no hooks, so its segments are stored again, never lost.
            return;
        }
        // A fingerprint that is already a hook stays with its first
        // container: the index is advice, either answer is right.
        let pin = fingerprints
            .iter()
            .map(Fingerprint::prefix_u64)
            .find(|p| !self.map.contains_key(p));
        loop {
            let adding = usize::from(pin.is_some())
                + fingerprints
                    .iter()
                    .map(Fingerprint::prefix_u64)
                    .filter(|&p| Some(p) != pin && self.rate.samples_prefix(p))
                    .filter(|p| !self.map.contains_key(p))
                    .count();
            if self.map.len() + adding <= self.max_hooks || !self.halve() {
                break;
            }
        }
        if let Some(p) = pin {
            self.put(p, container | PINNED);
        }
        for p in fingerprints.iter().map(Fingerprint::prefix_u64) {
            if self.rate.samples_prefix(p) && !self.map.contains_key(&p) {
                self.put(p, container);
            }
        }
    }

    /// Drop every hook into `containers` (deleted by garbage collection),
    /// so the fingerprints they held can hook a container that has them.
    pub fn forget(&mut self, containers: &std::collections::HashSet<u64>) {
        self.keep(|_, v| !containers.contains(&hook(v).container));
    }

    /// Container `container` was compacted and now holds only `present`
    /// (in catalog order): drop its hooks on the fingerprints it lost, and
    /// pin another of its fingerprints if its pinned hook went, so it keeps
    /// the one hook that seeds prefetch (and a checkpoint stays valid).
    pub fn compacted(&mut self, container: u64, present: &[Fingerprint]) {
        let keep: HashSet<u64> = present.iter().map(Fingerprint::prefix_u64).collect();
        let mut lost_pin = false;
        self.keep(|p, v| {
            let h = hook(v);
            let stays = h.container != container || keep.contains(&p);
            lost_pin |= !stays && h.pinned;
            stays
        });
        if !lost_pin {
            return;
        }
        // A fingerprint of this container that is a hook of no other.
        let pin = present.iter().map(Fingerprint::prefix_u64).find(|p| {
            self.map
                .get(p)
                .is_none_or(|&v| hook(v).container == container)
        });
        match pin {
            Some(p) => {
                self.put(p, container | PINNED);
            }
            // None left to pin: its unpinned hooks would be refused by a
            // checkpoint's loader, so they go too (prefetch then needs a
            // hook of another container; dedup, never data).
            None => self.keep(|_, v| hook(v).container != container),
        }
    }

    /// Restore a hook from a checkpoint (already checked by the caller);
    /// false if the prefix is a hook already.
    pub(super) fn restore(&mut self, prefix: u64, hook: Hook) -> bool {
        let value = hook.container | if hook.pinned { PINNED } else { 0 };
        self.put(prefix, value)
    }

    pub(crate) fn set_fingerprints(&mut self, fingerprints: u64) {
        self.fingerprints = fingerprints;
    }

    /// Sample no more densely than `rate`: drop the unpinned hooks it
    /// does not sample.
    pub(super) fn lower_to(&mut self, rate: SamplingRate) {
        if rate.log2_period() > self.rate.log2_period() {
            self.resample(rate);
        }
    }

    /// Progressive sampling: halve R and drop the hooks it no longer
    /// samples until the table fits, or only pinned hooks are left.
    pub(super) fn fit_budget(&mut self) {
        while self.map.len() > self.max_hooks && self.halve() {}
    }

    /// Halve R and drop the unpinned hooks it no longer samples; false
    /// (and nothing done) if only pinned hooks are left or R is at its
    /// floor. The slots given back are freed: they are the index's RAM.
    fn halve(&mut self) -> bool {
        if self.map.len() == self.pinned {
            return false;
        }
        let Some(rate) = self.rate.halved() else {
            return false;
        };
        self.resample(rate);
        true
    }

    /// Sample at `rate`, sparser than now: keep the pinned hooks and those
    /// `rate` samples, with a filter of just them.
    fn resample(&mut self, rate: SamplingRate) {
        self.rate = rate;
        self.keep(|p, v| v & PINNED != 0 || rate.samples_prefix(p));
        self.rebuild_filter();
    }

    /// Keep the hooks `f` keeps, in a table rebuilt to fit them. Not
    /// `retain`: hashbrown leaves a tombstone in every slot it empties,
    /// and a table full of them grows to twice its slots at the next
    /// inserts even with fewer hooks than before (measured: 785,574 hooks
    /// in 35.6 MiB of slots, over a 32 MiB budget). The kept entries are
    /// gathered (16 bytes each) before the old table is freed.
    fn keep(&mut self, mut f: impl FnMut(u64, u64) -> bool) {
        let kept: Vec<(u64, u64)> = self
            .map
            .iter()
            .map(|(&p, &v)| (p, v))
            .filter(|&(p, v)| f(p, v))
            .collect();
        self.pinned = kept.iter().filter(|(_, v)| v & PINNED != 0).count();
        self.map = Map::default();
        self.map.reserve(kept.len());
        self.map.extend(kept);
    }
}

fn hook(value: u64) -> Hook {
    Hook {
        container: value & !PINNED,
        pinned: value & PINNED != 0,
    }
}
