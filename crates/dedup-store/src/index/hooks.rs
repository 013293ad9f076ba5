//! The hook table: the sampled part of the index that lives in RAM (§3.2),
//! fingerprint → container, held within a memory budget by progressive
//! sampling (§3.2.2).
//!
//! Each container keeps one *pinned* hook whatever R is (its first
//! fingerprint not already a hook), the paper's minimum of one hook per
//! container that seeds catalog prefetch (§3.2.1). Every other hook is a
//! fingerprint sampled at the current R; halving R drops exactly the
//! unpinned hooks the new R no longer samples.

use std::collections::HashMap;

use dedup_core::fingerprint::Fingerprint;

use super::sampling::SamplingRate;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hook {
    pub container: u64,
    /// The container's minimum hook, kept at every R.
    pub pinned: bool,
}

pub struct HookTable {
    map: HashMap<Fingerprint, Hook>,
    rate: SamplingRate,
    max_hooks: usize,
    /// Every fingerprint inserted, sampled or not: C/S in Eq. 1.
    fingerprints: u64,
}

impl HookTable {
    /// A table holding at most `max_hooks` hooks, starting at R = 1.
    pub fn new(max_hooks: usize) -> HookTable {
        HookTable::with_rate(max_hooks, SamplingRate::FULL)
    }

    pub fn with_rate(max_hooks: usize, rate: SamplingRate) -> HookTable {
        HookTable {
            map: HashMap::new(),
            rate,
            max_hooks,
            fingerprints: 0,
        }
    }

    pub fn get(&self, fp: &Fingerprint) -> Option<Hook> {
        self.map.get(fp).copied()
    }

    pub fn len(&self) -> usize {
        self.map.len()
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

    pub fn iter(&self) -> impl Iterator<Item = (&Fingerprint, &Hook)> {
        self.map.iter()
    }

    /// Add the hooks of a sealed container, then halve R as often as the
    /// budget needs. The table may exceed the budget by one container's
    /// hooks for the duration of this call.
    pub fn insert(&mut self, container: u64, fingerprints: &[Fingerprint]) {
        self.fingerprints += fingerprints.len() as u64;
        // A fingerprint that is already a hook stays with its first
        // container: the index is advice, either answer is right.
        let pin = fingerprints.iter().find(|fp| !self.map.contains_key(fp));
        if let Some(fp) = pin {
            let hook = Hook {
                container,
                pinned: true,
            };
            self.map.insert(*fp, hook);
        }
        for fp in fingerprints {
            if self.rate.samples(fp) {
                self.map.entry(*fp).or_insert(Hook {
                    container,
                    pinned: false,
                });
            }
        }
        self.fit_budget();
    }

    /// Drop every hook into `containers` (deleted by garbage collection),
    /// so the fingerprints they held can hook a container that has them.
    pub fn forget(&mut self, containers: &std::collections::HashSet<u64>) {
        self.map.retain(|_, h| !containers.contains(&h.container));
    }

    /// Container `container` was compacted and now holds only `present`
    /// (in catalog order): drop its hooks on the fingerprints it lost, and
    /// pin another of its fingerprints if its pinned hook went, so it keeps
    /// the one hook that seeds prefetch (and a checkpoint stays valid).
    pub fn compacted(&mut self, container: u64, present: &[Fingerprint]) {
        let keep: std::collections::HashSet<&Fingerprint> = present.iter().collect();
        let mut lost_pin = false;
        self.map.retain(|fp, h| {
            let stays = h.container != container || keep.contains(fp);
            lost_pin |= !stays && h.pinned;
            stays
        });
        if !lost_pin {
            return;
        }
        // A fingerprint of this container that is a hook of no other.
        let pin = present
            .iter()
            .find(|fp| self.map.get(fp).is_none_or(|h| h.container == container));
        match pin {
            Some(fp) => {
                self.map.insert(
                    *fp,
                    Hook {
                        container,
                        pinned: true,
                    },
                );
            }
            // None left to pin: its unpinned hooks would be refused by a
            // checkpoint's loader, so they go too (prefetch then needs a
            // hook of another container; dedup, never data).
            None => self.map.retain(|_, h| h.container != container),
        }
    }

    /// Restore a hook from a checkpoint (already checked by the caller).
    pub(super) fn restore(&mut self, fp: Fingerprint, hook: Hook) {
        self.map.insert(fp, hook);
    }

    pub(super) fn set_fingerprints(&mut self, fingerprints: u64) {
        self.fingerprints = fingerprints;
    }

    /// Progressive sampling: halve R and drop the hooks it no longer
    /// samples until the table fits, or only pinned hooks are left.
    pub(super) fn fit_budget(&mut self) {
        while self.map.len() > self.max_hooks && self.map.values().any(|h| !h.pinned) {
            let Some(rate) = self.rate.halved() else {
                break;
            };
            self.rate = rate;
            self.map.retain(|fp, h| h.pinned || rate.samples(fp));
        }
    }
}
