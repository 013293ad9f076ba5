//! The segments a session's lookups found, kept for the appends that
//! follow them (a client pipelines several lookups ahead of its appends).
//! An append that names a segment found here takes it as found, without
//! asking the index again: with a sampled index, a segment found through
//! a prefetched catalog may not be found once that catalog has left the
//! cache, and the client, told the segment was there, did not send it.
//!
//! The newest `limit` hits are kept, the oldest dropped first: the appends
//! still to come are those of the latest lookups. (Dropping every hit at
//! the limit, as this did before, could drop those of lookups whose
//! appends had not arrived yet.)

use std::collections::{HashMap, VecDeque};

use crate::recipe::SegmentRef;

pub(crate) struct Found {
    /// Each hit with the number of its newest insertion.
    hits: HashMap<[u8; 32], (SegmentRef, u64)>,
    /// Insertions, oldest first.
    order: VecDeque<([u8; 32], u64)>,
    next: u64,
    limit: usize,
}

impl Found {
    pub(crate) fn new(limit: usize) -> Found {
        Found {
            hits: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            limit: limit.max(1),
        }
    }

    pub(crate) fn insert(&mut self, fp: [u8; 32], r: SegmentRef) {
        self.next += 1;
        self.hits.insert(fp, (r, self.next));
        self.order.push_back((fp, self.next));
        while self.order.len() > self.limit {
            let Some((old, n)) = self.order.pop_front() else {
                break;
            };
            // Only if not found again since (then a newer insertion keeps it).
            if self.hits.get(&old).is_some_and(|&(_, k)| k == n) {
                self.hits.remove(&old);
            }
        }
    }

    pub(crate) fn get(&self, fp: &[u8; 32]) -> Option<SegmentRef> {
        self.hits.get(fp).map(|&(r, _)| r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dedup_common::fingerprint::Fingerprint;

    fn fp(i: u32) -> [u8; 32] {
        let mut f = [0u8; 32];
        f[..4].copy_from_slice(&i.to_le_bytes());
        f
    }

    fn at(i: u32) -> SegmentRef {
        SegmentRef::new(u64::from(i), i, 4096, &Fingerprint(fp(i)))
    }

    #[test]
    fn the_newest_hits_are_kept_and_the_oldest_dropped_first() {
        let mut found = Found::new(100);
        for i in 0..250 {
            found.insert(fp(i), at(i));
        }
        assert!((0..150).all(|i| found.get(&fp(i)).is_none()));
        assert!((150..250).all(|i| found.get(&fp(i)) == Some(at(i))));
        assert!(found.order.len() <= 100 && found.hits.len() <= 100);
    }

    #[test]
    fn a_hit_found_again_is_as_new_as_its_last_lookup() {
        let mut found = Found::new(3);
        found.insert(fp(1), at(1));
        found.insert(fp(2), at(2));
        found.insert(fp(1), at(1)); // looked up again
        found.insert(fp(3), at(3)); // drops the first insertion of 1 only
        found.insert(fp(4), at(4)); // drops 2
        assert_eq!(found.get(&fp(1)), Some(at(1)));
        assert_eq!(found.get(&fp(2)), None);
        assert!(found.get(&fp(3)).is_some() && found.get(&fp(4)).is_some());
    }
}
