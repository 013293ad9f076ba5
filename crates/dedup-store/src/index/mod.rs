//! The store's fingerprint index, after Guo & Efstathopoulos §3.2
//! ("Progressive Sampled Indexing"): a sampled table of *hooks*
//! (fingerprint → container) held in RAM within a memory budget, and a
//! fingerprint cache filled by prefetching the whole catalog of a container
//! whose hook was hit, so the rest of a backup stream that repeats that
//! container's segments in order hits the cache (locality, §3.2.1).
//!
//! Every answer is advice: the caller confirms it against the container.
//! Nothing depends on the index being complete or right; a miss only
//! stores a duplicate. That is what lets it be sampled, and lets it be
//! rebuilt from the catalogs or reloaded from a checkpoint at will.

pub mod cache;
pub mod checkpoint;
pub mod checkpoint_objects;
pub mod figures;
pub mod hooks;
pub mod projection;
pub mod rebuild;
pub mod sampled;
pub mod sampling;
pub mod seam;

use dedup_common::fingerprint::Fingerprint;

use crate::error::Result;
use crate::format::Entry;

pub use cache::{Eviction, FingerprintCache};
pub use figures::{Counters, Figures};
pub use hooks::{Hook, HookTable, HOOK_BYTES, HOOK_SLOT_BYTES};
pub use sampled::SampledSegmentIndex;
pub use sampling::SamplingRate;

/// M's default: 818,400 hooks, every fingerprint of the first 3.1 GiB
/// stored in 4 KiB segments; R = 1/512 at 1 TiB, where the table holds
/// 524,288 hooks in 17 MiB of slots, and less per TiB beyond (restic 0.14
/// holds about 300 MiB per TiB of its 1 MiB chunks, and grows with the
/// store).
pub const DEFAULT_INDEX_MEMORY: u64 = 32 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexConfig {
    /// M: bytes of RAM for hooks, held to M/E hooks ([`HOOK_BYTES`]).
    pub index_memory: u64,
    /// Fingerprint cache size in entries; 0 turns prefetch off.
    pub cache_entries: usize,
    pub eviction: Eviction,
    /// S: expected bytes per segment, for the per-TiB figure only.
    pub segment_bytes: u64,
    /// The highest R to use, whatever the budget allows: 1 lets Eq. 1
    /// decide alone; 1/16 or 1/128 sample that sparsely from the start
    /// (Guo's Table 4 compares dedup at fixed rates).
    pub max_rate: SamplingRate,
}

impl Default for IndexConfig {
    /// [`DEFAULT_INDEX_MEMORY`] of hooks, a 1 Mi-entry cache, immediate
    /// eviction (the paper's default), 4 KiB segments.
    fn default() -> IndexConfig {
        IndexConfig {
            index_memory: DEFAULT_INDEX_MEMORY,
            cache_entries: 1 << 20,
            eviction: Eviction::Immediate,
            segment_bytes: 4 << 10,
            max_rate: SamplingRate::FULL,
        }
    }
}

impl IndexConfig {
    /// How many hooks the budget holds: M/E.
    pub fn max_hooks(&self) -> usize {
        (self.index_memory / HOOK_BYTES) as usize
    }
}

/// Where the index thinks a fingerprint is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advice {
    pub container: u64,
    /// The catalog entry's index, when the cache holds it.
    pub entry: Option<u32>,
}

pub struct Index {
    config: IndexConfig,
    hooks: HookTable,
    cache: FingerprintCache,
    counters: Counters,
}

impl Index {
    pub fn new(config: IndexConfig) -> Index {
        Index::with_hooks(
            config,
            HookTable::with_rate(config.max_hooks(), config.max_rate),
        )
    }

    fn with_hooks(config: IndexConfig, hooks: HookTable) -> Index {
        Index {
            config,
            hooks,
            cache: FingerprintCache::new(config.cache_entries, config.eviction),
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &IndexConfig {
        &self.config
    }

    pub fn rate(&self) -> SamplingRate {
        self.hooks.rate()
    }

    pub fn hooks(&self) -> &HookTable {
        &self.hooks
    }

    pub fn cache(&self) -> &FingerprintCache {
        &self.cache
    }

    /// Add a sealed container's fingerprints, in catalog order.
    pub fn insert(&mut self, container: u64, fingerprints: &[Fingerprint]) {
        self.hooks.insert(container, fingerprints);
    }

    /// Garbage collection deleted `containers`: forget their hooks and
    /// cached entries.
    pub fn forget(&mut self, containers: &std::collections::HashSet<u64>) {
        self.hooks.forget(containers);
        for c in containers {
            self.cache.evict(*c);
        }
    }

    /// Garbage collection removed `n` stored fingerprints: the count of
    /// fingerprints stored (C/S, reported and checkpointed) goes down.
    pub fn forget_fingerprints(&mut self, n: u64) {
        let left = self.hooks.fingerprints().saturating_sub(n);
        self.hooks.set_fingerprints(left);
    }

    /// Garbage collection compacted `container`, which now holds `present`:
    /// forget hooks on what it lost, and its cached entries (reloaded on
    /// the next hook hit).
    pub fn compacted(&mut self, container: u64, present: &[Fingerprint]) {
        self.hooks.compacted(container, present);
        self.cache.evict(container);
    }

    /// Look `fp` up: the cache first, then the hooks; a hook hit on a
    /// container the cache does not hold loads its catalog through `load`
    /// (for a store: [`rebuild::catalog_loader`]). Errors are the loader's.
    pub fn lookup<L>(&mut self, fp: &Fingerprint, load: L) -> Result<Option<Advice>>
    where
        L: FnOnce(u64) -> Result<Vec<Entry>>,
    {
        self.counters.lookups += 1;
        if let Some(c) = self.cache.get(fp) {
            self.counters.cache_hits += 1;
            return Ok(Some(Advice {
                container: c.container,
                entry: Some(c.entry),
            }));
        }
        let Some(hook) = self.hooks.get(fp) else {
            self.counters.misses += 1;
            return Ok(None);
        };
        self.counters.hook_hits += 1;
        if self.cache.capacity() > 0 && !self.cache.is_loaded(hook.container) {
            let entries = load(hook.container)?;
            self.counters.prefetches += 1;
            self.cache.load(hook.container, &entries);
        }
        let entry = self
            .cache
            .get(fp)
            .filter(|c| c.container == hook.container)
            .map(|c| c.entry);
        Ok(Some(Advice {
            container: hook.container,
            entry,
        }))
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    pub fn figures(&self) -> Figures {
        let fingerprints = self.hooks.fingerprints();
        Figures {
            rate: self.rate().as_f64(),
            hooks: self.hooks.len(),
            hook_bytes: self.hooks.ram_bytes(),
            index_memory: self.config.index_memory,
            cache_entries: self.cache.len(),
            cache_capacity: self.cache.capacity(),
            cache_bytes: self.cache.ram_bytes() as u64,
            fingerprints,
            stored_bytes: fingerprints * self.config.segment_bytes,
            counters: self.counters,
        }
    }
}
