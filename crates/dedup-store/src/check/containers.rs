//! Checking containers, one object at a time: without `data`, the catalog
//! (trailer and catalog checksums, two ranged reads) and the header (one
//! more), so every byte but the segment bodies is checked; with `data`,
//! the whole container in one read, and every segment's crc32c, and its
//! BLAKE3 after decompressing, against its catalog entry.
//!
//! A damaged catalog or trailer costs every backup that references the
//! container; a damaged segment only those that reference that entry; a
//! damaged header none (restores find segments through the catalog).

use std::collections::BTreeMap;

use crate::container::{compacted_name, container_name, Catalog, Container};
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo::CONTAINERS_PREFIX;

use super::backups::tick;
use super::{store_detail, CheckOptions, CheckPhase, CheckProgress, CheckReport};

/// What the references check needs to know of one container: not its
/// catalog, which the references check reads again when a recipe needs it
/// (holding every catalog was the whole store's fingerprints in RAM, about
/// 64 bytes a segment: 17 GB for a TiB stored).
pub(super) enum ContainerState {
    /// The catalog reads; `bad_segments` maps an entry that failed its data
    /// check to its problem.
    Readable { bad_segments: BTreeMap<u32, usize> },
    /// The container as a whole is damaged: this problem.
    Damaged(usize),
}

/// Check every container listed; the state of each well-named one by id.
pub(super) fn check_containers(
    store: &dyn ObjectStore,
    objects: &[String],
    opts: CheckOptions,
    report: &mut CheckReport,
    progress: &dyn Fn(CheckProgress),
) -> BTreeMap<u64, ContainerState> {
    let mut out = BTreeMap::new();
    for (done, object) in objects.iter().enumerate() {
        match container_id(object) {
            Some(id) => {
                report.counts.containers += 1;
                let state = if opts.data {
                    check_data(store, id, report)
                } else {
                    check_catalog(store, id, report)
                };
                out.insert(id, state);
            }
            None => {
                // Nothing could find it by id, so no backup can need it.
                report.problem(
                    object,
                    "not a container name (containers/ and 16 lower-case hex digits)",
                );
            }
        }
        tick(progress, CheckPhase::Containers, done, objects.len());
    }
    out
}

/// The id a well-formed container name holds: exactly what
/// `container_name` makes of it, so no two names mean one id.
fn container_id(object: &str) -> Option<u64> {
    let hex = object.strip_prefix(CONTAINERS_PREFIX)?;
    let id = u64::from_str_radix(hex, 16).ok()?;
    (container_name(id) == object).then_some(id)
}

fn check_catalog(store: &dyn ObjectStore, id: u64, report: &mut CheckReport) -> ContainerState {
    let name = container_name(id);
    let catalog = match Catalog::read(store, id) {
        Ok(c) => c,
        Err(e) => return ContainerState::Damaged(report.problem(&name, store_detail(&e))),
    };
    if let Err(e) = catalog.check_header(store) {
        header_problem(&name, &e, report);
    }
    report.counts.bytes_stored += catalog.container_len();
    readable(&catalog, report, BTreeMap::new())
}

fn check_data(store: &dyn ObjectStore, id: u64, report: &mut CheckReport) -> ContainerState {
    let name = container_name(id);
    // The compacted version, if a crash left only that (as restores do).
    let read = match store.get(&name) {
        Err(Error::NotFound { .. }) => store.get(&compacted_name(id)).map_err(|e| match e {
            Error::NotFound { .. } => Error::NotFound { name: name.clone() },
            e => e,
        }),
        other => other,
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) => return ContainerState::Damaged(report.problem(&name, store_detail(&e))),
    };
    report.counts.bytes_stored += bytes.len() as u64;
    let container = match Container::parse_structure(&name, bytes) {
        Ok(c) => c.hashed_with(store.segment_hash()),
        Err(e) => return check_data_through_catalog(store, id, &e, report),
    };
    let catalog = container.catalog();
    if catalog.container_id() != id {
        let d = format!("it holds container id {:#x}", catalog.container_id());
        return ContainerState::Damaged(report.problem(&name, d));
    }
    // Checks crc32c, decompresses, and compares BLAKE3 with the entry.
    let bad = verify_segments(&name, catalog, |i| container.segment(i), report);
    readable(catalog, report, bad)
}

/// The container as a whole did not parse. If its catalog still reads, the
/// damage is outside what restores read (the header: `Catalog::read` checks
/// everything else `parse_structure` does), so it costs no backup by
/// itself; the segments are then verified one ranged read each, which only
/// such a container pays for.
fn check_data_through_catalog(
    store: &dyn ObjectStore,
    id: u64,
    parse_error: &Error,
    report: &mut CheckReport,
) -> ContainerState {
    let name = container_name(id);
    let Ok(catalog) = Catalog::read(store, id) else {
        return ContainerState::Damaged(report.problem(&name, store_detail(parse_error)));
    };
    header_problem(&name, parse_error, report);
    let bad = verify_segments(&name, &catalog, |i| catalog.read_segment(store, i), report);
    readable(&catalog, report, bad)
}

/// Damage restores do not read (they find segments through the catalog):
/// named, but costing no backup.
fn header_problem(name: &str, e: &Error, report: &mut CheckReport) {
    let d = format!(
        "{} (restores do not read the header; rewriting the container would refuse it)",
        store_detail(e)
    );
    report.problem(name, d);
}

/// Verify every segment `read` returns (it checks crc32c, then BLAKE3 after
/// decompressing); the failed ones' problems by entry.
fn verify_segments(
    name: &str,
    catalog: &Catalog,
    read: impl Fn(usize) -> crate::error::Result<Vec<u8>>,
    report: &mut CheckReport,
) -> BTreeMap<u32, usize> {
    let mut bad = BTreeMap::new();
    for (i, entry) in catalog.entries().iter().enumerate() {
        // Removed by a compaction: nothing is stored to verify (a
        // reference to it is damage, which the references check names).
        if entry.is_absent() {
            continue;
        }
        if let Err(e) = read(i) {
            let p = report.problem(name, format!("catalog entry {i}: {}", store_detail(&e)));
            bad.insert(i as u32, p);
        }
    }
    bad
}

/// Count a container whose catalog reads and keep what references need.
fn readable(
    catalog: &Catalog,
    report: &mut CheckReport,
    bad_segments: BTreeMap<u32, usize>,
) -> ContainerState {
    report.counts.segments += catalog.entries().len() as u64;
    ContainerState::Readable { bad_segments }
}

#[cfg(test)]
mod tests {
    use super::container_id;

    #[test]
    fn only_what_container_name_makes_is_a_container_name() {
        assert_eq!(container_id("containers/00000000000000a3"), Some(0xa3));
        for bad in [
            "containers/00000000000000A3",
            "containers/a3",
            "containers/000000000000000a3",
            "containers/+0000000000000a3",
            "containers/00000000000000a3/x",
            "containers/",
        ] {
            assert_eq!(container_id(bad), None, "{bad}");
        }
    }
}
