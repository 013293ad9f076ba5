//! The engine's private record (dm-dedup's private data): words the
//! metadata store keeps for the engine and commits atomically with its
//! tables. The store never looks inside.
//!
//! Layout: `[MAGIC, lbns_mapped, hash_entries, n, counters (n words),
//! placement words...]`. Records written before the record had a layout
//! hold only the counters, followed by the placement's words (thin's
//! clock); they carry no totals, and the engine counts them at open.

/// "DDREC" and a version; no counter of a device ever reaches it.
const MAGIC: u64 = u64::from_le_bytes(*b"DDREC\x01\xfe\xff");

/// What the engine keeps in the record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Mapped LBNs and hash index entries, as of the commit; `None` for a
    /// record of the older layout.
    pub totals: Option<Totals>,
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
        let mut w = Vec::with_capacity(4 + self.counters.len() + self.placement.len());
        w.extend([
            MAGIC,
            t.lbns_mapped,
            t.hash_entries,
            self.counters.len() as u64,
        ]);
        w.extend(&self.counters);
        w.extend(&self.placement);
        w
    }

    /// Read `words`; a record of the older layout ends with
    /// `legacy_placement_words` words of the placement's.
    pub fn decode(words: &[u64], legacy_placement_words: usize) -> Record {
        if words.len() >= 4 && words[0] == MAGIC {
            let n = (words[3] as usize).min(words.len() - 4);
            return Record {
                totals: Some(Totals {
                    lbns_mapped: words[1],
                    hash_entries: words[2],
                }),
                counters: words[4..4 + n].to_vec(),
                placement: words[4 + n..].to_vec(),
            };
        }
        let split = words.len().saturating_sub(legacy_placement_words);
        Record {
            totals: None,
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
            counters: vec![1, 2, 3],
            placement: vec![42],
        };
        assert_eq!(Record::decode(&r.encode(), 1), r);
        assert_eq!(Record::decode(&r.encode(), 0), r);
        let old = Record::decode(&[1, 2, 3, 42], 1);
        assert_eq!(old.totals, None);
        assert_eq!(old.counters, vec![1, 2, 3]);
        assert_eq!(old.placement, vec![42]);
        assert_eq!(Record::decode(&[], 1), Record::default());
        // A damaged length cannot reach past the record.
        let mut bad = r.encode();
        bad[3] = u64::MAX;
        assert_eq!(Record::decode(&bad, 0).counters, vec![1, 2, 3, 42]);
    }
}
