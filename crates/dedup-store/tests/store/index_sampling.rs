//! The hook table: exact at R = 1, and progressive sampling (§3.2.2) that
//! halves R to stay within the memory budget, keeps a hook per container,
//! and drops exactly the hooks the new R no longer samples.

use std::collections::{HashMap, HashSet};

use dedup_common::fingerprint::{Fingerprint, HashAlgo};
use dedup_store::index::{HookTable, Index, IndexConfig, SamplingRate, HOOK_BYTES};

fn fp(n: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&n.to_le_bytes())
}

fn container(id: u64, len: u64) -> Vec<Fingerprint> {
    (0..len).map(|i| fp(id * len + i)).collect()
}

fn no_load(_: u64) -> dedup_store::Result<Vec<dedup_store::Entry>> {
    panic!("a hook hit with the cache off must not load a catalog")
}

#[test]
fn full_rate_finds_every_fingerprint() {
    let config = IndexConfig {
        index_memory: 64 * 1024 * HOOK_BYTES,
        cache_entries: 0,
        ..IndexConfig::default()
    };
    let mut index = Index::new(config);
    for id in 0..64 {
        index.insert(id, &container(id, 1024));
    }
    assert_eq!(index.rate(), SamplingRate::FULL);
    for id in 0..64 {
        for f in container(id, 1024) {
            let advice = index
                .lookup(&f, no_load)
                .unwrap()
                .expect("every fingerprint is a hook");
            assert_eq!(advice.container, id);
        }
    }
    assert_eq!(index.lookup(&fp(u64::MAX), no_load).unwrap(), None);
    let c = index.counters();
    assert_eq!((c.hook_hits, c.misses), (64 * 1024, 1));
}

/// The hooks, by fingerprint prefix.
fn hooks_of(table: &HookTable) -> HashMap<u64, (u64, bool)> {
    table
        .iter()
        .map(|(p, h)| (p, (h.container, h.pinned)))
        .collect()
}

#[test]
fn progressive_sampling_halves_within_budget_and_drops_exactly_the_unsampled() {
    let max_hooks = 3_000;
    let mut table = HookTable::new(max_hooks);
    let mut halvings = 0;
    for id in 0..200u64 {
        let before = hooks_of(&table);
        let rate_before = table.rate();
        let fps = container(id, 1024);
        table.insert(id, &fps);
        let after = hooks_of(&table);
        let rate = table.rate();

        assert!(
            table.len() <= max_hooks,
            "container {id}: {} hooks",
            table.len()
        );
        if rate != rate_before {
            halvings += rate.log2_period() - rate_before.log2_period();
        }
        // Of the hooks held before, those gone are exactly the unpinned
        // ones the new rate does not sample.
        let dropped: HashSet<_> = before.keys().filter(|f| !after.contains_key(*f)).collect();
        let unsampled: HashSet<_> = before
            .iter()
            .filter(|(p, (_, pinned))| !pinned && !rate.samples_prefix(**p))
            .map(|(f, _)| f)
            .collect();
        assert_eq!(dropped, unsampled, "container {id}");
        // The new container's hooks: one pinned, the rest sampled at R.
        let new: Vec<_> = after.iter().filter(|(_, (c, _))| *c == id).collect();
        assert_eq!(new.iter().filter(|(_, (_, p))| *p).count(), 1);
        assert!(new
            .iter()
            .all(|(prefix, (_, p))| *p || rate.samples_prefix(**prefix)));
        // Never past the budget, counted in the slots allocated.
        assert!(table.ram_bytes() <= max_hooks as u64 * HOOK_BYTES);
    }
    assert!(halvings >= 3, "R only halved {halvings} times");
    let containers: HashSet<u64> = table.iter().map(|(_, h)| h.container).collect();
    assert_eq!(containers.len(), 200, "every container keeps a hook");
    // Progressive sampling never holds more hooks than Eq. 1 allows.
    let eq1 = SamplingRate::for_budget(max_hooks as u64, 1, table.fingerprints());
    assert!(table.rate().period() >= eq1.period());
    assert!(!table.over_budget());
}

#[test]
fn pinned_hooks_are_kept_past_the_budget() {
    // A budget below one hook per container: the paper's capacity limit.
    let mut table = HookTable::new(50);
    for id in 0..100u64 {
        table.insert(id, &container(id, 256));
    }
    assert!(table.over_budget());
    assert_eq!(table.len(), 100);
    assert!(table.iter().all(|(_, h)| h.pinned));
}

#[test]
fn sampling_is_deterministic_and_nested() {
    let r = SamplingRate::from_log2_period(4).unwrap();
    let half = r.halved().unwrap();
    let mut sampled = 0;
    for n in 0..20_000 {
        let f = fp(n);
        assert_eq!(r.samples(&f), f.prefix_u64() % 16 == 0);
        if half.samples(&f) {
            assert!(r.samples(&f), "a hook at R/2 is a hook at R");
        }
        sampled += usize::from(r.samples(&f));
    }
    assert!(
        (1_100..1_400).contains(&sampled),
        "{sampled} of 20000 at 1/16"
    );
    assert_eq!(
        SamplingRate::for_budget(1 << 20, 1, 1 << 20),
        SamplingRate::FULL
    );
    assert_eq!(SamplingRate::for_budget(1 << 20, 1, 1 << 24).period(), 16);
    assert_eq!(SamplingRate::from_log2_period(64), None);
}

#[test]
fn the_filter_in_front_never_hides_a_hook_and_stops_most_misses() {
    let mut table = HookTable::new(20_000);
    let mut inserted = 0u64;
    for id in 0..120u64 {
        table.insert(id, &container(id, 1024));
        inserted += 1024;
        if id % 40 == 39 {
            // GC: a container deleted, another compacted to half.
            table.forget(&HashSet::from([id - 3]));
            let kept: Vec<_> = container(id - 5, 1024).into_iter().step_by(2).collect();
            table.compacted(id - 5, &kept);
        }
        let hooks: Vec<_> = table.iter().collect();
        for (prefix, h) in &hooks {
            // Every hook is found through the filter.
            let mut fp = [0u8; 32];
            fp[..8].copy_from_slice(&prefix.to_le_bytes());
            assert_eq!(table.get(&Fingerprint(fp)), Some(*h), "container {id}");
        }
    }
    assert!(table.rate().period() > 1, "R never halved");
    // Fingerprints never stored: the filter answers nearly all of them.
    let passed = (0..100_000u64)
        .map(|n| fp(inserted + 1_000_000 + n))
        .filter(|f| table.passes_filter(f))
        .count();
    assert!(
        passed < 5_000,
        "{passed} of 100000 absent fingerprints passed"
    );
    assert!(table.ram_bytes() <= 20_000 * HOOK_BYTES);
}

#[test]
fn a_table_mostly_of_pinned_hooks_stays_within_its_budget() {
    // Many containers: their pinned hooks fill most of the budget, so R
    // halves often and each halving empties many slots (hashbrown's
    // tombstones once grew such a table to twice its slots: 785,574 hooks
    // in 35.6 MiB over a 32 MiB budget). Fingerprints are cheap random
    // bytes here: only their prefixes matter to the table.
    // 25,000 hooks: 32,768 slots hold up to 28,672, so the budget comes
    // near a full table, as it did when the fault was seen.
    let max_hooks = 25_000;
    let mut table = HookTable::new(max_hooks);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut batch = Vec::with_capacity(1024);
    for id in 0..20_000u64 {
        batch.clear();
        for _ in 0..1024 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut f = [0u8; 32];
            f[..8].copy_from_slice(&x.to_le_bytes());
            batch.push(Fingerprint(f));
        }
        table.insert(id, &batch);
        assert!(
            table.ram_bytes() <= max_hooks as u64 * HOOK_BYTES,
            "container {id}: {} bytes for {} hooks",
            table.ram_bytes(),
            table.len()
        );
    }
    assert!(table.len() >= 20_000, "{} hooks", table.len());
}
