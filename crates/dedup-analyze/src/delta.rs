//! Delta compression of chunks that are not duplicates but resemble a
//! stored one ("Demystifying Data Deduplication" §2: delta encoding after
//! chunking). Resemblance is found by super-features: a Gear rolling hash
//! is sampled at content-defined positions (1 in 32), twelve linear
//! transforms of it keep their maximum over the chunk (the features), and
//! groups of four features hash into three super-features. Two chunks
//! sharing any super-feature very likely share most of their content
//! (Broder's resemblance; the content-defined sampling is from Odess).
//!
//! The delta-encoded size is measured, not guessed: the chunk is
//! compressed by zstd with the similar chunk as its dictionary (what
//! `zstd --patch-from` does). zstd also compresses the literals, so the
//! same chunks compressed by zstd alone are reported beside it: the gap
//! is what the similar chunk contributes.
//!
//! Bases must be kept to be diffed against: their bytes live in a store
//! bounded by `memory`; a match whose base was evicted is counted as
//! such, so the report says how much a larger budget would find.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zstd::zstd_safe::{CCtx, CParameter};

const FEATURES: usize = 12;
const PER_SUPER: usize = FEATURES / SUPER;
const SUPER: usize = 3;
/// Sample the rolling hash where its low bits are zero: 1 position in 32.
const SAMPLE_MASK: u64 = 31;
/// Chunks shorter than this are not worth a delta.
const MIN_CHUNK: usize = 256;
const ZSTD_LEVEL: i32 = 3;

/// What delta compression found for one algorithm.
#[derive(Clone, Debug, Default)]
pub struct DeltaCounts {
    /// Distinct chunks with a similar stored chunk, and their bytes.
    pub similar_chunks: u64,
    pub similar_bytes: u64,
    /// Those chunks delta-encoded against their base (never more than the
    /// chunk itself).
    pub delta_bytes: u64,
    /// The same chunks compressed by zstd alone, for comparison.
    pub alone_bytes: u64,
    /// Matches whose base had left the bounded store.
    pub base_evicted: u64,
    pub time: Duration,
}

impl DeltaCounts {
    pub fn merge(&mut self, o: &DeltaCounts) {
        self.similar_chunks += o.similar_chunks;
        self.similar_bytes += o.similar_bytes;
        self.delta_bytes += o.delta_bytes;
        self.alone_bytes += o.alone_bytes;
        self.base_evicted += o.base_evicted;
        self.time += o.time;
    }
}

struct Transforms {
    gear: [u64; 256],
    mul: [u64; FEATURES],
    add: [u64; FEATURES],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Transforms {
    fn new() -> Transforms {
        let mut s = 0x5eed_de17a_u64;
        let mut t = Transforms {
            gear: [0; 256],
            mul: [0; FEATURES],
            add: [0; FEATURES],
        };
        t.gear.iter_mut().for_each(|g| *g = splitmix(&mut s));
        // Odd multipliers keep each transform a bijection.
        t.mul.iter_mut().for_each(|m| *m = splitmix(&mut s) | 1);
        t.add.iter_mut().for_each(|a| *a = splitmix(&mut s));
        t
    }
}

/// The three super-features of a chunk.
pub fn super_features(chunk: &[u8]) -> [u64; SUPER] {
    static T: std::sync::OnceLock<Transforms> = std::sync::OnceLock::new();
    let t = T.get_or_init(Transforms::new);
    let mut f = [0u64; FEATURES];
    let mut h = 0u64;
    for &b in chunk {
        h = (h << 1).wrapping_add(t.gear[b as usize]);
        if h & SAMPLE_MASK == 0 {
            for ((fi, m), a) in f.iter_mut().zip(&t.mul).zip(&t.add) {
                *fi = (*fi).max(h.wrapping_mul(*m).wrapping_add(*a));
            }
        }
    }
    let mut sf = [0u64; SUPER];
    for (j, s) in sf.iter_mut().enumerate() {
        // Tag each group with its number so equal groups in different
        // places do not collide.
        let mut x = j as u64;
        for v in &f[j * PER_SUPER..(j + 1) * PER_SUPER] {
            x ^= *v;
            *s = splitmix(&mut x);
            x = *s;
        }
    }
    sf
}

/// Bytes of stored chunks, oldest evicted first once over budget.
#[derive(Default)]
struct Store {
    chunks: HashMap<u64, Arc<[u8]>>,
    order: VecDeque<u64>,
    bytes: u64,
}

/// Super-feature index and base store of one algorithm.
pub struct Resemblance {
    features: Mutex<HashMap<u64, u64>>,
    store: Mutex<Store>,
    memory: u64,
    next: std::sync::atomic::AtomicU64,
}

thread_local! {
    static CCTX: std::cell::RefCell<CCtx<'static>> = std::cell::RefCell::new(CCtx::create());
}

/// zstd size of `data`, with `dict` as raw-content dictionary if given.
fn zstd_size(data: &[u8], dict: Option<&[u8]>) -> u64 {
    CCTX.with(|c| {
        let mut c = c.borrow_mut();
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        let ok = c
            .set_parameter(CParameter::CompressionLevel(ZSTD_LEVEL))
            .and_then(|_| match dict {
                Some(d) => c.load_dictionary(d),
                None => c.disable_dictionary(),
            })
            .and_then(|_| c.compress2(&mut out, data));
        match ok {
            Ok(n) => (n as u64).min(data.len() as u64),
            Err(_) => data.len() as u64,
        }
    })
}

impl Resemblance {
    /// A store of at most `memory` bytes of base chunks.
    pub fn new(memory: u64) -> Resemblance {
        Resemblance {
            features: Mutex::new(HashMap::new()),
            store: Mutex::new(Store::default()),
            memory,
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A new distinct chunk: delta-encode it if a similar chunk is stored,
    /// then keep it as a possible base.
    pub fn add(&self, chunk: &[u8], counts: &mut DeltaCounts) {
        if chunk.len() < MIN_CHUNK {
            return;
        }
        let t0 = crate::cpu::now();
        let sf = super_features(chunk);
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Keep the chunk before publishing its features, so another reader
        // never finds an id whose bytes are not stored yet.
        if self.memory > 0 {
            let mut s = self.store.lock().unwrap_or_else(|e| e.into_inner());
            s.chunks.insert(id, chunk.into());
            s.order.push_back(id);
            s.bytes += chunk.len() as u64;
            while s.bytes > self.memory {
                let Some(old) = s.order.pop_front() else {
                    break;
                };
                if let Some(c) = s.chunks.remove(&old) {
                    s.bytes -= c.len() as u64;
                }
            }
        }
        // Each super-feature names the newest chunk that had it: in a chain
        // of versions, the previous version is the likeliest still kept.
        let candidates: Vec<u64> = {
            let mut f = self.features.lock().unwrap_or_else(|e| e.into_inner());
            let found = sf.iter().filter_map(|s| f.get(s).copied()).collect();
            for s in sf {
                f.insert(s, id);
            }
            found
        };
        if !candidates.is_empty() {
            let base = {
                let s = self.store.lock().unwrap_or_else(|e| e.into_inner());
                candidates.iter().find_map(|b| s.chunks.get(b).cloned())
            };
            match base {
                Some(base) => {
                    counts.similar_chunks += 1;
                    counts.similar_bytes += chunk.len() as u64;
                    counts.delta_bytes += zstd_size(chunk, Some(&base));
                    counts.alone_bytes += zstd_size(chunk, None);
                }
                None => counts.base_evicted += 1,
            }
        }
        counts.time += crate::cpu::now().saturating_sub(t0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::random;

    #[test]
    fn a_lightly_edited_chunk_shares_a_super_feature_and_a_different_one_does_not() {
        let a = random(8192, 1);
        let mut b = a.clone();
        for i in (100..8192).step_by(1500) {
            b[i] ^= 0x55;
        }
        let c = random(8192, 2);
        let (fa, fb, fc) = (super_features(&a), super_features(&b), super_features(&c));
        assert!(fa.iter().any(|x| fb.contains(x)), "{fa:?} {fb:?}");
        assert!(!fa.iter().any(|x| fc.contains(x)));
    }

    #[test]
    fn a_near_duplicate_is_delta_encoded_small_and_an_unrelated_chunk_is_not_matched() {
        let r = Resemblance::new(1 << 20);
        let mut c = DeltaCounts::default();
        let a = random(8192, 3);
        r.add(&a, &mut c);
        let mut b = a.clone();
        b[4000..4010].copy_from_slice(b"0123456789");
        r.add(&b, &mut c);
        r.add(&random(8192, 4), &mut c);
        assert_eq!(c.similar_chunks, 1);
        assert_eq!(c.similar_bytes, 8192);
        assert!(c.delta_bytes < 200, "{c:?}");
        assert!(c.alone_bytes >= 8000, "{c:?}");
    }

    #[test]
    fn a_chain_of_versions_finds_the_previous_version_within_a_small_budget() {
        // Each version edits the last one; only two chunks fit in memory.
        let r = Resemblance::new(2 * 8192);
        let mut c = DeltaCounts::default();
        let mut v = random(8192, 7);
        r.add(&v, &mut c);
        for i in 0..9 {
            v[500 + i * 700] ^= 0xff;
            r.add(&v, &mut c);
        }
        assert_eq!(c.base_evicted, 0, "{c:?}");
        assert!(c.similar_chunks >= 8, "{c:?}");
    }

    #[test]
    fn bases_beyond_the_memory_budget_are_evicted_and_counted() {
        let r = Resemblance::new(8192);
        let mut c = DeltaCounts::default();
        let a = random(8192, 5);
        r.add(&a, &mut c);
        r.add(&random(8192, 6), &mut c);
        let mut b = a.clone();
        b[10] ^= 1;
        r.add(&b, &mut c);
        assert_eq!(c.similar_chunks, 0);
        assert_eq!(c.base_evicted, 1);
    }
}
