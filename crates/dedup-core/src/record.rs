//! The engine's private record (dm-dedup's private data): words the
//! metadata store keeps for the engine and commits atomically with its
//! tables. The store never looks inside.
//!
//! Layout: `[MAGIC2, lbns_mapped, hash_entries, awaiting_gc, n, counters
//! (n words), placement words...]`. The first layout (`MAGIC`) had no
//! `awaiting_gc`: the engine counts it at open. Records written before the
//! record had a layout hold only the counters, followed by the placement's
//! words (thin's clock); they carry no totals, and the engine counts them
//! at open.

/// "DDREC" and a version; no counter of a device ever reaches it.
const MAGIC: u64 = u64::from_le_bytes(*b"DDREC\x01\xfe\xff");
/// The second version: `awaiting_gc` after the totals.
const MAGIC2: u64 = u64::from_le_bytes(*b"DDREC\x02\xfe\xff");

/// What the engine keeps in the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Mapped LBNs and hash index entries, as of the commit; `None` for a
    /// record of the older layout.
    pub totals: Option<Totals>,
    /// Chunks held by the hash index alone (count 1, no LBN: garbage for
    /// the next collection), as of the commit; `None` for older records.
    pub awaiting_gc: Option<u64>,
    /// The engine's counters (`stats::Counters`).
    pub counters: Vec<u64>,
    /// The placement's own words (see `Placement::record`).
    pub placement: Vec<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub lbns_mapped: u64,
    pub hash_entries: u64,
}

impl Record {
    pub fn encode(&self) -> Vec<u64> {
        let t = self.totals.unwrap_or_default();
        let mut w = Vec::with_capacity(5 + self.counters.len() + self.placement.len());
        w.extend([
            MAGIC2,
            t.lbns_mapped,
            t.hash_entries,
            self.awaiting_gc.unwrap_or(0),
            self.counters.len() as u64,
        ]);
        w.extend(&self.counters);
        w.extend(&self.placement);
        w
    }

    /// Read `words`; a record of the older layout ends with
    /// `legacy_placement_words` words of the placement's.
    pub fn decode(words: &[u64], legacy_placement_words: usize) -> Record {
        if words.len() >= 5 && words[0] == MAGIC2 {
            let n = (words[4] as usize).min(words.len() - 5);
            return Record {
                totals: Some(Totals {
                    lbns_mapped: words[1],
                    hash_entries: words[2],
                }),
                awaiting_gc: Some(words[3]),
                counters: words[5..5 + n].to_vec(),
                placement: words[5 + n..].to_vec(),
            };
        }
        if words.len() >= 4 && words[0] == MAGIC {
            let n = (words[3] as usize).min(words.len() - 4);
            return Record {
                totals: Some(Totals {
                    lbns_mapped: words[1],
                    hash_entries: words[2],
                }),
                awaiting_gc: None,
                counters: words[4..4 + n].to_vec(),
                placement: words[4 + n..].to_vec(),
            };
        }
        let split = words.len().saturating_sub(legacy_placement_words);
        Record {
            totals: None,
            awaiting_gc: None,
            counters: words[..split].to_vec(),
            placement: words[split..].to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_the_older_layout() {
        let r = Record {
            totals: Some(Totals {
                lbns_mapped: 5,
                hash_entries: 3,
            }),
            awaiting_gc: Some(2),
            counters: vec![1, 2, 3],
            placement: vec![42],
        };
        // The first layout: no awaiting_gc.
        let first = [MAGIC, 5, 3, 1, 9, 42];
        let d = Record::decode(&first, 0);
        assert_eq!((d.totals, d.awaiting_gc), (r.totals, None));
        assert_eq!((d.counters, d.placement), (vec![9], vec![42]));
        assert_eq!(Record::decode(&r.encode(), 1), r);
        assert_eq!(Record::decode(&r.encode(), 0), r);
        let old = Record::decode(&[1, 2, 3, 42], 1);
        assert_eq!(old.totals, None);
        assert_eq!(old.counters, vec![1, 2, 3]);
        assert_eq!(old.placement, vec![42]);
        assert_eq!(Record::decode(&[], 1), Record::default());
        // A damaged length cannot reach past the record.
        let mut bad = r.encode();
        bad[4] = u64::MAX;
        assert_eq!(Record::decode(&bad, 0).counters, vec![1, 2, 3, 42]);
    }
}
