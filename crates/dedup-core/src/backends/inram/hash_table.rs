//! The INRAM sparse store (Dmdedup §2.6.1): a statically sized open-addressing
//! hash table with linear probing, `fingerprint -> PBN`.
//!
//! Sized once from the data device (every PBN holds at most one fingerprint,
//! so the table can never hold more entries than there are PBNs) with 10 %
//! over-provisioning, as the paper. Deletion shifts later entries of the probe
//! run back (no tombstones), so lookups stay short after garbage collection.

use crate::config::Pbn;
use crate::error::Result;
use crate::fingerprint::Fingerprint;
use crate::zeroed::{zeroed_vec, ZeroIsValid};

#[derive(Clone, Copy)]
struct Slot {
    fp: Fingerprint,
    /// PBN + 1; 0 marks an empty slot, so a fresh table is all zero bytes
    /// (calloc'd lazily by the OS, not touched up front).
    pbn_plus_one: u64,
}

// SAFETY: a slot is a byte array and an integer; all zeros is the empty slot.
unsafe impl ZeroIsValid for Slot {}

const EMPTY: Slot = Slot {
    fp: Fingerprint([0; 32]),
    pbn_plus_one: 0,
};

pub struct LinearProbeTable {
    slots: Vec<Slot>,
    len: u64,
}

impl LinearProbeTable {
    /// A table able to hold `max_entries` with at least 10 % spare slots.
    pub fn with_max_entries(max_entries: u64) -> Result<Self> {
        let capacity = (max_entries + max_entries / 10 + 1).max(16);
        Ok(LinearProbeTable {
            slots: zeroed_vec(capacity as usize, "the inram hash index")?,
            len: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.slots.len() as u64
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes of RAM the table occupies.
    pub fn bytes(&self) -> u64 {
        self.capacity() * std::mem::size_of::<Slot>() as u64
    }

    fn home(&self, fp: &Fingerprint) -> usize {
        // Fingerprint bytes are uniform: a multiply-shift of the prefix spreads
        // them over the table without a modulo bias worth caring about.
        ((fp.prefix_u64() as u128 * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// Slot index holding `fp`, or the empty slot ending its probe run.
    fn probe(&self, fp: &Fingerprint) -> (usize, bool) {
        let mut i = self.home(fp);
        loop {
            let s = &self.slots[i];
            if s.pbn_plus_one == 0 {
                return (i, false);
            }
            if s.fp == *fp {
                return (i, true);
            }
            i = self.next(i);
        }
    }

    pub fn lookup(&self, fp: &Fingerprint) -> Option<Pbn> {
        match self.probe(fp) {
            (i, true) => Some(self.slots[i].pbn_plus_one - 1),
            _ => None,
        }
    }

    /// Insert or replace. Returns false if the table is full (never happens
    /// while entries stay below the PBN count it was sized for).
    pub fn insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> bool {
        if self.len + 1 >= self.capacity() && self.lookup(fp).is_none() {
            return false;
        }
        let (i, found) = self.probe(fp);
        if !found {
            self.len += 1;
        }
        self.slots[i] = Slot {
            fp: *fp,
            pbn_plus_one: pbn + 1,
        };
        true
    }

    /// Remove `fp`; returns its PBN if it was present.
    pub fn delete(&mut self, fp: &Fingerprint) -> Option<Pbn> {
        let (mut hole, found) = self.probe(fp);
        if !found {
            return None;
        }
        let pbn = self.slots[hole].pbn_plus_one - 1;
        self.slots[hole] = EMPTY;
        self.len -= 1;
        // Backward-shift: move later members of the run into the hole when
        // their home position does not lie cyclically in (hole, j].
        let mut j = self.next(hole);
        while self.slots[j].pbn_plus_one != 0 {
            let home = self.home(&self.slots[j].fp);
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = self.slots[j];
                self.slots[j] = EMPTY;
                hole = j;
            }
            j = self.next(j);
        }
        Some(pbn)
    }

    /// Entries in slot order from slot `from`: up to `max` of them, and the
    /// slot to continue at (None at the end).
    pub fn scan(&self, from: u64, max: usize, out: &mut Vec<(Fingerprint, Pbn)>) -> Option<u64> {
        let mut i = from as usize;
        let mut taken = 0;
        while i < self.slots.len() {
            if taken == max {
                return Some(i as u64);
            }
            let s = &self.slots[i];
            if s.pbn_plus_one != 0 {
                out.push((s.fp, s.pbn_plus_one - 1));
                taken += 1;
            }
            i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn fp(n: u64) -> Fingerprint {
        crate::fingerprint::HashAlgo::Blake3.fingerprint(&n.to_le_bytes())
    }

    /// Fingerprints that all land in the same home slot, to stress probe runs.
    fn colliding(n: u64) -> Fingerprint {
        let mut f = fp(n);
        f.0[..8].copy_from_slice(&0x8000_0000_0000_0000u64.to_le_bytes());
        f
    }

    #[test]
    fn matches_a_hashmap_under_random_inserts_and_deletes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut t = LinearProbeTable::with_max_entries(200).unwrap();
        let mut model: HashMap<Fingerprint, Pbn> = HashMap::new();
        for step in 0..20_000 {
            let k = rng.random_range(0..300u64);
            let key = if k % 3 == 0 { colliding(k) } else { fp(k) };
            if rng.random_bool(0.55) && model.len() < 200 {
                assert!(t.insert(&key, step));
                model.insert(key, step);
            } else {
                assert_eq!(t.delete(&key), model.remove(&key));
            }
            assert_eq!(t.len(), model.len() as u64);
        }
        for (k, v) in &model {
            assert_eq!(t.lookup(k), Some(*v));
        }
        let mut all = Vec::new();
        let mut cursor = Some(0);
        while let Some(c) = cursor {
            cursor = t.scan(c, 7, &mut all);
        }
        assert_eq!(all.len(), model.len());
    }

    #[test]
    fn wraps_probe_runs_around_the_end_of_the_table() {
        let mut t = LinearProbeTable::with_max_entries(10).unwrap();
        let cap = t.capacity();
        let mut keys = Vec::new();
        for n in 0..6 {
            let mut f = fp(n);
            // home = last slot
            let prefix = u64::MAX - (u64::MAX / cap) / 2;
            f.0[..8].copy_from_slice(&prefix.to_le_bytes());
            assert_eq!(t.home(&f), cap as usize - 1);
            assert!(t.insert(&f, n));
            keys.push(f);
        }
        assert_eq!(t.delete(&keys[0]), Some(0));
        for (n, k) in keys.iter().enumerate().skip(1) {
            assert_eq!(t.lookup(k), Some(n as u64));
        }
    }

    #[test]
    fn refuses_to_overfill() {
        let mut t = LinearProbeTable::with_max_entries(10).unwrap();
        let cap = t.capacity();
        let mut n = 0;
        while t.insert(&fp(n), n) {
            n += 1;
        }
        assert_eq!(
            t.len(),
            cap - 1,
            "one slot always stays empty to end probes"
        );
        assert!(t.lookup(&fp(10_000)).is_none());
    }
}
