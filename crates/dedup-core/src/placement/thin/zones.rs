//! Zones (ThinDedup §II-B): the data device is cut into zones of
//! `zone_blocks` chunks. A zone's kind says what its blocks are, since a
//! block cannot: U-zones hold plain chunks, C-zones hold C-blocks (whose
//! embedded metadata is either uncommitted, so recovery must scan the
//! zone, or committed to the structured metadata area). Each zone keeps a
//! bitmap of the blocks in use, with a clean/dirty flag: the first change
//! to a clean bitmap must reach the disk (flag dirty) before the change is
//! relied on; later changes cost no I/O until the bitmap is persisted and
//! marked clean again. After a crash only dirty zones' bitmaps need
//! rebuilding from the mappings, and only uncommitted C-zones scanning.
//!
//! Space is reclaimed inside zones: live blocks stay where they are, and a
//! zone is reused for its own kind (any kind once empty), preferring the
//! zone with the longest run of free blocks, so new writes stay as
//! sequential as the free space allows.
//!
//! This module holds the state and its on-disk records; the placement does
//! the I/O, in the order `Changes` asks for.

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Unallocated,
    U,
    UncommittedC,
    CommittedC,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Unallocated => 0,
            Status::U => 1,
            Status::UncommittedC => 2,
            Status::CommittedC => 3,
        }
    }
    fn from_code(c: u8) -> Option<Status> {
        Some(match c {
            0 => Status::Unallocated,
            1 => Status::U,
            2 => Status::UncommittedC,
            3 => Status::CommittedC,
            _ => return None,
        })
    }
    pub fn is_c(self) -> bool {
        matches!(self, Status::UncommittedC | Status::CommittedC)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Plain chunks.
    U,
    /// C-blocks.
    C,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    pub status: Status,
    /// The on-disk bitmap may be behind the one here.
    pub dirty: bool,
    /// C-zones: the newest entry timestamp committed from this zone; newer
    /// entries in it are not yet in the structured metadata area.
    pub committed_ts: u64,
    /// One bit per block: in use.
    pub bitmap: Vec<u8>,
    /// One bit per block: the block holds (or, once freed, last held) a
    /// C-block. Kept after a free so a check can still read a block whose
    /// counts were lost; set again by the next allocation.
    pub cblocks: Vec<u8>,
}

impl Zone {
    fn used(&self, i: usize) -> bool {
        self.bitmap[i / 8] & (1 << (i % 8)) != 0
    }
    fn set(&mut self, i: usize, v: bool) {
        if v {
            self.bitmap[i / 8] |= 1 << (i % 8);
        } else {
            self.bitmap[i / 8] &= !(1 << (i % 8));
        }
    }
    fn is_empty(&self) -> bool {
        self.bitmap.iter().all(|&b| b == 0)
    }
    fn is_c(&self, i: usize) -> bool {
        self.cblocks[i / 8] & (1 << (i % 8)) != 0
    }
    fn set_c(&mut self, i: usize, v: bool) {
        if v {
            self.cblocks[i / 8] |= 1 << (i % 8);
        } else {
            self.cblocks[i / 8] &= !(1 << (i % 8));
        }
    }
}

/// Zone records the caller must write before anything that relies on them
/// is acknowledged (status changes, clean → dirty). Other bitmap changes
/// wait for the next persist of the zone (`encode(z, true)`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub now: Vec<usize>,
}

pub struct Zones {
    zone_blocks: usize,
    /// Blocks on the data device (the last zone may be short).
    blocks: u64,
    zones: Vec<Zone>,
    /// The zone each kind is filling, and the next block to try in it.
    open: [Option<(usize, usize)>; 2],
}

/// Bytes of one zone record on disk for zones of `zone_blocks` blocks:
/// status (1), dirty (1), reserved (2), committed timestamp (8), in-use
/// bitmap, C-block bitmap, crc32c (4).
pub fn record_len(zone_blocks: usize) -> usize {
    12 + 2 * zone_blocks.div_ceil(8) + 4
}

fn kind_slot(k: Kind) -> usize {
    match k {
        Kind::U => 0,
        Kind::C => 1,
    }
}

impl Zones {
    pub fn new(blocks: u64, zone_blocks: usize) -> Zones {
        assert!(zone_blocks >= 8 && zone_blocks % 8 == 0);
        let n = blocks.div_ceil(zone_blocks as u64) as usize;
        Zones {
            zone_blocks,
            blocks,
            zones: (0..n)
                .map(|_| Zone {
                    status: Status::Unallocated,
                    dirty: false,
                    committed_ts: 0,
                    bitmap: vec![0; zone_blocks / 8],
                    cblocks: vec![0; zone_blocks / 8],
                })
                .collect(),
            open: [None, None],
        }
    }

    pub fn len(&self) -> usize {
        self.zones.len()
    }

    pub fn is_empty(&self) -> bool {
        self.zones.is_empty()
    }

    pub fn zone(&self, z: usize) -> &Zone {
        &self.zones[z]
    }

    /// The zone of a block, and its index there.
    pub fn locate(&self, pbn: u64) -> (usize, usize) {
        (
            (pbn / self.zone_blocks as u64) as usize,
            (pbn % self.zone_blocks as u64) as usize,
        )
    }

    /// Blocks in zone `z` (the last may be short).
    fn size(&self, z: usize) -> usize {
        let start = z as u64 * self.zone_blocks as u64;
        (self.blocks - start).min(self.zone_blocks as u64) as usize
    }

    fn longest_free_run(&self, z: usize) -> usize {
        let (mut best, mut run) = (0, 0);
        for i in 0..self.size(z) {
            if self.zones[z].used(i) {
                run = 0;
            } else {
                run += 1;
                best = best.max(run);
            }
        }
        best
    }

    /// The zone to fill next with `kind`: an empty zone (of any kind, or
    /// never used) or one of that kind, whichever has the longest free run.
    fn pick(&self, kind: Kind) -> Option<usize> {
        let fits = |z: &Zone| match kind {
            Kind::U => z.status == Status::U,
            Kind::C => z.status.is_c(),
        };
        (0..self.zones.len())
            .filter(|&z| {
                let zone = &self.zones[z];
                zone.status == Status::Unallocated || zone.is_empty() || fits(zone)
            })
            .map(|z| (self.longest_free_run(z), z))
            .filter(|&(run, _)| run > 0)
            // Longest run first; the lowest zone among equals (log order).
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, z)| z)
    }

    fn mark_dirty(&mut self, z: usize, changes: &mut Changes) {
        if !self.zones[z].dirty {
            self.zones[z].dirty = true;
            changes.now.push(z);
        }
    }

    /// Allocate `n` blocks for `kind`, in order, or fewer if the device is
    /// full. Records in `changes.now` must be persisted before the blocks
    /// are written and acknowledged.
    pub fn alloc(&mut self, kind: Kind, n: usize, changes: &mut Changes) -> Vec<u64> {
        let mut out = Vec::with_capacity(n);
        let slot = kind_slot(kind);
        while out.len() < n {
            // A kind fills zones of its own; when none has room, it spills
            // into the other kind's zones (each block records whether it
            // is a C-block), so typed zones never cause an early ENOSPC.
            let (z, mut i, spill) = match self.open[slot] {
                Some((z, i)) => (z, i, false),
                None => match self.pick(kind) {
                    Some(z) => (z, 0, false),
                    None => match self.pick_any() {
                        Some(z) => (z, 0, true),
                        None => break,
                    },
                },
            };
            let fits = match kind {
                Kind::U => self.zones[z].status == Status::U,
                Kind::C => self.zones[z].status.is_c(),
            };
            if !spill && !fits && !self.zones[z].is_empty() {
                // The zone this kind was filling went to the other kind
                // while empty and holds its blocks now: find another.
                self.open[slot] = None;
                continue;
            }
            let want = match kind {
                // Plain blocks in a C-zone leave it a C-zone (recovery
                // still scans it for the C-blocks' entries).
                Kind::U if self.zones[z].status.is_c() && !self.zones[z].is_empty() => {
                    self.zones[z].status
                }
                Kind::U => Status::U,
                Kind::C => Status::UncommittedC,
            };
            if self.zones[z].status != want {
                // Taking an empty zone for a kind, or new C-blocks (with
                // uncommitted entries) into a committed C-zone or a U-zone.
                self.zones[z].status = want;
                self.zones[z].dirty = true;
                changes.now.push(z);
            }
            let size = self.size(z);
            while i < size && self.zones[z].used(i) {
                i += 1;
            }
            if i == size {
                self.open[slot] = None;
                continue;
            }
            self.mark_dirty(z, changes);
            self.zones[z].set(i, true);
            self.zones[z].set_c(i, kind == Kind::C);
            out.push(z as u64 * self.zone_blocks as u64 + i as u64);
            self.open[slot] = (!spill).then_some((z, i + 1));
        }
        changes.now.sort_unstable();
        changes.now.dedup();
        out
    }

    /// Any zone with a free block (for a kind whose own zones are full).
    fn pick_any(&self) -> Option<usize> {
        (0..self.zones.len())
            .map(|z| (self.longest_free_run(z), z))
            .filter(|&(run, _)| run > 0)
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
            .map(|(_, z)| z)
    }

    /// A block found in use although the bitmap says free (a count a
    /// repair gave back): marked, so it is never handed out.
    pub fn mark_used(&mut self, pbn: u64, changes: &mut Changes) {
        let (z, i) = self.locate(pbn);
        if z < self.zones.len() && !self.zones[z].used(i) {
            self.mark_dirty(z, changes);
            self.zones[z].set(i, true);
        }
    }

    /// Zone `z` is about to change in a way a crash could cut in half:
    /// its record must say dirty, so recovery rebuilds its bitmap.
    pub fn touch(&mut self, z: usize, changes: &mut Changes) {
        self.mark_dirty(z, changes);
    }

    /// Whether the block at `pbn` is in use.
    pub fn is_used(&self, pbn: u64) -> bool {
        let (z, i) = self.locate(pbn);
        z < self.zones.len() && self.zones[z].used(i)
    }

    /// Blocks free to allocate.
    pub fn free_blocks(&self) -> u64 {
        (0..self.zones.len())
            .map(|z| {
                let used: u32 = self.zones[z].bitmap.iter().map(|b| b.count_ones()).sum();
                self.size(z) as u64 - used as u64
            })
            .sum()
    }

    /// Whether the block at `pbn` holds (or last held) a C-block.
    pub fn is_cblock(&self, pbn: u64) -> bool {
        let (z, i) = self.locate(pbn);
        z < self.zones.len() && self.zones[z].is_c(i)
    }

    /// A block's last reference went away: its space is free again.
    pub fn free(&mut self, pbn: u64, changes: &mut Changes) {
        let (z, i) = self.locate(pbn);
        if self.zones[z].used(i) {
            self.mark_dirty(z, changes);
            self.zones[z].set(i, false);
        }
    }

    /// The uncommitted C-zones: what recovery scans and a commit drains.
    pub fn uncommitted(&self) -> Vec<usize> {
        (0..self.zones.len())
            .filter(|&z| self.zones[z].status == Status::UncommittedC)
            .collect()
    }

    /// Zone `z`'s entries up to `ts` are in the structured metadata area.
    pub fn committed(&mut self, z: usize, ts: u64) {
        let zone = &mut self.zones[z];
        zone.status = Status::CommittedC;
        zone.committed_ts = zone.committed_ts.max(ts);
        // Its block being written next would make it uncommitted again.
        for o in self.open.iter_mut() {
            if o.is_some_and(|(oz, _)| oz == z) {
                *o = None;
            }
        }
    }

    /// Zone `z`'s record as it is about to be written clean (its bitmap
    /// persisted with it).
    pub fn encode(&mut self, z: usize, clean: bool) -> Vec<u8> {
        if clean {
            self.zones[z].dirty = false;
        }
        let zone = &self.zones[z];
        let mut b = vec![0u8; record_len(self.zone_blocks)];
        b[0] = zone.status.code();
        b[1] = zone.dirty as u8;
        b[4..12].copy_from_slice(&zone.committed_ts.to_le_bytes());
        b[12..12 + zone.bitmap.len()].copy_from_slice(&zone.bitmap);
        let c = 12 + zone.bitmap.len();
        b[c..c + zone.cblocks.len()].copy_from_slice(&zone.cblocks);
        crate::codec::seal(&mut b);
        b
    }

    /// Load zone `z` from its record; a record that fails its checks is
    /// refused with the zone's number.
    pub fn decode(&mut self, z: usize, b: &[u8]) -> Result<()> {
        let bad = |d: String| Error::corrupt("thin zone table", format!("zone {z}: {d}"));
        if b.len() != record_len(self.zone_blocks) || !crate::codec::is_sealed(b) {
            return Err(bad("checksum mismatch (torn or damaged record)".into()));
        }
        let status = Status::from_code(b[0]).ok_or_else(|| bad(format!("status {}", b[0])))?;
        if b[1] > 1 {
            return Err(bad(format!("dirty flag {}", b[1])));
        }
        let n = self.zone_blocks / 8;
        let bitmap = b[12..12 + n].to_vec();
        let cblocks = b[12 + n..12 + 2 * n].to_vec();
        let size = self.size(z);
        let zone = Zone {
            status,
            dirty: b[1] == 1,
            committed_ts: u64::from_le_bytes(b[4..12].try_into().expect("8 bytes")),
            bitmap,
            cblocks,
        };
        if (size..self.zone_blocks).any(|i| zone.used(i)) {
            return Err(bad("blocks beyond the data device marked in use".into()));
        }
        if status == Status::Unallocated && !zone.is_empty() {
            return Err(bad("an unallocated zone with blocks in use".into()));
        }
        self.zones[z] = zone;
        Ok(())
    }

    /// Dirty zones: their bitmaps must be rebuilt from the mappings after
    /// a crash.
    pub fn dirty(&self) -> Vec<usize> {
        (0..self.zones.len())
            .filter(|&z| self.zones[z].dirty)
            .collect()
    }

    /// Replace a dirty zone's bitmaps with the blocks the mappings use,
    /// and which of them are C-blocks.
    pub fn rebuild(&mut self, z: usize, in_use: impl Iterator<Item = (usize, bool)>) {
        let zone = &mut self.zones[z];
        zone.bitmap.fill(0);
        zone.cblocks.fill(0);
        for (i, c) in in_use {
            zone.set(i, true);
            zone.set_c(i, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_fill_zones_of_their_own_in_log_order() {
        let mut z = Zones::new(64, 16);
        let mut ch = Changes::default();
        let u = z.alloc(Kind::U, 20, &mut ch);
        assert_eq!(u, (0..20).collect::<Vec<_>>());
        assert_eq!(ch.now, vec![0, 1], "status and dirty flags persisted first");
        let mut ch = Changes::default();
        let c = z.alloc(Kind::C, 3, &mut ch);
        assert_eq!(
            c,
            vec![32, 33, 34],
            "C-blocks never share a zone with U-blocks"
        );
        assert_eq!(ch.now, vec![2]);
        assert_eq!(z.zone(2).status, Status::UncommittedC);
        // Later allocations in a dirty zone need no record write.
        let mut ch = Changes::default();
        z.alloc(Kind::C, 2, &mut ch);
        assert!(ch.now.is_empty());
    }

    #[test]
    fn freed_space_is_reused_in_place_preferring_long_runs() {
        let mut z = Zones::new(48, 16);
        let mut ch = Changes::default();
        z.alloc(Kind::U, 48, &mut ch);
        assert!(z.alloc(Kind::U, 1, &mut ch).is_empty(), "full");
        // Zone 0: scattered holes; zone 1: a run of 6.
        for pbn in [1, 3, 5, 7, 20, 21, 22, 23, 24, 25] {
            z.free(pbn, &mut ch);
        }
        let got = z.alloc(Kind::U, 6, &mut ch);
        assert_eq!(
            got,
            vec![20, 21, 22, 23, 24, 25],
            "the zone with the longest run"
        );
        let got = z.alloc(Kind::U, 4, &mut ch);
        assert_eq!(
            got,
            vec![1, 3, 5, 7],
            "then the holes, live blocks untouched"
        );
        // A partly used U-zone never takes C-blocks; an emptied one does.
        assert!(z.alloc(Kind::C, 1, &mut ch).is_empty());
        for pbn in 32..48 {
            z.free(pbn, &mut ch);
        }
        assert_eq!(z.alloc(Kind::C, 2, &mut ch), vec![32, 33]);
        assert_eq!(z.zone(2).status, Status::UncommittedC);
    }

    #[test]
    fn a_kind_spills_into_the_other_kinds_zones_rather_than_fail_and_blocks_say_what_they_are() {
        let mut z = Zones::new(32, 16);
        let mut ch = Changes::default();
        // Zone 0 takes C-blocks, zone 1 plain ones; then plain blocks fill
        // zone 1 and spill into zone 0's free blocks.
        assert_eq!(z.alloc(Kind::C, 2, &mut ch), vec![0, 1]);
        let plain = z.alloc(Kind::U, 30, &mut ch);
        assert_eq!(plain.len(), 30, "no ENOSPC while blocks are free");
        assert!(plain.contains(&2) && plain.contains(&16));
        assert!(z.is_cblock(0) && z.is_cblock(1));
        assert!(!z.is_cblock(2) && !z.is_cblock(16));
        // Zone 0 still holds C-blocks: recovery must keep scanning it.
        assert_eq!(z.zone(0).status, Status::UncommittedC);
        // A freed block keeps its kind until allocated again.
        z.free(0, &mut ch);
        assert!(z.is_cblock(0));
        assert_eq!(z.alloc(Kind::U, 1, &mut ch), vec![0]);
        assert!(!z.is_cblock(0));
        // The bits survive a record round trip.
        let rec = z.encode(0, true);
        let mut back = Zones::new(32, 16);
        back.decode(0, &rec).unwrap();
        assert!(back.is_cblock(1) && !back.is_cblock(2));
    }

    #[test]
    fn a_zone_that_changed_kind_while_empty_is_not_taken_back_by_the_old_kind() {
        let mut z = Zones::new(32, 16);
        let mut ch = Changes::default();
        assert_eq!(z.alloc(Kind::C, 1, &mut ch), vec![0]);
        z.free(0, &mut ch);
        // Zone 0 (empty) goes to plain blocks, which fill it.
        assert_eq!(z.alloc(Kind::U, 16, &mut ch).len(), 16);
        assert_eq!(z.zone(0).status, Status::U);
        // C-blocks must not resume in zone 0 where they left off.
        let c = z.alloc(Kind::C, 1, &mut ch);
        assert_eq!(c, vec![16]);
        assert_eq!(z.zone(0).status, Status::U);
    }

    #[test]
    fn commit_and_reuse_of_a_committed_c_zone() {
        // One zone only, so the committed zone is the one reused.
        let mut z = Zones::new(16, 16);
        let mut ch = Changes::default();
        z.alloc(Kind::C, 4, &mut ch);
        assert_eq!(z.uncommitted(), vec![0]);
        z.committed(0, 77);
        assert!(z.uncommitted().is_empty());
        assert_eq!(z.zone(0).committed_ts, 77);
        let mut ch = Changes::default();
        assert_eq!(z.alloc(Kind::C, 1, &mut ch), vec![4]);
        assert_eq!(
            ch.now,
            vec![0],
            "new entries in a committed zone: status persisted"
        );
        assert_eq!(z.uncommitted(), vec![0]);
    }

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let mut z = Zones::new(40, 16); // the last zone is 8 blocks
        let mut ch = Changes::default();
        z.alloc(Kind::U, 5, &mut ch);
        z.alloc(Kind::C, 3, &mut ch);
        z.committed(1, 9);
        let recs: Vec<Vec<u8>> = (0..z.len()).map(|i| z.encode(i, true)).collect();
        let mut back = Zones::new(40, 16);
        for (i, r) in recs.iter().enumerate() {
            back.decode(i, r).unwrap();
        }
        for i in 0..z.len() {
            assert_eq!(back.zone(i), z.zone(i));
        }
        assert!(back.dirty().is_empty());
        let mut bad = recs[0].clone();
        bad[13] ^= 1;
        let e = back.decode(0, &bad).unwrap_err().to_string();
        assert!(e.contains("zone 0"), "{e}");
        // A forged record marking blocks beyond the device.
        let mut short = Zones::new(40, 16);
        short.zones[2].bitmap[1] = 1;
        short.zones[2].status = Status::U;
        let rec = short.encode(2, true);
        assert!(back.decode(2, &rec).is_err());
    }

    #[test]
    fn dirty_zones_are_the_ones_to_rebuild() {
        let mut z = Zones::new(64, 16);
        let mut ch = Changes::default();
        z.alloc(Kind::U, 20, &mut ch);
        for i in 0..z.len() {
            z.encode(i, true);
        }
        assert!(z.dirty().is_empty());
        z.free(17, &mut ch);
        assert_eq!(z.dirty(), vec![1]);
        z.rebuild(1, [(0usize, false), (1, false), (2, false)].into_iter());
        assert!(z.zone(1).used(2) && !z.zone(1).used(3));
    }
}
