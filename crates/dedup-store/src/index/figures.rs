//! What the index reports about itself: its memory, its rate, and how its
//! lookups went, for issue 17's report.

/// Lookup counters since the index was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub lookups: u64,
    pub cache_hits: u64,
    pub hook_hits: u64,
    pub misses: u64,
    /// Catalogs loaded into the cache.
    pub prefetches: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// R, the current sampling rate.
    pub rate: f64,
    pub hooks: usize,
    /// The hook table's slots and its Bloom filter: what the budget is
    /// held against.
    pub hook_bytes: u64,
    pub index_memory: u64,
    pub cache_entries: usize,
    pub cache_capacity: usize,
    pub cache_bytes: u64,
    /// Fingerprints inserted: the stored segments.
    pub fingerprints: u64,
    /// Stored bytes, estimated as fingerprints × the configured segment size.
    pub stored_bytes: u64,
    pub counters: Counters,
}

impl Figures {
    /// Hook RAM per TiB stored (the paper's "25 GB for 500 TB" figure),
    /// or `None` before anything is stored.
    pub fn hook_bytes_per_tib(&self) -> Option<f64> {
        (self.stored_bytes > 0)
            .then(|| self.hook_bytes as f64 * (1u64 << 40) as f64 / self.stored_bytes as f64)
    }

    /// Fraction of lookups the index answered (cache or hook).
    pub fn hit_fraction(&self) -> f64 {
        let c = &self.counters;
        (c.cache_hits + c.hook_hits) as f64 / c.lookups.max(1) as f64
    }
}
