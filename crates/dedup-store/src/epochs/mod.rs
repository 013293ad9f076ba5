//! Many writers, no lock, no clock: any number of processes on any hosts
//! back up into one repository while `gc` runs beside them, with nothing
//! but create-only puts and read-after-write listings (S3's, and a
//! directory's). The argument why no live segment is deleted is in
//! FORMATS.md ("Many writers: epochs, pins and id ranges"); in short:
//!
//! - A collection *n* condemns what no committed backup and no pin of
//!   epoch ≥ *n*-1 references, and creates `gc/epoch-<n>` holding that
//!   list (`record.rs`). It deletes only what collection *n*-1 condemned
//!   and a listing made after epoch *n* began still finds unreferenced
//!   and unpinned (`gc/collect.rs`).
//! - A writing process applies every epoch's list before it references
//!   anything again (what it does not hold is never handed out again),
//!   and when an epoch condemned something it holds, pins it at that
//!   epoch and reads the newest epoch again: still the same, the pin was
//!   visible before the next collection began, which honours it. Moved on
//!   by two, the backups holding it stop, nothing committed (`pinning.rs`).
//! - A backup is committed once its backup object is put and the newest
//!   epoch is at most one past the one its process had pinned at; if two
//!   collections began in between, it deletes the object and fails.
//! - Container ids come from ranges reserved with create-only puts
//!   (`ids.rs`), pinned before the first id is used.
//!
//! Inside a process, the protection map (`protection.rs`) does the same
//! job under a lock; pins are that map written down for other processes.

pub mod ids;
pub mod record;
mod state;

pub use record::{EpochRecord, PinRecord, EPOCH_PREFIX, PINS_PREFIX};
pub(crate) use state::Epochs;

use std::collections::HashSet;

use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::objects::ObjectStore;

/// The epochs whose records are listed after `after` (all, for `None`),
/// ascending.
pub(crate) fn epochs_after(store: &dyn ObjectStore, after: Option<u64>) -> RepoResult<Vec<u64>> {
    let names = match after {
        None => store.list(EPOCH_PREFIX)?,
        Some(e) => store.list_after(EPOCH_PREFIX, &EpochRecord::object_name(e))?,
    };
    let mut out: Vec<u64> = names
        .iter()
        .filter_map(|n| EpochRecord::epoch_of(n))
        .collect();
    out.sort_unstable();
    if let Some(e) = after {
        out.retain(|&x| x > e);
    }
    Ok(out)
}

/// The newest epoch begun (0: none yet).
pub(crate) fn newest(store: &dyn ObjectStore) -> RepoResult<u64> {
    Ok(epochs_after(store, None)?.last().copied().unwrap_or(0))
}

/// Epoch `epoch`'s record; `None` if it is gone (deleted as old) or does
/// not read: then nothing it condemned is ever deleted (the collection
/// after it cannot read the list either).
pub(crate) fn read_epoch(store: &dyn ObjectStore, epoch: u64) -> RepoResult<Option<EpochRecord>> {
    let name = EpochRecord::object_name(epoch);
    match store.get(&name) {
        Ok(bytes) => Ok(EpochRecord::decode(&name, &bytes).ok()),
        Err(Error::NotFound { .. }) => Ok(None),
        Err(Error::Corrupt { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// What every pin of epoch `from` or later holds, together.
#[derive(Default)]
pub(crate) struct Pinned {
    pub(crate) containers: HashSet<u64>,
    pub(crate) ranges: Vec<(u64, u64)>,
    pub(crate) objects: HashSet<String>,
    /// Pins that did not read: what they hold is unknown.
    pub(crate) damaged: Vec<String>,
    /// Every pin object listed, with its epoch (for expiring old ones).
    pub(crate) all: Vec<(u64, String)>,
}

impl Pinned {
    pub(crate) fn holds(&self, id: u64) -> bool {
        self.containers.contains(&id)
            || self
                .ranges
                .iter()
                .any(|&(start, len)| id >= start && id - start < len)
    }
}

/// Read the pins of epoch `from` or later but those of writer `own`
/// (older ones, and `own`'s, are listed in `all` only: a process's own
/// backups are protected in its protection map).
///
/// A pin listed but gone when read was replaced by its writer's newer pin
/// (put before the older is deleted, and holding all the older held that
/// is still held) or deleted as its writer closed: the pins are listed
/// again and the new ones read, until a round finds none gone. After
/// `ROUNDS` rounds one still gone counts as damaged (what it held is
/// unknown).
pub(crate) fn pinned_from(store: &dyn ObjectStore, from: u64, own: &str) -> RepoResult<Pinned> {
    const ROUNDS: usize = 16;
    let mut out = Pinned::default();
    let mut read: HashSet<String> = HashSet::new();
    let mut listed: HashSet<String> = HashSet::new();
    for round in 1..=ROUNDS {
        let mut gone = Vec::new();
        for name in store.list(PINS_PREFIX)? {
            if read.contains(&name) {
                continue;
            }
            let Some(epoch) = PinRecord::epoch_of(&name) else {
                continue; // not a pin: a stranger's object
            };
            if listed.insert(name.clone()) {
                out.all.push((epoch, name.clone()));
            }
            if epoch < from || PinRecord::writer_of(&name) == Some(own) {
                read.insert(name);
                continue;
            }
            let pin = match store.get(&name) {
                Ok(bytes) => PinRecord::decode(&name, &bytes).ok(),
                Err(Error::NotFound { .. }) => {
                    gone.push(name);
                    continue;
                }
                Err(Error::Corrupt { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            read.insert(name.clone());
            match pin {
                // Its writer was killed on this machine: it holds nothing.
                Some(pin) if crate::process::tag_is_dead_here(&pin.process) => {}
                Some(pin) => {
                    out.containers.extend(pin.containers);
                    out.ranges.extend(pin.ranges);
                    out.objects.extend(pin.objects);
                }
                None => out.damaged.push(name),
            }
        }
        if gone.is_empty() {
            break;
        }
        if round == ROUNDS {
            out.damaged.extend(gone);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalDir;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A directory store whose first read of a pin finds it replaced, as
    /// when its writer puts a newer pin and deletes the older between a
    /// collection's listing and its read.
    struct Replacing {
        dir: LocalDir,
        replaced: AtomicBool,
    }

    impl ObjectStore for Replacing {
        fn put(&self, name: &str, bytes: &[u8]) -> crate::error::Result<()> {
            self.dir.put(name, bytes)
        }
        fn get(&self, name: &str) -> crate::error::Result<Vec<u8>> {
            if name.starts_with(PINS_PREFIX) && !self.replaced.swap(true, Ordering::SeqCst) {
                self.dir.put(&pin_name(1), &pin(vec![7, 9]).encode())?;
                self.dir.delete(name)?;
            }
            self.dir.get(name)
        }
        fn get_range(&self, name: &str, offset: u64, len: u64) -> crate::error::Result<Vec<u8>> {
            self.dir.get_range(name, offset, len)
        }
        fn get_tail(&self, name: &str, len: u64) -> crate::error::Result<Vec<u8>> {
            self.dir.get_tail(name, len)
        }
        fn list(&self, prefix: &str) -> crate::error::Result<Vec<String>> {
            self.dir.list(prefix)
        }
        fn size(&self, name: &str) -> crate::error::Result<u64> {
            self.dir.size(name)
        }
        fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
            self.dir.segment_hash()
        }
        fn delete(&self, name: &str) -> crate::error::Result<()> {
            self.dir.delete(name)
        }
    }

    fn pin(containers: Vec<u64>) -> PinRecord {
        PinRecord {
            epoch: 3,
            // A live process elsewhere: never known dead here.
            process: "elsewhere-1-1".into(),
            containers,
            ranges: Vec::new(),
            objects: Vec::new(),
        }
    }

    fn pin_name(k: u64) -> String {
        PinRecord::object_name(3, "00000000000000aa", k)
    }

    #[test]
    fn a_pin_replaced_between_listing_and_reading_is_found_in_its_successor() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Replacing {
            dir: LocalDir::open(tmp.path()).unwrap(),
            replaced: AtomicBool::new(false),
        };
        store.dir.put(&pin_name(0), &pin(vec![7]).encode()).unwrap();
        let pinned = pinned_from(&store, 2, "00000000000000bb").unwrap();
        assert!(
            pinned.holds(7) && pinned.holds(9),
            "the newer pin was not read"
        );
        assert!(pinned.damaged.is_empty());
    }
}
