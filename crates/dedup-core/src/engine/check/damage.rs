//! Table blocks a store found failing their checksum (`LostBlock`): how
//! check reports them, the logical ranges lost with the LBN map, and the
//! fingerprints repair rebuilds by hashing the chunks the LBN map names.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::{LostRange, ReadChunk, Seen};
use crate::backend::{Held, LostBlock, MetadataBackend};
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::Result;
use crate::fingerprint::Fingerprint;

/// One line for the check report: the block, what it held, what repair does.
pub(super) fn describe(cfg: &DeviceConfig, l: &LostBlock) -> String {
    let what = match &l.held {
        Held::Mappings(lbns) => {
            let r = lost_range(cfg, l, lbns);
            format!(
                "the mappings of LBNs {} to {} (bytes {} to {}) are lost; repair unmaps them, so they read as zeros",
                r.first_lbn,
                r.last_lbn,
                r.offset,
                r.offset + r.length - 1
            )
        }
        Held::Counts(pbns) => format!(
            "it held the reference counts of PBNs {} to {}; repair rebuilds them from the LBN map",
            pbns.start,
            pbns.end.saturating_sub(1)
        ),
        Held::Fingerprints(pbns) => format!(
            "it held fingerprints of chunks among PBNs {} to {}; repair hashes the chunks the LBN map names to index them again",
            pbns.start,
            pbns.end.saturating_sub(1)
        ),
        Held::Summary => "it summarized other tables, and was rebuilt from them".to_string(),
    };
    format!("{} block {} fails its checksum: {what}", l.table, l.block)
}

/// The logical range a damaged LBN-map block covered.
pub(super) fn lost_range(cfg: &DeviceConfig, l: &LostBlock, lbns: &Range<Lbn>) -> LostRange {
    let cs = cfg.chunk_size as u64;
    LostRange {
        table: l.table.to_string(),
        block: l.block,
        first_lbn: lbns.start,
        last_lbn: lbns.end.saturating_sub(1),
        offset: lbns.start * cs,
        length: (lbns.end - lbns.start) * cs,
    }
}

/// The chunks the LBN map names whose fingerprints were in a lost block
/// and that no index entry names now, hashed: the entries to add. A chunk
/// whose bytes another indexed chunk holds too stays mapped but
/// unindexed (an index holds each fingerprint once). Marks those kept in
/// `seen`, so the counts repair sets include their index reference.
pub(super) fn rehash_lost(
    cfg: &DeviceConfig,
    store: &mut dyn MetadataBackend,
    lost: &[LostBlock],
    seen: &mut HashMap<Pbn, Seen>,
    read_chunk: ReadChunk,
    chunk: &mut [u8],
) -> Result<Vec<(Fingerprint, Pbn)>> {
    let ranges: Vec<&Range<Pbn>> = lost
        .iter()
        .filter_map(|l| match &l.held {
            Held::Fingerprints(r) => Some(r),
            _ => None,
        })
        .collect();
    let mut pbns: Vec<Pbn> = seen
        .iter()
        .filter(|(p, e)| {
            e.lbn_refs > 0 && e.index_count == 0 && ranges.iter().any(|r| r.contains(p))
        })
        .map(|(&p, _)| p)
        .collect();
    pbns.sort_unstable();
    let mut planned = HashSet::new();
    let mut add = Vec::new();
    for pbn in pbns {
        if let Err(e) = read_chunk(pbn, chunk) {
            tracing::warn!(
                "PBN {pbn} cannot be read to rebuild its fingerprint ({e}); it stays unindexed"
            );
            continue;
        }
        let fp = cfg.hash.fingerprint(chunk);
        if planned.contains(&fp) || store.hash_index_lookup(&fp)?.is_some() {
            continue;
        }
        planned.insert(fp);
        if let Some(e) = seen.get_mut(&pbn) {
            e.kept = true;
        }
        add.push((fp, pbn));
    }
    Ok(add)
}
