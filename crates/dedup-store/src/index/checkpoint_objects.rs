//! Where a repository keeps its index checkpoint (§3.2.3), so that opening
//! a large store reads its hooks from one object instead of every
//! container's catalog.
//!
//! Object `index/hooks-<covered>`: the index's checkpoint bytes (see
//! FORMATS.md, "Index checkpoint"), taken when no backup was running, so
//! it knows every container whose id is below `covered` (16 hex digits).
//! An open loads the newest one that loads and reads only the catalogs of
//! containers from `covered` up. The checkpoint is a hint: a damaged,
//! stale or missing one only costs a rebuild from the catalogs, and hooks
//! naming containers GC deleted since are answered by nothing (every hint
//! is confirmed against a catalog).
//!
//! This file keeps the checkpoint objects; their bytes are `checkpoint.rs`'s.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::index::seam::SegmentIndex;
use crate::index::{IndexConfig, SampledSegmentIndex};
use crate::objects::ObjectStore;

pub const INDEX_PREFIX: &str = "index/hooks-";

fn name(covered: u64) -> String {
    format!("{INDEX_PREFIX}{covered:016x}")
}

/// Checkpoints as listed: `covered` and object name, newest first.
pub(crate) type Listed = Vec<(u64, String)>;

/// The checkpoints in `store`, newest (highest `covered`) first.
pub(crate) fn checkpoints(store: &dyn ObjectStore) -> Listed {
    let mut found: Vec<_> = store
        .list(INDEX_PREFIX)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| {
            let hex = n.strip_prefix(INDEX_PREFIX)?;
            let covered = u64::from_str_radix(hex, 16).ok()?;
            // Past the highest id a repository hands out: not ours.
            let ours = covered <= crate::index::hooks::MAX_CONTAINER + 1;
            (hex.len() == 16 && ours).then_some((covered, n))
        })
        .collect();
    found.sort_unstable_by(|a, b| b.cmp(a));
    found
}

/// The highest `covered` of any checkpoint in `store`: container ids below
/// it were handed out once, so a writable open never hands them out again
/// (a stale hook into a reused id would cost dedup, and a checkpoint that
/// covers a reused id would hide the new container from the index).
pub(crate) fn highest_covered(listed: &Listed) -> u64 {
    listed.first().map_or(0, |(covered, _)| *covered)
}

/// An index made at open, and the container ids below which it already
/// knows every catalog (from a checkpoint; 0 for none).
pub(crate) struct Opened {
    pub(crate) index: Box<dyn SegmentIndex>,
    pub(crate) covered: u64,
    /// The checkpoint it was loaded from, if any (`Saved::of`).
    pub(crate) saved: Option<Saved>,
    /// The checkpoints listed to find it (`None`: not listed), which the
    /// open needs again (`highest_covered`) and a save deletes: one
    /// listing serves all three.
    pub(crate) listed: Option<Listed>,
}

/// A checkpoint object's `covered` and its bytes' digest: a handle that
/// would save the same again (a backup of unchanged data adds no hook)
/// sends nothing, where it sent a put, a delete, a put again and a
/// listing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Saved {
    covered: u64,
    digest: [u8; 32],
}

impl Saved {
    pub(crate) fn of(covered: u64, bytes: &[u8]) -> Saved {
        Saved {
            covered,
            digest: *blake3::hash(bytes).as_bytes(),
        }
    }
}

/// A sampled index from the newest checkpoint in `store` that loads, or
/// an empty one (the open then reads every catalog).
pub(crate) fn load(store: Arc<dyn ObjectStore>, config: IndexConfig) -> Opened {
    let listed = checkpoints(&*store);
    for (covered, name) in &listed {
        let Ok(bytes) = store.get(name) else {
            continue;
        };
        if let Ok(index) = SampledSegmentIndex::from_checkpoint(store.clone(), &bytes, config) {
            return Opened {
                index: Box::new(index),
                covered: *covered,
                saved: Some(Saved::of(*covered, &bytes)),
                listed: Some(listed),
            };
        }
    }
    Opened {
        index: Box::new(SampledSegmentIndex::new(store, config)),
        covered: 0,
        saved: None,
        listed: Some(listed),
    }
}

/// The figures of the newest checkpoint that loads (hooks, R, their RAM),
/// read without a writer's lock, for `dedup store stats`.
pub fn newest_figures(store: &dyn ObjectStore) -> Option<crate::index::Figures> {
    // A budget that never halves R: report the checkpoint as it is.
    let config = IndexConfig {
        index_memory: 1 << 50,
        cache_entries: 0,
        ..IndexConfig::default()
    };
    checkpoints(store).into_iter().find_map(|(_, name)| {
        let bytes = store.get(&name).ok()?;
        Some(
            crate::index::Index::from_checkpoint(&bytes, config)
                .ok()?
                .figures(),
        )
    })
}

/// Save checkpoint `bytes` of an index that knows every container below
/// `covered`, and drop the older checkpoints in `known` (what the handle
/// listed at open, and saved since; one another writer saved meanwhile
/// is left for the next writer that lists it): `known` is then this one.
pub(crate) fn save(
    store: &dyn ObjectStore,
    covered: u64,
    bytes: &[u8],
    known: &mut Listed,
) -> Result<()> {
    let object = name(covered);
    match store.put(&object, bytes) {
        Ok(()) => {}
        // Same containers, but GC may have changed the hooks since:
        // replace it (losing it to a crash in between costs a rebuild).
        Err(Error::Exists { .. }) => {
            store.delete(&object)?;
            store.put(&object, bytes)?;
        }
        Err(e) => return Err(e),
    }
    for (older, stale) in known.iter() {
        if *older < covered {
            match store.delete(stale) {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    known.retain(|(older, _)| *older > covered);
    known.push((covered, object));
    known.sort_unstable_by(|a, b| b.cmp(a));
    Ok(())
}
