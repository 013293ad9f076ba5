//! Checking containers, one object at a time: without `data`, the catalog
//! (trailer and catalog checksums, two ranged reads) and the header (one
//! more), so every byte but the segment bodies is checked; with `data`,
//! the whole container in one read, and every segment's crc32c, and its
//! BLAKE3 after decompressing, against its catalog entry.

use std::collections::BTreeMap;

use crate::container::{container_name, Catalog, Container};
use crate::format::Entry;
use crate::objects::ObjectStore;
use crate::repo::CONTAINERS_PREFIX;

use super::backups::tick;
use super::{store_detail, CheckOptions, CheckPhase, CheckProgress, CheckReport};

/// What the references check needs to know of one container.
pub(super) enum ContainerState {
    /// The catalog reads; `bad_segments` maps an entry that failed its data
    /// check to its problem.
    Readable {
        entries: Vec<Entry>,
        bad_segments: BTreeMap<u32, usize>,
    },
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
    let read = Catalog::read(store, id).and_then(|c| c.check_header(store).map(|()| c));
    match read {
        Ok(catalog) => {
            report.counts.segments += catalog.entries().len() as u64;
            report.counts.bytes_stored += catalog.container_len();
            ContainerState::Readable {
                entries: catalog.entries().to_vec(),
                bad_segments: BTreeMap::new(),
            }
        }
        Err(e) => ContainerState::Damaged(report.problem(&name, store_detail(&e))),
    }
}

fn check_data(store: &dyn ObjectStore, id: u64, report: &mut CheckReport) -> ContainerState {
    let name = container_name(id);
    let bytes = match store.get(&name) {
        Ok(bytes) => bytes,
        Err(e) => return ContainerState::Damaged(report.problem(&name, store_detail(&e))),
    };
    report.counts.bytes_stored += bytes.len() as u64;
    let container = match Container::parse_structure(&name, bytes) {
        Ok(c) => c,
        Err(e) => return ContainerState::Damaged(report.problem(&name, store_detail(&e))),
    };
    let catalog = container.catalog();
    if catalog.container_id() != id {
        let d = format!("it holds container id {:#x}", catalog.container_id());
        return ContainerState::Damaged(report.problem(&name, d));
    }
    report.counts.segments += catalog.entries().len() as u64;
    let mut bad_segments = BTreeMap::new();
    for i in 0..catalog.entries().len() {
        // Checks crc32c, decompresses, and compares BLAKE3 with the entry.
        if let Err(e) = container.segment(i) {
            let p = report.problem(&name, format!("catalog entry {i}: {}", store_detail(&e)));
            bad_segments.insert(i as u32, p);
        }
    }
    ContainerState::Readable {
        entries: catalog.entries().to_vec(),
        bad_segments,
    }
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
