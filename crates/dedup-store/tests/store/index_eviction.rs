//! The cache's eviction policies (§3.2.3), each on its defining behaviour,
//! with fingerprints placed in chosen buckets of a tiny cache (4 buckets of
//! 2 slots).

use crate::index_support;

use dedup_common::fingerprint::Fingerprint;
use dedup_store::index::{Eviction, FingerprintCache, Index, IndexConfig};
use dedup_store::Entry;

const BUCKETS: usize = 4;
const SLOTS: usize = 2;

/// Fingerprint number `n`, landing in `bucket`.
fn fp(n: u64, bucket: usize) -> Fingerprint {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..16].copy_from_slice(&(n * BUCKETS as u64 + bucket as u64).to_le_bytes());
    Fingerprint(b)
}

fn entries(fps: &[Fingerprint]) -> Vec<Entry> {
    index_support::catalog(fps, 100)
}

fn cache(policy: Eviction) -> FingerprintCache {
    let c = FingerprintCache::with_buckets(BUCKETS, SLOTS, policy);
    for (n, b) in [(1, 0), (2, 1), (3, 2)] {
        assert_eq!(c.bucket_of(&fp(n, b)), b);
    }
    c
}

const A: u64 = 0xA;
const B: u64 = 0xB;
const C: u64 = 0xC;
const D: u64 = 0xD;

#[test]
fn immediate_empties_the_bucket_and_evicts_all_its_containers_lazily() {
    let mut c = cache(Eviction::Immediate);
    let (a0, a1, b0, b1, c0) = (fp(1, 0), fp(2, 1), fp(3, 0), fp(4, 2), fp(5, 0));
    c.load(A, &entries(&[a0, a1]));
    c.load(B, &entries(&[b0, b1]));
    assert_eq!(c.len(), 4);
    // Bucket 0 holds a0 and b0: c0 colliding there empties it.
    c.load(C, &entries(&[c0]));
    assert!(!c.is_loaded(A) && !c.is_loaded(B), "both count as evicted");
    assert!(c.is_loaded(C));
    assert_eq!((c.get(&a0), c.get(&b0)), (None, None));
    // Lazy: their entries in other buckets still hit.
    assert_eq!(c.get(&a1).map(|e| (e.container, e.entry)), Some((A, 1)));
    assert_eq!(c.get(&b1).map(|e| (e.container, e.entry)), Some((B, 1)));
    assert_eq!(c.len(), 3);
}

#[test]
fn threshold_evicts_a_container_only_once_enough_entries_are_gone() {
    let mut c = cache(Eviction::Threshold(50));
    let a = [fp(1, 0), fp(2, 1), fp(3, 2), fp(4, 3)];
    let b = [fp(5, 0), fp(6, 1)];
    c.load(A, &entries(&a));
    c.load(B, &entries(&b));
    // Bucket 0 emptied: A loses 1 of 4 (25%), B 1 of 2 (50%).
    c.load(C, &entries(&[fp(7, 0)]));
    assert!(c.is_loaded(A), "25% removed is under the threshold");
    assert!(!c.is_loaded(B), "50% removed reaches it");
    // The policy's cost: A still counts as loaded, so a hook hit on it
    // would not prefetch again, and its lost entry misses.
    assert_eq!(c.get(&a[0]), None);
    // Bucket 1 emptied: A has now lost 2 of 4.
    c.load(D, &entries(&[fp(8, 1)]));
    assert!(!c.is_loaded(A));
    assert_eq!(c.get(&a[2]).map(|e| e.container), Some(A));
}

#[test]
fn container_lru_evicts_the_least_recently_prefetched_container_whole() {
    let mut c = cache(Eviction::ContainerLru);
    let (a0, a1, b0, b1) = (fp(1, 0), fp(2, 1), fp(3, 0), fp(4, 2));
    c.load(A, &entries(&[a0, a1]));
    c.load(B, &entries(&[b0, b1]));
    let c0 = fp(5, 0);
    c.load(C, &entries(&[c0]));
    // A, the oldest, goes whole (a1 too, from another bucket); B stays.
    assert!(!c.is_loaded(A));
    assert_eq!((c.get(&a0), c.get(&a1)), (None, None));
    assert!(c.is_loaded(B) && c.get(&b0).is_some() && c.get(&b1).is_some());
    assert!(c.get(&c0).is_some());
    // Next collision in bucket 0: B is now the oldest, not C.
    c.load(D, &entries(&[fp(6, 0)]));
    assert!(!c.is_loaded(B) && c.get(&b1).is_none());
    assert!(c.is_loaded(C) && c.get(&c0).is_some());
    assert_eq!(c.len(), 2);
}

#[test]
fn a_hook_hit_prefetches_the_catalog_once_for_the_run() {
    let config = IndexConfig {
        cache_entries: 16 * 4,
        ..IndexConfig::default()
    };
    let mut index = Index::new(config);
    let fps: Vec<_> = (0..8).map(|n| fp(n, n as usize % BUCKETS)).collect();
    index.insert(A, &fps);
    let mut loads = 0;
    for (n, f) in fps.iter().enumerate() {
        let advice = index
            .lookup(f, |id| {
                loads += 1;
                assert_eq!(id, A);
                Ok(entries(&fps))
            })
            .unwrap()
            .unwrap();
        assert_eq!(advice.container, A);
        let i = advice
            .entry
            .expect("the prefetched catalog gives the entry");
        assert_eq!(i as usize, n);
    }
    assert_eq!(loads, 1, "one catalog load serves the container's run");
    let c = index.counters();
    assert_eq!((c.hook_hits, c.cache_hits, c.prefetches), (1, 7, 1));
    assert_eq!(index.figures().cache_entries, 8);
}

#[test]
fn a_hook_hit_on_an_evicted_container_prefetches_again() {
    // One bucket of 16 slots: loading a second 16-entry catalog empties it.
    let config = IndexConfig {
        cache_entries: 16,
        ..IndexConfig::default()
    };
    let mut index = Index::new(config);
    let a: Vec<_> = (0..16).map(|n| fp(n, 0)).collect();
    let b: Vec<_> = (100..116).map(|n| fp(n, 0)).collect();
    index.insert(A, &a);
    index.insert(B, &b);
    let catalog = |id: u64| Ok(entries(if id == A { &a } else { &b }));
    for f in [a[0], a[1], b[0], a[2]] {
        index.lookup(&f, catalog).unwrap().unwrap();
    }
    // a[0] prefetched A, a[1] hit the cache, b[0] prefetched B and emptied
    // the bucket (A evicted), a[2] is a hook hit that prefetches A again.
    let c = index.counters();
    assert_eq!((c.prefetches, c.cache_hits, c.hook_hits), (3, 1, 3));
}

#[test]
fn a_cache_takes_slots_only_in_the_buckets_that_hold_entries() {
    // The default's million entries, empty: no slots at all.
    let mut c = FingerprintCache::new(1 << 20, Eviction::Immediate);
    assert_eq!(c.held_bytes(), 0);
    // A catalog of 3 entries in 3 buckets: those 3 buckets' slots.
    let fps: Vec<_> = (1..=3).map(|n| fp(n, n as usize)).collect();
    c.load(A, &entries(&fps));
    let bucket = c.ram_bytes() / (c.capacity() / dedup_store::index::cache::BUCKET_SLOTS);
    assert!(
        c.held_bytes() <= 3 * bucket,
        "{} bytes held",
        c.held_bytes()
    );
    assert!(fps.iter().all(|f| c.get(f).is_some()));
}
