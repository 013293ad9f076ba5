//! Open addressing with linear probing, over any array of slots: the hash
//! index of INRAM (slots in RAM) and of disktable (slots in cached blocks of
//! the metadata device), as Dmdedup §2.6.1-2.6.2 describe.
//!
//! Tables are sized once from the data device with 10 % spare slots (every
//! PBN holds at most one fingerprint, so they never overfill). Deletion
//! shifts later members of the probe run back (no tombstones), so lookups
//! stay short after garbage collection.

use crate::config::Pbn;
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// An array of hash index slots.
pub trait Slots {
    fn slot_count(&self) -> u64;
    /// The entry in slot `i`, if occupied.
    fn get(&mut self, i: u64) -> Result<Option<(Fingerprint, Pbn)>>;
    fn set(&mut self, i: u64, entry: Option<(Fingerprint, Pbn)>) -> Result<()>;
}

/// Slots for a table that can hold `max_entries`.
pub fn slots_for(max_entries: u64) -> u64 {
    (max_entries + max_entries / 10 + 1).max(16)
}

/// Fingerprint bytes are uniform: a multiply-shift of the prefix spreads
/// them over the table without a modulo bias worth caring about.
pub fn home(fp: &Fingerprint, slots: u64) -> u64 {
    ((fp.prefix_u64() as u128 * slots as u128) >> 64) as u64
}

fn next(i: u64, slots: u64) -> u64 {
    if i + 1 == slots {
        0
    } else {
        i + 1
    }
}

/// Slot holding `fp` (true), or the empty slot ending its probe run (false).
fn probe(s: &mut impl Slots, fp: &Fingerprint) -> Result<(u64, bool)> {
    let n = s.slot_count();
    let mut i = home(fp, n);
    for _ in 0..n {
        match s.get(i)? {
            None => return Ok((i, false)),
            Some((f, _)) if f == *fp => return Ok((i, true)),
            Some(_) => i = next(i, n),
        }
    }
    Err(crate::error::Error::corrupt(
        "hash index",
        "no empty slot: the table is full",
    ))
}

pub fn lookup(s: &mut impl Slots, fp: &Fingerprint) -> Result<Option<Pbn>> {
    Ok(match probe(s, fp)? {
        (i, true) => s.get(i)?.map(|(_, pbn)| pbn),
        _ => None,
    })
}

/// What `insert` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    New,
    Replaced,
    /// No room: one slot always stays empty to end probe runs.
    Full,
}

/// Insert or replace. `len` is the current number of entries.
pub fn insert(s: &mut impl Slots, fp: &Fingerprint, pbn: Pbn, len: u64) -> Result<Inserted> {
    let (i, found) = probe(s, fp)?;
    if !found && len + 1 >= s.slot_count() {
        return Ok(Inserted::Full);
    }
    s.set(i, Some((*fp, pbn)))?;
    Ok(if found {
        Inserted::Replaced
    } else {
        Inserted::New
    })
}

/// Remove `fp`; returns its PBN if it was present.
pub fn delete(s: &mut impl Slots, fp: &Fingerprint) -> Result<Option<Pbn>> {
    let n = s.slot_count();
    let (mut hole, found) = probe(s, fp)?;
    if !found {
        return Ok(None);
    }
    let pbn = s.get(hole)?.map(|(_, p)| p);
    s.set(hole, None)?;
    // Backward-shift: move later members of the run into the hole when
    // their home position does not lie cyclically in (hole, j].
    let mut j = next(hole, n);
    while let Some(entry) = s.get(j)? {
        let h = home(&entry.0, n);
        let stays = if hole <= j {
            hole < h && h <= j
        } else {
            hole < h || h <= j
        };
        if !stays {
            s.set(hole, Some(entry))?;
            s.set(j, None)?;
            hole = j;
        }
        j = next(j, n);
    }
    Ok(pbn)
}

/// After the slots just before `from` were emptied at once (a damaged
/// block of them read as empty), move each entry of the probe run starting
/// at `from` to where a lookup from its home finds it: no run may cross an
/// empty slot. Re-inserting in run order never moves an entry past its old
/// slot, which is empty when it is probed. Returns the entries moved.
pub fn reseat_run(s: &mut impl Slots, from: u64) -> Result<u64> {
    let n = s.slot_count();
    let mut j = from % n;
    let mut moved = 0;
    for _ in 0..n {
        let Some((fp, pbn)) = s.get(j)? else {
            break;
        };
        s.set(j, None)?;
        let (i, _) = probe(s, &fp)?;
        s.set(i, Some((fp, pbn)))?;
        moved += (i != j) as u64;
        j = next(j, n);
    }
    Ok(moved)
}

/// Entries in slot order from slot `from`: up to `max` of them, and the slot
/// to continue at (None at the end).
pub fn scan(
    s: &mut impl Slots,
    from: u64,
    max: usize,
    out: &mut Vec<(Fingerprint, Pbn)>,
) -> Result<Option<u64>> {
    let n = s.slot_count();
    let mut i = from;
    let mut taken = 0;
    while i < n {
        if taken == max {
            return Ok(Some(i));
        }
        if let Some(e) = s.get(i)? {
            out.push(e);
            taken += 1;
        }
        i += 1;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct VecSlots(Vec<Option<(Fingerprint, Pbn)>>);

    impl Slots for VecSlots {
        fn slot_count(&self) -> u64 {
            self.0.len() as u64
        }
        fn get(&mut self, i: u64) -> Result<Option<(Fingerprint, Pbn)>> {
            Ok(self.0[i as usize])
        }
        fn set(&mut self, i: u64, entry: Option<(Fingerprint, Pbn)>) -> Result<()> {
            self.0[i as usize] = entry;
            Ok(())
        }
    }

    /// Every fingerprint whose prefix sends it home to `slot` of `n`.
    fn homed_at(slot: u64, n: u64, k: u8) -> Fingerprint {
        let prefix = ((slot as u128) << 64).div_ceil(n as u128) as u64;
        let mut fp = [k; 32];
        fp[..8].copy_from_slice(&prefix.to_le_bytes());
        let fp = Fingerprint(fp);
        assert_eq!(home(&fp, n), slot);
        fp
    }

    #[test]
    fn a_run_over_an_emptied_range_is_reseated_so_lookups_find_it() {
        // Wrapping runs: entries homed at 13..16 and 0..4 crowd past the
        // end of the table and across slots 4..8, which are then emptied.
        let n = 16;
        let mut s = VecSlots(vec![None; n as usize]);
        let fps: Vec<Fingerprint> = (0..14u8)
            .map(|k| homed_at([13, 14, 15, 0, 1, 2, 3, 3][k as usize % 8], n, k))
            .collect();
        for (i, fp) in fps.iter().enumerate() {
            assert_eq!(
                insert(&mut s, fp, i as u64, i as u64).unwrap(),
                Inserted::New
            );
        }
        let gone: Vec<Fingerprint> = (4..8)
            .filter_map(|i| s.0[i].take().map(|(fp, _)| fp))
            .collect();
        reseat_run(&mut s, 8).unwrap();
        for (i, fp) in fps.iter().enumerate() {
            let want = (!gone.contains(fp)).then_some(i as u64);
            assert_eq!(lookup(&mut s, fp).unwrap(), want, "entry {i}");
        }
    }
}
