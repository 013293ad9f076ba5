//! What the sampled index will hold at a store size not reached yet, by
//! its own rule (`hooks.rs`): each container's pinned hook, plus the
//! other fingerprints sampled at period T, T doubled until the hooks fit
//! the budget (M/E of them). A report made at a few GiB stored must not
//! extrapolate its RAM per TiB: sampling has not started there, and at
//! 1 TiB the index holds a small fraction of what a full one would.

use super::hooks::{table_bytes, FILTER_BITS_PER_HOOK, HOOK_BYTES};

/// The hook table's RAM (its slots and its Bloom filter) once `stored`
/// bytes are held in segments of `segment_bytes` and containers of
/// `container_bytes`, under a budget of `budget` bytes. Past the
/// capacity limit (the pinned hooks alone over the budget) the table
/// holds the pinned hooks only, over the budget.
pub fn hook_bytes_at(stored: u64, budget: u64, segment_bytes: u64, container_bytes: u64) -> u64 {
    let fingerprints = stored / segment_bytes.max(1);
    let per_container = (container_bytes / segment_bytes.max(1)).max(1);
    let max_hooks = budget / HOOK_BYTES;
    // Hooks at period T, with `f` fingerprints stored: one pinned a
    // container, and one in T of the rest.
    let hooks = |f: u64, t: u64| {
        let pinned = f.div_ceil(per_container);
        pinned + (f - pinned) / t
    };
    let mut period = 1u64;
    while hooks(fingerprints, period) > max_hooks && period < 1 << 63 {
        period *= 2;
    }
    let held = hooks(fingerprints, period);
    // The filter was last rebuilt, for twice the hooks then held, when R
    // last halved: when the hooks at twice this rate reached the budget.
    let filter_hooks = match period {
        1 => 2 * held,
        _ => {
            // The fewest fingerprints that overfill the budget at 2/T:
            // a bisection, as `hooks` is monotonic in them.
            let (mut low, mut high) = (0, fingerprints);
            while low < high {
                let mid = low + (high - low) / 2;
                match hooks(mid, period / 2) > max_hooks {
                    true => high = mid,
                    false => low = mid + 1,
                }
            }
            (2 * hooks(low, period)).max(held)
        }
    };
    table_bytes(held as usize) + filter_hooks * FILTER_BITS_PER_HOOK as u64 / 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::DEFAULT_INDEX_MEMORY;

    const MIB: f64 = (1u64 << 20) as f64;

    /// docs/store-bench.md's index_scale run: 17.8 MiB at 1 TiB stored in
    /// 4 KiB segments and 16 MiB containers, with the default budget;
    /// 17.9 MiB at 2 TiB and 18.2 MiB at 8 TiB.
    #[test]
    fn the_index_at_one_tib_holds_what_index_scale_measured() {
        let at = |tib: u64| {
            hook_bytes_at(tib << 40, DEFAULT_INDEX_MEMORY, 4 << 10, 16 << 20) as f64 / MIB
        };
        assert!((at(1) - 17.8).abs() < 0.1, "{} MiB at 1 TiB", at(1));
        assert!((at(2) - 17.9).abs() < 0.2, "{} MiB at 2 TiB", at(2));
        assert!((at(8) - 18.2).abs() < 0.3, "{} MiB at 8 TiB", at(8));
        // Under the budget whatever the size, until the pinned hooks
        // alone fill it.
        assert!(at(4) < 32.0);
    }

    /// The projection follows a real index fed the same way, at a size a
    /// test can afford (a 1 MiB budget, 8 GiB stored).
    #[test]
    fn the_projection_follows_a_real_index() {
        use crate::index::{Index, IndexConfig};
        use dedup_common::fingerprint::Fingerprint;
        let config = IndexConfig {
            index_memory: 1 << 20,
            cache_entries: 0,
            ..IndexConfig::default()
        };
        let mut index = Index::new(config);
        let mut state = 7u64;
        let per_container = 1024;
        for container in 0..2048u64 {
            let batch: Vec<Fingerprint> = (0..per_container)
                .map(|_| {
                    let mut fp = [0u8; 32];
                    for w in fp.chunks_exact_mut(8) {
                        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                        let z = (state ^ (state >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                        w.copy_from_slice(&(z ^ (z >> 29)).to_le_bytes());
                    }
                    Fingerprint(fp)
                })
                .collect();
            index.insert(container, &batch);
        }
        let real = index.figures().hook_bytes as f64;
        let projected = hook_bytes_at(8 << 30, 1 << 20, 4 << 10, 4 << 20) as f64;
        assert!(
            (projected / real - 1.0).abs() < 0.1,
            "projected {projected}, real {real}"
        );
    }
}
