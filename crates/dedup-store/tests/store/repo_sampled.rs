//! The repository with the sampled index of §3.2 ([`SampledSegmentIndex`]):
//! restores stay byte-exact at tiny memory budgets (R ≤ 1/64), dedup stays
//! high with catalog prefetch at R = 1, 1/16 and 1/128 on a workload of
//! versions of one stream, and hints it gets wrong never reach a recipe.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dedup_common::fingerprint::Fingerprint;
use dedup_store::index::{IndexConfig, SamplingRate, HOOK_BYTES};
use dedup_store::{
    Entry, Eviction, Index, LocalDir, ObjectStore, RepoOptions, Repository, SampledSegmentIndex,
    SegmentIndex, Segmenting,
};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

const BLOCK: usize = 4096;
/// 16 MiB versions in 4 MiB containers: 4096 segments, T_min = 1024.
const BLOCKS: usize = 4096;
const CONTAINER: u64 = 4 << 20;

fn options(segmenting: Segmenting) -> RepoOptions {
    RepoOptions {
        segmenting,
        container_target: CONTAINER,
        force: false,
        ..RepoOptions::default()
    }
}

fn block(id: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    StdRng::seed_from_u64(id).fill_bytes(&mut b);
    b
}

/// Versions of a stream of 4 KiB blocks, each block named by the seed it
/// is generated from; each version rewrites `changed` of the blocks in
/// place (fresh seeds), the rest staying in order.
struct Versions {
    rng: StdRng,
    blocks: Vec<u64>,
    next_id: u64,
    changed: f64,
    started: bool,
}

impl Versions {
    fn new(seed: u64, changed: f64) -> Versions {
        Versions {
            rng: StdRng::seed_from_u64(seed),
            blocks: (0..BLOCKS as u64).collect(),
            next_id: BLOCKS as u64,
            changed,
            started: false,
        }
    }

    /// The next version's block ids (the first call gives version 1).
    fn next(&mut self) -> Vec<u64> {
        if self.started {
            for b in self.blocks.iter_mut() {
                if self.rng.random_bool(self.changed) {
                    *b = self.next_id;
                    self.next_id += 1;
                }
            }
        }
        self.started = true;
        self.blocks.clone()
    }
}

fn bytes(ids: &[u64]) -> Vec<u8> {
    ids.iter().flat_map(|&id| block(id)).collect()
}

fn tiny(period: u64, cache_entries: usize, eviction: Eviction) -> IndexConfig {
    IndexConfig {
        index_memory: (BLOCKS as u64 / period) * HOOK_BYTES,
        cache_entries,
        eviction,
        ..IndexConfig::default()
    }
}

fn restore(repo: &mut Repository, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    repo.restore(name, &mut out).unwrap();
    out
}

/// Backups of versions of a stream with a reopen before each, under
/// `config`; every backup restores byte-exact right after it is made and
/// again after a final reopen. Returns the index's rate at the end.
fn restores_exact(segmenting: Segmenting, config: IndexConfig, versions: usize) -> SamplingRate {
    let tmp = tempfile::tempdir().unwrap();
    Repository::init_with(tmp.path(), options(segmenting)).unwrap();
    let mut v = Versions::new(11, 0.03);
    let mut rng = StdRng::seed_from_u64(12);
    let mut streams = Vec::new();
    for n in 0..versions {
        let mut data = bytes(&v.next());
        if n > 0 && matches!(segmenting, Segmenting::FastCdc { .. }) {
            // Shift the rest of the stream too, which only CDC survives.
            let at = rng.random_range(0..data.len());
            let insert: Vec<u8> = (0..rng.random_range(1..5000))
                .map(|_| rng.random())
                .collect();
            data.splice(at..at, insert);
        }
        let mut repo = Repository::open_sampled(tmp.path(), config).unwrap();
        let name = format!("v{n}");
        let report = repo.backup_stream(&name, "g", &data[..]).unwrap();
        if n > 0 {
            assert!(report.segments_duplicate > 0, "{name}: {report:?}");
        }
        assert_eq!(restore(&mut repo, &name), data, "{name} right after");
        streams.push(data);
    }
    let mut repo = Repository::open_sampled(tmp.path(), config).unwrap();
    for (n, data) in streams.iter().enumerate() {
        assert_eq!(&restore(&mut repo, &format!("v{n}")), data, "v{n} reopened");
    }
    let store = LocalDir::open(tmp.path()).unwrap();
    Index::rebuild(&store, config).unwrap().rate()
}

#[test]
fn every_backup_restores_exact_at_tiny_budgets() {
    let low = SamplingRate::from_log2_period(6).unwrap(); // 1/64
    for (segmenting, config) in [
        (Segmenting::DEFAULT, tiny(128, 1 << 12, Eviction::Immediate)),
        // A cache smaller than one catalog: entries are evicted while
        // their container is still being matched.
        (Segmenting::DEFAULT, tiny(256, 256, Eviction::ContainerLru)),
        // No cache at all: hooks alone, each resolved in its catalog.
        (Segmenting::DEFAULT, tiny(128, 0, Eviction::Immediate)),
        (
            Segmenting::FASTCDC_4K,
            tiny(128, 1 << 12, Eviction::Threshold(50)),
        ),
    ] {
        let rate = restores_exact(segmenting, config, 5);
        assert!(
            rate.period() >= low.period(),
            "{segmenting:?} {config:?}: R = 1/{}",
            rate.period()
        );
    }
}

/// The fraction of the duplicate segments of versions 2.. that the
/// repository found, at sampling period `period` (1 = every fingerprint a
/// hook), and the rates the index had after the first backup and at the
/// end.
fn efficiency(period: u64, cache_entries: usize) -> (f64, SamplingRate, SamplingRate) {
    let versions = 6;
    let changed = 0.03;
    // Budget for the fingerprints stored at the end (new blocks of every
    // version included), so R is `period` from the first backup on.
    let stored = BLOCKS as f64 * (1.0 + changed * 1.5 * (versions - 1) as f64);
    let config = IndexConfig {
        index_memory: if period == 1 {
            1 << 30
        } else {
            {
                // Midway between what R = 1/period needs at the end (a pinned
                // hook per container included) and what R = 2/period needs
                // after the first backup.
                let need = stored / period as f64 + 10.0;
                let double = (2 * BLOCKS) as f64 / period as f64;
                ((need + double) / 2.0) as u64 * HOOK_BYTES
            }
        },
        cache_entries,
        ..IndexConfig::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    Repository::init_with(tmp.path(), options(Segmenting::DEFAULT)).unwrap();
    let mut v = Versions::new(21, changed);
    let mut seen = HashSet::new();
    let (mut duplicates, mut found) = (0u64, 0u64);
    let mut first_rate = None;
    for n in 0..versions {
        let ids = v.next();
        let repo = Repository::open_sampled(tmp.path(), config).unwrap();
        let report = repo
            .backup_stream(&format!("v{n}"), "g", &bytes(&ids)[..])
            .unwrap();
        let dups = ids.iter().filter(|id| !seen.insert(**id)).count() as u64;
        assert!(report.segments_duplicate <= dups, "v{n}: {report:?}");
        if n > 0 {
            duplicates += dups;
            found += report.segments_duplicate;
        } else {
            let store = LocalDir::open(tmp.path()).unwrap();
            first_rate = Some(Index::rebuild(&store, config).unwrap().rate());
        }
    }
    let store = LocalDir::open(tmp.path()).unwrap();
    let rate = Index::rebuild(&store, config).unwrap().rate();
    (found as f64 / duplicates as f64, first_rate.unwrap(), rate)
}

#[test]
fn dedup_efficiency_with_prefetch_at_r_1_16_128() {
    // (period, cache entries, at least this fraction of duplicates found).
    // Eq. 2 bounds the loss at (T - 1)/T_min per catalog load: 1.5% at
    // 1/16 and 12.4% at 1/128 with 1024-entry containers.
    let runs = [
        (1, 1 << 14, 0.999),
        (16, 1 << 14, 0.95),
        (128, 1 << 14, 0.87),
        // A cache of two catalogs: evictions within a version, and a
        // catalog prefetched again loses up to T - 1 more each time.
        (16, 2048, 0.93),
        (128, 2048, 0.85),
    ];
    let mut with_prefetch_16 = 0.0;
    for (period, cache, floor) in runs {
        let (f, first, last) = efficiency(period, cache);
        eprintln!(
            "R = 1/{period}, cache {cache}: found {:.2}% of duplicates",
            f * 100.0
        );
        assert_eq!((first.period(), last.period()), (period, period));
        assert!(f >= floor, "R = 1/{period}, cache {cache}: {f}");
        if period == 16 && cache == 1 << 14 {
            with_prefetch_16 = f;
        }
    }
    // Without prefetch only hooks find duplicates: about R of them, plus
    // each container's pinned first hook. The stored duplicates then push
    // R lower still.
    let (f, first, last) = efficiency(16, 0);
    eprintln!(
        "R = 1/{} (1/{} at the end), no cache: found {:.2}% of duplicates",
        first.period(),
        last.period(),
        f * 100.0
    );
    assert_eq!(first.period(), 16);
    assert!(f < 0.2 && f < with_prefetch_16, "without prefetch: {f}");
}

/// A [`SampledSegmentIndex`] whose prefetches read another repository's catalogs:
/// its hooks name this repository's containers, but the entries it
/// resolves are where the other repository keeps the segment, or are
/// fingerprints this repository's container does not hold. Counts its
/// hints and those that disagree with the real catalogs.
struct Misled {
    inner: SampledSegmentIndex,
    truth: HashMap<u64, Vec<Entry>>,
    hints: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
}

impl SegmentIndex for Misled {
    fn lookup(&mut self, fp: &Fingerprint) -> Option<(u64, u32)> {
        let hint = self.inner.lookup(fp)?;
        self.hints.fetch_add(1, Ordering::Relaxed);
        let right = self
            .truth
            .get(&hint.0)
            .and_then(|c| c.get(hint.1 as usize))
            .is_some_and(|e| e.fingerprint == *fp);
        if !right {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        Some(hint)
    }

    fn insert(&mut self, container: u64, entries: &[Entry]) {
        self.truth.insert(container, entries.to_vec());
        self.inner.insert(container, entries);
    }
}

#[test]
fn wrong_hints_from_the_sampled_index_never_corrupt_a_restore() {
    let mut v = Versions::new(31, 0.05);
    let versions: Vec<Vec<u64>> = (0..3).map(|_| v.next()).collect();
    // The other repository holds the same blocks in another order, so its
    // containers with the same ids hold other segments, or the same ones
    // at other entries.
    let other = tempfile::tempdir().unwrap();
    let o = Repository::init_with(other.path(), options(Segmenting::DEFAULT)).unwrap();
    let mut shuffled = versions[0].clone();
    shuffled.reverse();
    shuffled.swap(0, 7);
    o.backup_stream("o", "g", &bytes(&shuffled)[..]).unwrap();
    let other_store: Arc<dyn ObjectStore> = Arc::new(LocalDir::open(other.path()).unwrap());

    let tmp = tempfile::tempdir().unwrap();
    Repository::init_with(tmp.path(), options(Segmenting::DEFAULT)).unwrap();
    let hints = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(AtomicU64::new(0));
    let mut streams = Vec::new();
    for (n, ids) in versions.iter().enumerate() {
        let misled = Misled {
            inner: SampledSegmentIndex::new(
                other_store.clone(),
                tiny(16, 1 << 12, Eviction::Immediate),
            ),
            truth: HashMap::new(),
            hints: hints.clone(),
            wrong: wrong.clone(),
        };
        let repo = Repository::open_with_index(tmp.path(), Box::new(misled)).unwrap();
        let data = bytes(ids);
        repo.backup_stream(&format!("v{n}"), "g", &data[..])
            .unwrap();
        streams.push(data);
    }
    let (hints, wrong) = (hints.load(Ordering::Relaxed), wrong.load(Ordering::Relaxed));
    eprintln!("{wrong} wrong of {hints} hints");
    assert!(wrong > 100, "{wrong} wrong of {hints} hints");
    let mut repo = Repository::open(tmp.path()).unwrap();
    for (n, data) in streams.iter().enumerate() {
        assert_eq!(&restore(&mut repo, &format!("v{n}")), data, "v{n}");
    }
}

/// A hook names a container, not an entry: when the container's catalog
/// does not hold the fingerprint, the index answers nothing, with the
/// cache on or off; when it does, the answer is the catalog's entry.
#[test]
fn a_hook_alone_is_resolved_in_the_catalog_or_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Repository::init_with(tmp.path(), options(Segmenting::DEFAULT)).unwrap();
    let data = bytes(&[1, 2, 3, 4]);
    repo.backup_stream("b", "g", &data[..]).unwrap();
    let real = dedup_store::Catalog::read(&*repo.object_store(), 0)
        .unwrap()
        .entries()
        .to_vec();
    assert_eq!(real.len(), 4);
    let stranger = dedup_store::writer::HASH.fingerprint(b"not stored");
    let mut claimed = real.clone();
    claimed[2].fingerprint = stranger;
    for cache in [0, 1 << 10] {
        let config = IndexConfig {
            cache_entries: cache,
            ..IndexConfig::default()
        };
        // The index believes container 0 holds `stranger` at entry 2.
        let mut index = SampledSegmentIndex::new(repo.object_store(), config);
        index.insert(0, &claimed);
        assert!(index.index().hooks().get(&stranger).is_some());
        assert_eq!(index.lookup(&stranger), None, "cache {cache}");
        for (i, e) in real.iter().enumerate() {
            if i != 2 {
                assert_eq!(index.lookup(&e.fingerprint), Some((0, i as u32)));
            }
        }
        // Entry 2's real fingerprint was never inserted: no hook, no answer.
        if cache == 0 {
            assert_eq!(index.lookup(&real[2].fingerprint), None);
            assert!(index.catalog_reads() > 0);
        }
    }
}
