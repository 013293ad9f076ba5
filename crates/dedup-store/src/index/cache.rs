//! The fingerprint cache that catalog prefetch fills (§3.2.1), shaped like
//! the paper's cache *dhash* (§3.2.3): a fixed number of buckets of fixed
//! size, no growth, and an eviction policy run when a bucket Q is full.
//!
//! The cache also remembers which containers count as *loaded*: a hook hit
//! on a loaded container does not prefetch its catalog again. The policies
//! differ in when a container stops counting as loaded:
//! - `Immediate`: empty Q; every container with an entry in Q is evicted at
//!   once, while its entries in other buckets stay and still hit (lazy).
//! - `Threshold(p)`: empty Q; a container is evicted only once `p` percent
//!   of its entries have been removed, so until then a hook hit does not
//!   refill the entries it lost.
//! - `ContainerLru`: remove every entry of the least recently prefetched
//!   container, from all buckets, and repeat until Q has room.
//!
//! A bucket takes its slots when its first entry comes, so the cache's RAM
//! follows what was prefetched, up to its capacity (24 bytes a slot): a
//! backup that finds its files unchanged and looks nothing up holds none
//! of it. Allocated whole up front, the default's 24 MiB were a fifth of
//! the peak of such a backup of `/usr/share` and `/usr/lib`.

use std::collections::HashMap;

use dedup_common::fingerprint::Fingerprint;

use crate::format::Entry;

/// Entries per bucket, as the paper's 1 KB buckets hold a few dozen.
pub const BUCKET_SLOTS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    Immediate,
    /// Percent (1..=100) of a container's entries removed before it counts
    /// as evicted.
    Threshold(u8),
    ContainerLru,
}

/// One cached catalog entry: where a fingerprint is, keyed (as a hook is)
/// by the fingerprint's 64-bit prefix, 24 bytes where the whole entry
/// took 88. The answer is a hint the catalog confirms by the whole
/// fingerprint, so a prefix shared by two fingerprints costs a duplicate
/// stored, never a wrong segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    pub prefix: u64,
    pub container: u64,
    /// The entry's index in its container's catalog.
    pub entry: u32,
}

struct Loaded {
    entries: u32,
    removed: u32,
    /// Prefetch order, for `ContainerLru`.
    seq: u64,
}

pub struct FingerprintCache {
    buckets: Vec<Vec<Cached>>,
    slots: usize,
    policy: Eviction,
    loaded: HashMap<u64, Loaded>,
    seq: u64,
    len: usize,
}

impl FingerprintCache {
    /// A cache of about `capacity` entries (rounded down to whole buckets);
    /// 0 turns prefetch off.
    pub fn new(capacity: usize, policy: Eviction) -> FingerprintCache {
        FingerprintCache::with_buckets(capacity / BUCKET_SLOTS, BUCKET_SLOTS, policy)
    }

    pub fn with_buckets(buckets: usize, slots: usize, policy: Eviction) -> FingerprintCache {
        let slots = if buckets == 0 { 0 } else { slots };
        FingerprintCache {
            buckets: (0..buckets).map(|_| Vec::new()).collect(),
            slots,
            policy,
            loaded: HashMap::new(),
            seq: 0,
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.buckets.len() * self.slots
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn policy(&self) -> Eviction {
        self.policy
    }

    /// Which bucket `fp` goes to. Bytes 8..16, not the prefix the sampling
    /// uses, so that hooks do not crowd into a few buckets.
    pub fn bucket_of(&self, fp: &Fingerprint) -> usize {
        let mut b = [0u8; 8];
        b.copy_from_slice(&fp.0[8..16]);
        (u64::from_le_bytes(b) % self.buckets.len().max(1) as u64) as usize
    }

    pub fn get(&self, fp: &Fingerprint) -> Option<Cached> {
        if self.buckets.is_empty() {
            return None;
        }
        let prefix = fp.prefix_u64();
        let q = &self.buckets[self.bucket_of(fp)];
        q.iter().find(|c| c.prefix == prefix).copied()
    }

    /// Whether a hook hit on `container` can skip the prefetch.
    pub fn is_loaded(&self, container: u64) -> bool {
        self.loaded.contains_key(&container)
    }

    /// Put a prefetched catalog in the cache.
    pub fn load(&mut self, container: u64, entries: &[Entry]) {
        if self.buckets.is_empty() {
            return;
        }
        self.seq += 1;
        // A segment removed by compaction is no answer (see
        // `Entry::is_absent`); entry numbers stay those of the catalog.
        let present = entries.iter().filter(|e| !e.is_absent()).count();
        let loaded = Loaded {
            entries: present as u32,
            removed: 0,
            seq: self.seq,
        };
        self.loaded.insert(container, loaded);
        for (i, e) in entries.iter().enumerate().filter(|(_, e)| !e.is_absent()) {
            let q = self.bucket_of(&e.fingerprint);
            self.put(
                q,
                Cached {
                    prefix: e.fingerprint.prefix_u64(),
                    container,
                    entry: i as u32,
                },
            );
        }
    }

    fn put(&mut self, q: usize, entry: Cached) {
        if self.buckets[q].iter().any(|c| c.prefix == entry.prefix) {
            return;
        }
        if self.buckets[q].len() >= self.slots && !self.make_room(q, entry.container) {
            return;
        }
        // Exactly its slots, on its first entry (see the module doc).
        self.buckets[q].reserve_exact(self.slots);
        self.buckets[q].push(entry);
        self.len += 1;
    }

    /// Run the policy on full bucket `q`; false if it could not make room.
    fn make_room(&mut self, q: usize, loading: u64) -> bool {
        match self.policy {
            Eviction::Immediate => {
                for c in self.empty_bucket(q) {
                    self.loaded.remove(&c.container);
                }
            }
            Eviction::Threshold(percent) => {
                for c in self.empty_bucket(q) {
                    if let Some(l) = self.loaded.get_mut(&c.container) {
                        l.removed += 1;
                        if u64::from(l.removed) * 100 >= u64::from(percent) * u64::from(l.entries) {
                            self.loaded.remove(&c.container);
                        }
                    }
                }
            }
            Eviction::ContainerLru => {
                while self.buckets[q].len() >= self.slots {
                    // The container being loaded is the most recent: it is
                    // only a victim if it is alone, and then the new entry
                    // is dropped instead of its own siblings.
                    let victim = self
                        .loaded
                        .iter()
                        .filter(|(&c, _)| c != loading)
                        .min_by_key(|(_, l)| l.seq)
                        .map(|(&c, _)| c);
                    match victim {
                        Some(c) => self.evict_container(c),
                        None => return false,
                    }
                }
            }
        }
        true
    }

    fn empty_bucket(&mut self, q: usize) -> Vec<Cached> {
        let removed = std::mem::take(&mut self.buckets[q]);
        self.len -= removed.len();
        removed
    }

    /// Remove every entry of `container` (scans the whole cache: the
    /// overhead the paper names for this policy).
    /// Drop container `container`'s entries, if loaded (it was deleted or
    /// compacted).
    pub fn evict(&mut self, container: u64) {
        if self.loaded.contains_key(&container) {
            self.evict_container(container);
        }
    }

    fn evict_container(&mut self, container: u64) {
        self.loaded.remove(&container);
        for q in &mut self.buckets {
            let before = q.len();
            q.retain(|c| c.container != container);
            self.len -= before - q.len();
        }
    }

    /// Bytes the cache's slots take when full.
    pub fn ram_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<Cached>()
    }

    /// Bytes the slots take now: those of the buckets that hold entries.
    pub fn held_bytes(&self) -> usize {
        let slots: usize = self.buckets.iter().map(Vec::capacity).sum();
        slots * std::mem::size_of::<Cached>()
    }
}
