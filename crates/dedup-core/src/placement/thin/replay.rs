//! Recovery by fingerprints (ThinDedup §II-C): after a crash the structured
//! metadata holds the last commit; the entries written since (embedded in
//! the C-blocks of uncommitted C-zones, and in metadata blocks) are applied
//! on top of it in timestamp order. Data and entries were written with no
//! ordering between them, so an entry may name a chunk whose bytes never
//! reached the disk: each entry's chunk is read (and decompressed) and
//! hashed, and an entry whose fingerprint does not match is treated as a
//! write that never happened.
//!
//! Why this keeps the crash contract:
//! - Entries at or before the commit's timestamp are already in the
//!   structured metadata and are skipped, so an older entry never
//!   overwrites a newer committed mapping (a crash during the commit of a
//!   C-zone leaves its entries behind with old timestamps).
//! - A chunk released since the last commit stays quarantined until the
//!   next one, so a PBN changes content at most once per uncommitted
//!   period: from free to its one new chunk. The fingerprint check
//!   therefore tells exactly whether that chunk's bytes landed, and every
//!   entry naming a committed chunk finds it intact.
//! - A flushed entry and its chunk were both durable before the flush
//!   returned, so they verify and apply; what was not flushed applies only
//!   where it fully landed, giving "a later written content" or none.
//!
//! Reference counts follow the write path's rule (one for the hash index,
//! one per LBN): a chunk first met in replay gets its index entry and count
//! 1, each mapping adds one and drops one from the chunk it replaces. So
//! counts are rebuilt for the entries' chunks only, and recovery costs
//! what the uncommitted entries cost, not what the device size does.

use std::collections::HashMap;

use serde::Serialize;

use super::cblock::Entry;
use crate::backend::MetadataBackend;
use crate::config::Pbn;
use crate::error::Result;
use crate::fingerprint::{Fingerprint, HashAlgo};

/// The PBN of an entry that unmaps its LBN (TRIM, zero writes): there is
/// no chunk to verify.
pub const UNMAPPED: Pbn = u64::MAX;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Entries found newer than the commit.
    pub entries: u64,
    /// Applied: their chunk verified (or they unmap).
    pub applied: u64,
    /// Not applied: the chunk's bytes are not those the entry names
    /// (never written, torn, or unreadable).
    pub not_written: u64,
    /// At or before the commit: already in the structured metadata.
    pub already_committed: u64,
    /// Chunks read and hashed to verify entries.
    pub chunks_verified: u64,
    /// Chunks first referenced in replay (allocated since the commit).
    pub chunks_adopted: u64,
    /// Decrements skipped because the committed count was already zero
    /// or named no block of the device (damage `check` reports).
    pub inconsistent: u64,
    /// The newest timestamp of an entry applied.
    pub newest_applied: u64,
    /// PBNs whose count replay changed (their zones' bitmaps follow).
    #[serde(skip)]
    pub touched: Vec<Pbn>,
    /// How replay changed the number of mapped LBNs and of hash index
    /// entries (the engine keeps those totals).
    #[serde(skip)]
    pub mapped_delta: i64,
    #[serde(skip)]
    pub indexed_delta: i64,
}

/// Drop one reference from `o`, unless the committed metadata is already
/// inconsistent there: replay must not stop a device from opening (and
/// from being repaired) over damage it did not make.
fn release(m: &mut dyn MetadataBackend, o: Pbn, r: &mut ReplayReport) -> Result<()> {
    match m.refcount_get(o) {
        Ok(c) if c > 0 => {
            m.refcount_dec(o)?;
            r.touched.push(o);
        }
        _ => r.inconsistent += 1,
    }
    Ok(())
}

/// Apply `entries` newer than `commit_ts` to `m`. `read_chunk` gives the
/// bytes of a stored chunk (decompressed), or `None` if it cannot be read
/// or decoded.
pub fn replay(
    m: &mut dyn MetadataBackend,
    mut entries: Vec<Entry>,
    commit_ts: u64,
    hash: HashAlgo,
    read_chunk: &mut dyn FnMut(Pbn) -> Option<Vec<u8>>,
) -> Result<ReplayReport> {
    let mut r = ReplayReport::default();
    // Stable: entries of one timestamp keep the order they were found in,
    // which is the order they were made in.
    entries.sort_by_key(|e| e.timestamp);
    let mut content: HashMap<Pbn, Option<Fingerprint>> = HashMap::new();
    for e in entries {
        if e.timestamp <= commit_ts {
            r.already_committed += 1;
            continue;
        }
        r.entries += 1;
        if e.pbn == UNMAPPED {
            if let Some(old) = m.lbn_map_delete(e.lbn)? {
                r.mapped_delta -= 1;
                release(m, old, &mut r)?;
            }
            r.applied += 1;
            r.newest_applied = r.newest_applied.max(e.timestamp);
            continue;
        }
        let fp = *content.entry(e.pbn).or_insert_with(|| {
            r.chunks_verified += 1;
            read_chunk(e.pbn).map(|bytes| hash.fingerprint(&bytes))
        });
        let Some(fp) = fp.filter(|f| f.0[..16] == e.fp) else {
            r.not_written += 1;
            continue;
        };
        if m.refcount_get(e.pbn)? == 0 {
            // Allocated after the commit: the hash index's reference, as
            // phase A's allocation gives it. (If another chunk with these
            // bytes is indexed, this one is held by its LBNs alone, like a
            // verify-mode collision.)
            let indexed = m.hash_index_lookup(&fp)?.is_some();
            if !indexed {
                m.hash_index_insert(&fp, e.pbn)?;
                r.indexed_delta += 1;
            }
            m.refcount_set(e.pbn, if indexed { 0 } else { 1 })?;
            r.chunks_adopted += 1;
            r.touched.push(e.pbn);
        }
        let old = m.lbn_map_lookup(e.lbn)?;
        if old != Some(e.pbn) {
            if m.refcount_get(e.pbn)? == 0 {
                m.refcount_set(e.pbn, 1)?;
            } else {
                m.refcount_inc(e.pbn)?;
            }
            if m.lbn_map_insert(e.lbn, e.pbn)?.is_none() {
                r.mapped_delta += 1;
            }
            r.touched.push(e.pbn);
            if let Some(o) = old {
                release(m, o, &mut r)?;
            }
        }
        r.applied += 1;
        r.newest_applied = r.newest_applied.max(e.timestamp);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    //! Power cuts in an uncommitted period, against a model: windows of
    //! writes, overwrites, duplicates and trims go to a simulated disk;
    //! windows up to the last flush land whole, later ones land in part
    //! (data blocks and entry carriers independently, some torn). Replay on
    //! the committed metadata must give every LBN its content as of the
    //! last flush or a later written one, never another's, and reference
    //! counts that match the mappings exactly.

    use std::collections::{BTreeMap, HashMap};

    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::backends::{inram, OpenOptions};
    use crate::blockfile::MemBlockFile;
    use crate::config::DeviceConfig;
    use crate::superblock::Superblock;

    const LBNS: u64 = 48;
    const PBNS: u64 = 400;
    const CONTENTS: u64 = 24;

    fn open_inram() -> Box<dyn MetadataBackend> {
        let cfg = DeviceConfig {
            uuid: [7; 16],
            backend: inram::NAME.into(),
            chunk_size: 4096,
            hash: HashAlgo::Blake3,
            verify: false,
            logical_size: LBNS * 4096,
            physical_chunks: PBNS,
            compression: crate::compress::Compression::None,
        };
        let meta = MemBlockFile::new(inram::metadata_device_len(&cfg), "meta");
        inram::format(&cfg, &meta).unwrap();
        let sb = Superblock::read(&meta, std::path::Path::new("meta")).unwrap();
        let opts = OpenOptions {
            writable: true,
            ..Default::default()
        };
        inram::open(sb, Box::new(meta), &opts).unwrap().backend
    }

    fn bytes(content: u64) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[..8].copy_from_slice(&content.to_le_bytes());
        b[4088..].copy_from_slice(&(!content).to_le_bytes());
        b
    }

    fn fp16(content: u64) -> [u8; 16] {
        HashAlgo::Blake3.fingerprint(&bytes(content)).0[..16]
            .try_into()
            .unwrap()
    }

    /// The live state of the device while it runs (what the write path
    /// would hold in memory), and what it produces.
    #[derive(Default)]
    struct Live {
        /// content → PBN, for dedup hits.
        index: HashMap<u64, Pbn>,
        /// LBN → content (None: unmapped).
        lbn: BTreeMap<u64, Option<u64>>,
        next_pbn: Pbn,
        ts: u64,
    }

    /// An operation's entry, and the chunk (PBN, content) it newly stores.
    type Op = (Entry, Option<(Pbn, u64)>);

    /// One write (content Some) or trim (None).
    fn op(live: &mut Live, lbn: u64, content: Option<u64>) -> Op {
        live.ts += 1;
        live.lbn.insert(lbn, content);
        let Some(c) = content else {
            return (
                Entry {
                    lbn,
                    pbn: UNMAPPED,
                    fp: [0; 16],
                    timestamp: live.ts,
                },
                None,
            );
        };
        let mut new = None;
        let pbn = match live.index.get(&c) {
            Some(&p) => p,
            None => {
                // Never reuse a PBN within the period (quarantine).
                let p = live.next_pbn;
                live.next_pbn += 1;
                live.index.insert(c, p);
                new = Some((p, c));
                p
            }
        };
        (
            Entry {
                lbn,
                pbn,
                fp: fp16(c),
                timestamp: live.ts,
            },
            new,
        )
    }

    /// Apply an entry as the write path would have (committed period).
    fn commit_entry(m: &mut dyn MetadataBackend, e: &Entry, new: Option<(Pbn, u64)>) {
        if e.pbn == UNMAPPED {
            if let Some(o) = m.lbn_map_lookup(e.lbn).unwrap() {
                m.lbn_map_delete(e.lbn).unwrap();
                m.refcount_dec(o).unwrap();
            }
            return;
        }
        if let Some((p, c)) = new {
            let fp = HashAlgo::Blake3.fingerprint(&bytes(c));
            m.refcount_set(p, 1).unwrap();
            m.hash_index_insert(&fp, p).unwrap();
        }
        let old = m.lbn_map_lookup(e.lbn).unwrap();
        if old != Some(e.pbn) {
            m.refcount_inc(e.pbn).unwrap();
            m.lbn_map_insert(e.lbn, e.pbn).unwrap();
            if let Some(o) = old {
                m.refcount_dec(o).unwrap();
            }
        }
    }

    fn one_case(seed: u64) -> ReplayReport {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut m = open_inram();
        let mut live = Live::default();
        let mut disk: HashMap<Pbn, Vec<u8>> = HashMap::new();
        let mut entries_on_disk: Vec<Entry> = Vec::new();
        let random_op = |live: &mut Live, rng: &mut rand::rngs::StdRng| {
            let lbn = rng.random_range(0..LBNS);
            let content = (!rng.random_bool(0.15)).then(|| rng.random_range(0..CONTENTS));
            op(live, lbn, content)
        };

        // The committed period: applied to the structured metadata. Some
        // of its entries are still in C-zones not yet marked committed.
        for _ in 0..rng.random_range(0..60) {
            let (e, new) = random_op(&mut live, &mut rng);
            if let Some((p, c)) = new {
                disk.insert(p, bytes(c));
            }
            commit_entry(m.as_mut(), &e, new);
            if rng.random_bool(0.3) {
                entries_on_disk.push(e);
            }
        }
        let commit_ts = live.ts;
        let committed: BTreeMap<u64, Option<u64>> = live.lbn.clone();

        // The uncommitted period: windows, some ending with a flush.
        let windows = rng.random_range(1..8);
        let mut last_flushed = None;
        let mut window_ops: Vec<Vec<Op>> = Vec::new();
        for w in 0..windows {
            let ops = (0..rng.random_range(1..12))
                .map(|_| random_op(&mut live, &mut rng))
                .collect();
            window_ops.push(ops);
            if rng.random_bool(0.4) {
                last_flushed = Some(w);
            }
        }
        // What landed: everything up to the last flush; after it, each data
        // block and each entry on its own (some blocks torn).
        let mut history: BTreeMap<u64, Vec<(usize, Option<u64>)>> = BTreeMap::new();
        for (w, ops) in window_ops.iter().enumerate() {
            let durable = last_flushed.is_some_and(|f| w <= f);
            for (e, new) in ops {
                let content = (e.pbn != UNMAPPED).then(|| content_of(e));
                history.entry(e.lbn).or_default().push((w, content));
                if let Some((p, c)) = new {
                    if durable || rng.random_bool(0.6) {
                        let mut b = bytes(*c);
                        if !durable && rng.random_bool(0.2) {
                            b[2048..].fill(0xAA); // torn: half old, half new
                        }
                        disk.insert(*p, b);
                    }
                }
                if durable || rng.random_bool(0.6) {
                    entries_on_disk.push(*e);
                }
            }
        }
        // Found in scan order, not time order.
        let n = entries_on_disk.len();
        for i in 0..n {
            entries_on_disk.swap(i, rng.random_range(i..n));
        }

        let report = replay(
            m.as_mut(),
            entries_on_disk,
            commit_ts,
            HashAlgo::Blake3,
            &mut |p| disk.get(&p).cloned(),
        )
        .unwrap();

        // The contract, LBN by LBN.
        for lbn in 0..LBNS {
            let got = m.lbn_map_lookup(lbn).unwrap().map(|p| {
                let b = disk.get(&p).expect("a mapping names a stored chunk");
                let c = u64::from_le_bytes(b[..8].try_into().unwrap());
                assert_eq!(
                    b,
                    &bytes(c),
                    "seed {seed}: LBN {lbn} maps to damaged PBN {p}"
                );
                c
            });
            let mut allowed = vec![committed.get(&lbn).copied().flatten()];
            for &(w, content) in history.get(&lbn).map(|h| &h[..]).unwrap_or(&[]) {
                if last_flushed.is_some_and(|f| w <= f) {
                    allowed = vec![content]; // a flushed write replaces all before it
                } else {
                    allowed.push(content);
                }
            }
            assert!(
                allowed.contains(&got),
                "seed {seed}: LBN {lbn} reads {got:?}, allowed {allowed:?} (last flush after window {last_flushed:?})"
            );
        }
        // Reference counts: one per LBN, one for the index entry.
        let mut refs: HashMap<Pbn, u32> = HashMap::new();
        for lbn in 0..LBNS {
            if let Some(p) = m.lbn_map_lookup(lbn).unwrap() {
                *refs.entry(p).or_default() += 1;
            }
        }
        for p in 0..PBNS {
            let indexed = disk
                .get(&p)
                .map(|b| HashAlgo::Blake3.fingerprint(b))
                .and_then(|fp| m.hash_index_lookup(&fp).unwrap())
                == Some(p);
            let want = refs.get(&p).copied().unwrap_or(0) + indexed as u32;
            assert_eq!(m.refcount_get(p).unwrap(), want, "seed {seed}: PBN {p}");
        }
        report
    }

    /// The content a write entry stores (looked up by its fingerprint).
    fn content_of(e: &Entry) -> u64 {
        (0..CONTENTS)
            .find(|&c| fp16(c) == e.fp)
            .expect("a known content")
    }

    #[test]
    fn power_cuts_in_an_uncommitted_period_keep_the_crash_contract() {
        let mut total = ReplayReport::default();
        for seed in 0..1500 {
            let r = one_case(seed);
            total.entries += r.entries;
            total.applied += r.applied;
            total.not_written += r.not_written;
            total.already_committed += r.already_committed;
        }
        // The cases reached every branch.
        assert!(total.applied > 1000, "{total:?}");
        assert!(total.not_written > 100, "{total:?}");
        assert!(total.already_committed > 100, "{total:?}");
    }

    #[test]
    fn an_entry_whose_chunk_never_landed_is_ignored_and_one_that_did_applies() {
        let mut m = open_inram();
        let e = |lbn, c, ts| Entry {
            lbn,
            pbn: 5,
            fp: fp16(c),
            timestamp: ts,
        };
        // Mapping persisted, data not: the LBN stays unmapped.
        let r = replay(
            m.as_mut(),
            vec![e(1, 3, 10)],
            0,
            HashAlgo::Blake3,
            &mut |_| None,
        )
        .unwrap();
        assert_eq!((r.applied, r.not_written), (0, 1));
        assert_eq!(m.lbn_map_lookup(1).unwrap(), None);
        // Data persisted, mapping too: applied, counted twice (index, LBN).
        let r = replay(
            m.as_mut(),
            vec![e(1, 3, 10)],
            0,
            HashAlgo::Blake3,
            &mut |_| Some(bytes(3)),
        )
        .unwrap();
        assert_eq!((r.applied, r.chunks_adopted), (1, 1));
        assert_eq!(m.lbn_map_lookup(1).unwrap(), Some(5));
        assert_eq!(m.refcount_get(5).unwrap(), 2);
        // An entry at or before the commit is not applied again.
        let r = replay(
            m.as_mut(),
            vec![e(2, 3, 10)],
            10,
            HashAlgo::Blake3,
            &mut |_| Some(bytes(3)),
        )
        .unwrap();
        assert_eq!(r.already_committed, 1);
        assert_eq!(m.lbn_map_lookup(2).unwrap(), None);
        // Committed metadata already inconsistent (an LBN naming a free
        // block): replay skips the decrement and says so, never fails.
        m.lbn_map_insert(7, 9).unwrap();
        let unmap = Entry {
            lbn: 7,
            pbn: UNMAPPED,
            fp: [0; 16],
            timestamp: 11,
        };
        let r = replay(m.as_mut(), vec![unmap], 10, HashAlgo::Blake3, &mut |_| None).unwrap();
        assert_eq!((r.applied, r.inconsistent), (1, 1));
        assert_eq!(m.lbn_map_lookup(7).unwrap(), None);
    }
}
