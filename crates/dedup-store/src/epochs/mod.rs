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
//!   anything again (what it condemned is never handed out again), and
//!   when an epoch condemned something it holds, pins it at that epoch
//!   and reads the newest epoch again: still the same, the pin was visible
//!   before the next collection began, whose second look sees it. Moved
//!   on, the backups holding it stop, nothing committed (`pinning.rs`).
//! - A backup is committed once its backup object is put and a look at
//!   the epochs after that finds no epoch but the newest condemned what
//!   it holds; else it deletes the object and fails.
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

use std::collections::{BTreeMap, HashMap, HashSet};

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

/// Records `read_epoch_kept` keeps: a collection reads its epoch's, the
/// one before and the one before that.
const RECORDS_KEPT: usize = 8;

/// `read_epoch`, through `kept`: a record is put create-only and never
/// changed, so one read (or written) before is the record, as if read
/// again at that earlier instant. A kept record may have been deleted as
/// old since; a collection asks for the newest record (never old: three
/// newer epochs must exist before one is deleted) and, after its own
/// epoch began, for the one before it, whose list only says which
/// compaction leftovers to finish, after a check that its epoch is still
/// the newest. A record that is gone or does not read is not kept, and
/// asked for again.
pub(crate) fn read_epoch_kept(
    store: &dyn ObjectStore,
    kept: &mut BTreeMap<u64, EpochRecord>,
    epoch: u64,
) -> RepoResult<Option<EpochRecord>> {
    if let Some(record) = kept.get(&epoch) {
        return Ok(Some(record.clone()));
    }
    let record = read_epoch(store, epoch)?;
    if let Some(r) = &record {
        keep_epoch(kept, r.clone());
    }
    Ok(record)
}

/// Keep `record` (read, or just put by this process) among the newest.
pub(crate) fn keep_epoch(kept: &mut BTreeMap<u64, EpochRecord>, record: EpochRecord) {
    kept.insert(record.epoch, record);
    while kept.len() > RECORDS_KEPT {
        kept.pop_first();
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
/// is still held) or deleted as its writer closed. One older than a pin
/// of its writer read here is covered by that one; for the others the
/// pins are listed again and their writers' new ones read, until a round
/// leaves none uncovered. After `ROUNDS` rounds one still uncovered counts as
/// damaged (what it held is unknown).
pub(crate) fn pinned_from(store: &dyn ObjectStore, from: u64, own: &str) -> RepoResult<Pinned> {
    const ROUNDS: usize = 16;
    let mut out = Pinned::default();
    let mut read: HashSet<String> = HashSet::new();
    let mut listed: HashSet<String> = HashSet::new();
    // Each writer's highest pin count read.
    let mut newest_read: HashMap<String, u64> = HashMap::new();
    let covered = |newest_read: &HashMap<String, u64>, name: &str| {
        let (Some(w), Some(k)) = (PinRecord::writer_of(name), PinRecord::count_of(name)) else {
            return false;
        };
        newest_read.get(w).is_some_and(|&read_k| read_k > k)
    };
    // After the first round, only the writers of pins found gone and not
    // covered are read again: a pin put since the first listing began was
    // not visible to this look, and its writer learns so from the epochs.
    let mut wanted: Option<HashSet<String>> = None;
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
            let writer = PinRecord::writer_of(&name);
            if epoch < from || writer == Some(own) {
                read.insert(name);
                continue;
            }
            if wanted
                .as_ref()
                .is_some_and(|w| writer.is_none_or(|writer| !w.contains(writer)))
            {
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
            if let (Some(w), Some(k)) = (PinRecord::writer_of(&name), PinRecord::count_of(&name)) {
                let e = newest_read.entry(w.to_string()).or_insert(k);
                *e = (*e).max(k);
            }
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
        gone.retain(|name| !covered(&newest_read, name));
        if gone.is_empty() {
            break;
        }
        wanted = Some(
            gone.iter()
                .filter_map(|n| PinRecord::writer_of(n))
                .map(str::to_string)
                .collect(),
        );
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
    use std::sync::atomic::{AtomicU64, Ordering};

    type Act = Box<dyn Fn(&LocalDir, &str, u64) -> crate::error::Result<()> + Send + Sync>;

    /// A directory store where other writers act as a collection reads:
    /// `on_get` runs before each read of a pin (with how many reads came
    /// before), `on_list` before each listing (with how many listings).
    struct Scripted {
        dir: LocalDir,
        gets: AtomicU64,
        lists: AtomicU64,
        on_get: Act,
        on_list: Act,
    }

    impl Scripted {
        fn new(dir: &std::path::Path, on_get: Act, on_list: Act) -> Scripted {
            Scripted {
                dir: LocalDir::open(dir).unwrap(),
                gets: AtomicU64::new(0),
                lists: AtomicU64::new(0),
                on_get,
                on_list,
            }
        }
    }

    impl ObjectStore for Scripted {
        fn put(&self, name: &str, bytes: &[u8]) -> crate::error::Result<()> {
            self.dir.put(name, bytes)
        }
        fn get(&self, name: &str) -> crate::error::Result<Vec<u8>> {
            if name.starts_with(PINS_PREFIX) {
                (self.on_get)(&self.dir, name, self.gets.fetch_add(1, Ordering::SeqCst))?;
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
            (self.on_list)(&self.dir, prefix, self.lists.fetch_add(1, Ordering::SeqCst))?;
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

    fn pin(containers: Vec<u64>) -> Vec<u8> {
        PinRecord {
            epoch: 3,
            // A live process elsewhere: never known dead here.
            process: "elsewhere-1-1".into(),
            containers,
            ranges: Vec::new(),
            objects: Vec::new(),
        }
        .encode()
    }

    fn pin_name(writer: u64, k: u64) -> String {
        PinRecord::object_name(3, &format!("{writer:016x}"), k)
    }

    /// Its writer replaces pin `name` (count 0) by its next, holding
    /// `100 + writer` and `containers`.
    fn replace(dir: &LocalDir, name: &str, containers: &[u64]) -> crate::error::Result<()> {
        let w = u64::from_str_radix(PinRecord::writer_of(name).unwrap(), 16).unwrap();
        let mut held = vec![100 + w];
        held.extend_from_slice(containers);
        dir.put(&pin_name(w, 1), &pin(held))?;
        dir.delete(name)
    }

    #[test]
    fn epoch_records_are_read_once_the_newest_kept_and_a_missing_one_asked_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalDir::open(tmp.path()).unwrap();
        let record = |epoch| EpochRecord {
            epoch,
            condemned: vec![epoch * 10],
            ..EpochRecord::default()
        };
        for e in 1..=10 {
            dir.put(&EpochRecord::object_name(e), &record(e).encode())
                .unwrap();
        }
        let mut kept = BTreeMap::new();
        assert_eq!(
            read_epoch_kept(&dir, &mut kept, 1).unwrap(),
            Some(record(1))
        );
        // Kept: deleted since, it is still the record it was.
        dir.delete(&EpochRecord::object_name(1)).unwrap();
        assert_eq!(
            read_epoch_kept(&dir, &mut kept, 1).unwrap(),
            Some(record(1))
        );
        // The newest eight only.
        for e in 2..=10 {
            read_epoch_kept(&dir, &mut kept, e).unwrap();
        }
        assert_eq!(
            kept.keys().copied().collect::<Vec<_>>(),
            (3..=10).collect::<Vec<_>>()
        );
        assert_eq!(read_epoch_kept(&dir, &mut kept, 1).unwrap(), None);
        // Not there yet: not kept as missing.
        assert_eq!(read_epoch_kept(&dir, &mut kept, 11).unwrap(), None);
        dir.put(&EpochRecord::object_name(11), &record(11).encode())
            .unwrap();
        assert_eq!(
            read_epoch_kept(&dir, &mut kept, 11).unwrap(),
            Some(record(11))
        );
    }

    #[test]
    fn a_pin_replaced_between_listing_and_reading_is_found_in_its_successor() {
        let tmp = tempfile::tempdir().unwrap();
        // The first pin read was replaced just before.
        let store = Scripted::new(
            tmp.path(),
            Box::new(|dir, name, n| match n {
                0 => replace(dir, name, &[9]),
                _ => Ok(()),
            }),
            Box::new(|_, _, _| Ok(())),
        );
        store.dir.put(&pin_name(0xaa, 0), &pin(vec![7])).unwrap();
        let pinned = pinned_from(&store, 2, "00000000000000bb").unwrap();
        assert!(
            pinned.holds(0xaa + 100) && pinned.holds(9),
            "the newer pin was not read"
        );
        assert!(pinned.damaged.is_empty());
    }

    /// Writers replacing their pins as fast as a collection lists them:
    /// at every listing a new writer puts its first pin, and every first
    /// pin read is found replaced by its second. Each round used to meet
    /// a new gone pin and list again, until the 16th counted it damaged
    /// (and the collection deleted nothing); only the writers of gone
    /// pins are read again now, and a successor read covers its
    /// predecessor.
    #[test]
    fn writers_replacing_pins_as_fast_as_they_are_listed_do_not_make_them_damaged() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Scripted::new(
            tmp.path(),
            Box::new(|dir, name, _| match PinRecord::count_of(name) {
                Some(0) => replace(dir, name, &[]),
                _ => Ok(()),
            }),
            Box::new(|dir, _, n| dir.put(&pin_name(n, 0), &pin(vec![100 + n]))),
        );
        let pinned = pinned_from(&store, 2, "00000000000000bb").unwrap();
        assert!(pinned.damaged.is_empty(), "{:?}", pinned.damaged);
        assert!(
            pinned.holds(100),
            "the first writer's successor pin was not read"
        );
    }
}
