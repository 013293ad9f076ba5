//! The compaction candidates (`gc/candidates-<generation>`): containers
//! that lost entries since a collection last looked at them, kept until
//! they are compacted, swept, or found wholly live. A candidate a
//! collection looked at but did not compact (its live share was not
//! below that collection's threshold, or `--compact-below 0` compacted
//! nothing) keeps the live share found, so a later collection with a
//! higher threshold compacts it, and one with the same threshold skips it
//! without reading its catalog. The share changes only when marks do,
//! and a container whose marks change is added again with no share.
//!
//! Body after the frame (magic `DDUPCAND`): count n (u64), then n ×
//! container id (u64) in version 1 (still read: no share known), or n ×
//! (id u64, live share u16 in ten-thousandths rounded down, `0xffff` for
//! not looked at yet) in version 2.

use std::collections::BTreeMap;

use crate::error::repo::{RepoError, RepoResult};
use crate::framed::{frame, unframe_any, Reader};
use crate::repo::Repository;

pub const CANDIDATES_PREFIX: &str = "gc/candidates-";
const MAGIC: [u8; 8] = *b"DDUPCAND";
const VERSION: u32 = 2;
const UNKNOWN: u16 = u16::MAX;
/// Shares are kept in ten-thousandths.
pub(super) const SHARE_SCALE: u64 = 10_000;

/// Container id → the live share (ten-thousandths, rounded down) the
/// last look found, `None` if not looked at since it lost entries.
pub(super) type CandidateIds = BTreeMap<u64, Option<u16>>;

/// Saved compaction candidates and the objects that held them.
pub(super) struct Candidates {
    pub ids: CandidateIds,
    pub objects: Vec<String>,
    next_generation: u64,
}

impl Repository {
    pub(super) fn load_candidates(&self) -> RepoResult<Candidates> {
        let mut c = Candidates {
            ids: BTreeMap::new(),
            objects: Vec::new(),
            next_generation: 0,
        };
        for object in self.store.list(CANDIDATES_PREFIX)? {
            let generation = object
                .strip_prefix(CANDIDATES_PREFIX)
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            if let Some(g) = generation {
                c.next_generation = c.next_generation.max(g + 1);
            }
            // Damaged: only a missed compaction, never a lost segment.
            if let Ok(ids) = self
                .store
                .get(&object)
                .map_err(RepoError::from)
                .and_then(|b| decode(&object, &b))
            {
                for (id, share) in ids {
                    // Two objects (a crash between put and delete): the
                    // unknown share wins, so it is looked at again.
                    let slot = c.ids.entry(id).or_insert(share);
                    if share.is_none() {
                        *slot = None;
                    }
                }
            }
            c.objects.push(object);
        }
        Ok(c)
    }

    /// Replace the saved candidates with `ids` (put new, delete old).
    pub(super) fn save_candidates(&self, c: &mut Candidates, ids: &CandidateIds) -> RepoResult<()> {
        let old = std::mem::take(&mut c.objects);
        if !ids.is_empty() {
            let object = format!("{CANDIDATES_PREFIX}{:016x}", c.next_generation);
            self.store.put(&object, &encode(ids))?;
            c.next_generation += 1;
            c.objects.push(object);
        }
        for object in old {
            self.delete_if_there(&object)?;
        }
        c.ids = ids.clone();
        Ok(())
    }
}

fn encode(ids: &CandidateIds) -> Vec<u8> {
    let mut body = Vec::with_capacity(8 + 10 * ids.len());
    body.extend_from_slice(&(ids.len() as u64).to_le_bytes());
    for (id, share) in ids {
        body.extend_from_slice(&id.to_le_bytes());
        body.extend_from_slice(&share.unwrap_or(UNKNOWN).to_le_bytes());
    }
    frame(MAGIC, VERSION, &body)
}

fn decode(object: &str, bytes: &[u8]) -> RepoResult<Vec<(u64, Option<u16>)>> {
    let (version, body) = unframe_any(object, MAGIC, 1..=VERSION, bytes)?;
    let mut r = Reader::new(object, body);
    let n = r.u64()?;
    let each = if version == 1 { 8 } else { 10 };
    if n.checked_mul(each) != Some(body.len() as u64 - 8) {
        return Err(RepoError::corrupt(
            object,
            "count does not match its length",
        ));
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let id = r.u64()?;
        let share = if version == 1 { UNKNOWN } else { r.u16()? };
        out.push((id, (share != UNKNOWN).then_some(share)));
    }
    r.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_round_trip_and_version_1_reads_as_not_looked_at() {
        let ids: CandidateIds = [(3, None), (9, Some(7_500)), (12, Some(0))].into();
        let name = format!("{CANDIDATES_PREFIX}{:016x}", 1);
        let back: CandidateIds = decode(&name, &encode(&ids)).unwrap().into_iter().collect();
        assert_eq!(back, ids);
        let mut v1 = 2u64.to_le_bytes().to_vec();
        v1.extend_from_slice(&4u64.to_le_bytes());
        v1.extend_from_slice(&5u64.to_le_bytes());
        let old = decode(&name, &frame(MAGIC, 1, &v1)).unwrap();
        assert_eq!(old, vec![(4, None), (5, None)]);
    }
}
