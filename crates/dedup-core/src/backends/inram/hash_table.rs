//! The INRAM sparse store (Dmdedup §2.6.1): the linear-probing hash index
//! of `probe.rs` over slots in RAM.

use crate::backends::probe::{self, Slots};
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

impl Slots for Vec<Slot> {
    fn slot_count(&self) -> u64 {
        self.len() as u64
    }

    #[inline]
    fn get(&mut self, i: u64) -> Result<Option<(Fingerprint, Pbn)>> {
        let s = &self[i as usize];
        Ok((s.pbn_plus_one != 0).then_some((s.fp, s.pbn_plus_one.wrapping_sub(1))))
    }

    #[inline]
    fn set(&mut self, i: u64, entry: Option<(Fingerprint, Pbn)>) -> Result<()> {
        self[i as usize] = match entry {
            Some((fp, pbn)) => Slot {
                fp,
                pbn_plus_one: pbn + 1,
            },
            None => EMPTY,
        };
        Ok(())
    }
}

impl LinearProbeTable {
    /// A table able to hold `max_entries` with at least 10 % spare slots.
    pub fn with_max_entries(max_entries: u64) -> Result<Self> {
        Ok(LinearProbeTable {
            slots: zeroed_vec(
                probe::slots_for(max_entries) as usize,
                "the inram hash index",
            )?,
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

    pub fn lookup(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        probe::lookup(&mut self.slots, fp)
    }

    /// Insert or replace. Returns false if the table is full (never happens
    /// while entries stay below the PBN count it was sized for).
    pub fn insert(&mut self, fp: &Fingerprint, pbn: Pbn) -> Result<bool> {
        let outcome = probe::insert(&mut self.slots, fp, pbn, self.len)?;
        self.len += (outcome == probe::Inserted::New) as u64;
        Ok(outcome != probe::Inserted::Full)
    }

    /// Remove `fp`; returns its PBN if it was present.
    pub fn delete(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        let removed = probe::delete(&mut self.slots, fp)?;
        self.len -= removed.is_some() as u64;
        Ok(removed)
    }

    /// Entries in slot order from slot `from`: up to `max` of them, and the
    /// slot to continue at (None at the end).
    pub fn scan(
        &mut self,
        from: u64,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<Option<u64>> {
        probe::scan(&mut self.slots, from, max, out)
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
                assert!(t.insert(&key, step).unwrap());
                model.insert(key, step);
            } else {
                assert_eq!(t.delete(&key).unwrap(), model.remove(&key));
            }
            assert_eq!(t.len(), model.len() as u64);
        }
        for (k, v) in &model {
            assert_eq!(t.lookup(k).unwrap(), Some(*v));
        }
        let mut all = Vec::new();
        let mut cursor = Some(0);
        while let Some(c) = cursor {
            cursor = t.scan(c, 7, &mut all).unwrap();
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
            assert_eq!(probe::home(&f, cap), cap - 1);
            assert!(t.insert(&f, n).unwrap());
            keys.push(f);
        }
        assert_eq!(t.delete(&keys[0]).unwrap(), Some(0));
        for (n, k) in keys.iter().enumerate().skip(1) {
            assert_eq!(t.lookup(k).unwrap(), Some(n as u64));
        }
    }

    #[test]
    fn refuses_to_overfill() {
        let mut t = LinearProbeTable::with_max_entries(10).unwrap();
        let cap = t.capacity();
        let mut n = 0;
        while t.insert(&fp(n), n).unwrap() {
            n += 1;
        }
        assert_eq!(
            t.len(),
            cap - 1,
            "one slot always stays empty to end probes"
        );
        assert!(t.lookup(&fp(10_000)).unwrap().is_none());
    }
}
