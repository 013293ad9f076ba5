//! `Repository`: a deduplicating backup store in a local directory or an
//! S3 bucket (`RepoLocation`): its config, containers, recipes and backups
//! as objects behind the seam (`LocalDir`, `S3Store`), and a fingerprint
//! index rebuilt from the containers' catalogs at open.
//!
//! One handle is shared by every backup, restore and GC of the process
//! (`&self` throughout, `Send + Sync`): the paper's single server owning
//! the store, with its Segment Manager (index, catalogs, container ids,
//! protection map) behind short locks rather than one repository-wide
//! lock. Another process may open the repository read-only (list,
//! restore, check) at any time; only one process opens it to write, which
//! is what `dedup store serve` is for.
//!
//! Backing up is in `session.rs` and `backup_stream.rs`, restoring in
//! `restore/`.

mod create_only;
mod keys;
pub mod listing;

use std::collections::HashMap;
use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dedup_common::compress::Compression;

use crate::backup::{validate_name, BackupRecord, BACKUPS_PREFIX};
use crate::catalog_cache::{cached_catalog, CatalogCache, DEFAULT_CATALOGS};
use crate::config::{KeyedOf, RepoConfig, CONFIG_OBJECT};
use crate::container::Catalog;
use crate::crypto::keys::KdfParams;
use crate::crypto::passphrase;
use crate::epochs::Epochs;
use crate::error::repo::{RepoError, RepoResult};
use crate::error::Error;
use crate::index::checkpoint_objects::{self, Listed, Opened, Saved};
use crate::index::seam::CatalogLoader;
use crate::index::seam::{ExactIndex, SegmentIndex};
use crate::index::IndexConfig;
use crate::inflight::InFlight;
use crate::local::LocalDir;
use crate::objects::ObjectStore;
use crate::protection::Protection;
use crate::repo_location::RepoLocation;
use crate::segment_hash::SegmentHash;
use crate::segmenter::Segmenting;
use crate::writer::DEFAULT_TARGET;
use create_only::probe_create_only;
use keys::{objects_of, Unlocked};
pub use keys::{open_objects, KeyInfo};

pub const CONTAINERS_PREFIX: &str = "containers/";

/// How `init` sets a repository up.
#[derive(Clone, Copy, Debug)]
pub struct RepoOptions {
    pub segmenting: Segmenting,
    pub container_target: u64,
    pub compression: Compression,
    /// Create the repository even if the directory holds other files.
    pub force: bool,
    /// Encrypt it: every object sealed under a new master key, wrapped
    /// under the given passphrase (`crypto::passphrase`) with this KDF
    /// cost. `None`: nothing is encrypted.
    pub encryption: Option<KdfParams>,
    /// What an encrypted repository's keyed fingerprints hash
    /// (`config::KeyedOf`): the plain digest unless a test asks for a
    /// repository as older builds made them.
    pub keyed_of: KeyedOf,
}

impl Default for RepoOptions {
    fn default() -> RepoOptions {
        RepoOptions {
            segmenting: Segmenting::DEFAULT,
            container_target: DEFAULT_TARGET as u64,
            compression: Compression::Lz4,
            force: false,
            encryption: None,
            keyed_of: KeyedOf::PlainDigest,
        }
    }
}

pub struct Repository {
    location: RepoLocation,
    /// Shared with an index that prefetches catalogs
    /// ([`crate::index::SampledSegmentIndex`]).
    /// A `LocalDir` or an `S3Store`, seen through the seam (tests wrap it
    /// to count reads or fail writes).
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) config: RepoConfig,
    /// The fingerprint index; `None` when opened read-only.
    index: Option<Mutex<Box<dyn SegmentIndex>>>,
    /// Shared with the index (`SegmentIndex::read_catalogs_through`).
    catalogs: Arc<Mutex<CatalogCache>>,
    /// This process's place in the many-writers protocol and its
    /// container ids (`epochs/`).
    pub(crate) epochs: Mutex<Epochs>,
    pub(crate) protection: Mutex<Protection>,
    /// Containers of running backups not yet durable (`inflight.rs`).
    inflight: Mutex<InFlight>,
    damaged: Vec<String>,
    /// References a backup gathers before writing them as a recipe part
    /// (`recipe::parts::PART_SEGMENTS`; tests make it small).
    pub(crate) part_segments: AtomicUsize,
    /// The master key and the key object it came from, if encrypted.
    unlocked: Option<Unlocked>,
    /// The index checkpoint in the store known to hold what this handle
    /// would save now: loaded at open, or saved since.
    saved_checkpoint: Mutex<Option<Saved>>,
    /// Opened to delete backups only (`open_to_delete`).
    deletes: bool,
    /// Backup records read, by object name, with the listing's tag they
    /// were read under (`listing.rs`).
    pub(crate) records: Mutex<HashMap<String, (String, crate::backup::BackupRecord)>>,
    /// The index checkpoints this handle listed at open and saved since:
    /// the older ones its next save deletes.
    checkpoints: Mutex<Listed>,
}

impl Repository {
    /// Create a repository with the default options at `location` (a
    /// directory, created if missing, or a bucket and prefix).
    pub fn init(location: impl Into<RepoLocation>) -> RepoResult<Repository> {
        Repository::init_with(location, RepoOptions::default())
    }

    pub fn init_with(
        location: impl Into<RepoLocation>,
        options: RepoOptions,
    ) -> RepoResult<Repository> {
        let location = location.into();
        options.segmenting.check().map_err(Error::InvalidArgument)?;
        if options.container_target == 0 {
            return Err(Error::InvalidArgument("container target is 0".into()).into());
        }
        // A directory is looked at before opening the store creates it.
        let dir_empty = match location.dir() {
            Some(dir) if dir.exists() => fs::read_dir(dir)
                .map_err(|e| io_err(dir, "reading", e))?
                .next()
                .is_none(),
            _ => true,
        };
        let store = location.open_store()?;
        let empty = match location.dir() {
            Some(_) => dir_empty,
            None => store.list("")?.is_empty(),
        };
        if options.encryption.is_none() && passphrase::given()?.is_some() {
            // Its writers would be refused (`keys::objects_of`): say so now.
            return Err(RepoError::Store(Error::InvalidArgument(format!(
                "{location}: a passphrase was given for a repository in the clear; unset \
                 DEDUP_PASSWORD and DEDUP_PASSWORD_FILE and give no --password-file, or \
                 encrypt it"
            ))));
        }
        if !empty && !options.force {
            return Err(RepoError::NotEmpty {
                repo: location.to_string(),
            });
        }
        if let Some(dir) = location.dir() {
            // It holds every byte ever backed up: owner only, even if it existed.
            fs::set_permissions(dir, Permissions::from_mode(0o700))
                .map_err(|e| io_err(dir, "restricting", e))?;
        }
        let config = RepoConfig {
            uuid: crate::crypto::random::random_bytes()?,
            segmenting: options.segmenting,
            container_target: options.container_target,
            compression: options.compression,
            // In the clear, nothing is keyed: written as older builds read.
            keyed_of: match options.encryption {
                Some(_) => options.keyed_of,
                None => KeyedOf::Bytes,
            },
        };
        // A refused put (Exists) means a repository is already there.
        match options.encryption {
            None => store.put(CONFIG_OBJECT, &config.encode())?,
            Some(params) => keys::init_encrypted(&location, store.clone(), &config, params)?,
        }
        drop(store);
        Repository::open(location)
    }

    /// Open the repository in `dir` to read: list, restore, check. No
    /// lock, no index; it works while another process writes.
    pub fn open_read_only(location: impl Into<RepoLocation>) -> RepoResult<Repository> {
        Repository::open_as(location, None::<fn(Arc<dyn ObjectStore>) -> Opened>, |s| s)
    }

    /// Open to delete backups ([`Repository::delete_backup`]) and nothing
    /// else: as a reader opens (the config and the key, no index, no
    /// listing of containers, no epochs), but refused in the clear when a
    /// passphrase is given, as a writer is. Deleting a backup object needs
    /// no part in the many-writers protocol (a collection finds its recipe
    /// and tree orphaned either way); in a bucket this sends 8 requests
    /// where a writer's open and delete sent 13 to 22.
    pub fn open_to_delete(location: impl Into<RepoLocation>) -> RepoResult<Repository> {
        let mut repo = Repository::open_as_to(
            location,
            None::<fn(Arc<dyn ObjectStore>) -> Opened>,
            |s| s,
            true,
        )?;
        repo.deletes = true;
        Ok(repo)
    }

    /// Open the repository in `dir` with an exact in-RAM index.
    pub fn open(location: impl Into<RepoLocation>) -> RepoResult<Repository> {
        Repository::open_with_index(location, Box::new(ExactIndex::new()))
    }

    /// Open the repository in `dir` with the sampled index of §3.2
    /// ([`crate::index::SampledSegmentIndex`]), prefetching catalogs
    /// through the repository's catalog cache. It starts from the newest
    /// index checkpoint that loads and reads only the catalogs of
    /// containers sealed after it; without one it reads every catalog.
    pub fn open_sampled(
        location: impl Into<RepoLocation>,
        config: IndexConfig,
    ) -> RepoResult<Repository> {
        Repository::open_sampled_wrapped(location, config, |s| s)
    }

    /// `open_sampled` with every object operation going through
    /// `wrap(store)`: for tests that count what an open reads.
    #[doc(hidden)]
    pub fn open_sampled_wrapped(
        location: impl Into<RepoLocation>,
        config: IndexConfig,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> RepoResult<Repository> {
        Repository::open_as(
            location,
            Some(|store: Arc<dyn ObjectStore>| {
                crate::index::checkpoint_objects::load(store, config)
            }),
            wrap,
        )
    }

    /// Open with `index`, which is given every container's catalog.
    pub fn open_with_index(
        location: impl Into<RepoLocation>,
        index: Box<dyn SegmentIndex>,
    ) -> RepoResult<Repository> {
        let opened = |_| Opened {
            index,
            covered: 0,
            saved: None,
            listed: None,
        };
        Repository::open_as(location, Some(opened), |s| s)
    }

    /// Open to write (exact index) with every object operation going
    /// through `wrap(store)`: for tests that count reads or simulate a
    /// crash by failing the Nth operation. Not for production use.
    #[doc(hidden)]
    pub fn open_wrapped(
        location: impl Into<RepoLocation>,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> RepoResult<Repository> {
        let exact = |_: Arc<dyn ObjectStore>| Opened {
            index: Box::new(ExactIndex::new()),
            covered: 0,
            saved: None,
            listed: None,
        };
        Repository::open_as(location, Some(exact), wrap)
    }

    /// Open to write (with the index `make` builds, under the writer's
    /// lock) or, with `None`, to read.
    fn open_as(
        location: impl Into<RepoLocation>,
        make: Option<impl FnOnce(Arc<dyn ObjectStore>) -> Opened>,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
    ) -> RepoResult<Repository> {
        let to_write = make.is_some();
        Repository::open_as_to(location, make, wrap, to_write)
    }

    /// `open_as`, saying whether the handle will change the repository
    /// (`to_write`: a passphrase given for one in the clear is refused).
    fn open_as_to(
        location: impl Into<RepoLocation>,
        make: Option<impl FnOnce(Arc<dyn ObjectStore>) -> Opened>,
        wrap: impl FnOnce(Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore>,
        to_write: bool,
    ) -> RepoResult<Repository> {
        let location = location.into();
        let foreign = |detail: String| RepoError::NotARepository {
            repo: location.to_string(),
            detail,
        };
        if location.dir().is_some_and(|dir| !dir.is_dir()) {
            return Err(foreign("not a directory".into()));
        }
        let inner = location.open_store()?;
        let raw = match inner.get(CONFIG_OBJECT) {
            Err(Error::NotFound { .. }) => {
                // In a bucket, a missing bucket is named by the listing's
                // error rather than as a missing config.
                if location.dir().is_none() {
                    inner.list(CONFIG_OBJECT)?;
                }
                return Err(foreign("it has no config object".into()));
            }
            other => other?,
        };
        // The create-only probe goes to the bucket as it is: it holds a
        // word, and must test the service, not the sealing.
        let clear = inner.clone();
        let (store, unlocked, config) = objects_of(&location, inner, raw, to_write)?;
        let store = wrap(store);
        let config = RepoConfig::decode(&config).map_err(|e| foreign(e.to_string()))?;
        let (index, covered, saved, listed) = match make {
            None => (None, 0, None, None),
            Some(make) => {
                match location.dir() {
                    // Only the temporary files of processes known dead
                    // (`local.rs`): other writers may be putting now.
                    Some(dir) => {
                        LocalDir::open(dir)?.sweep_temporaries()?;
                    }
                    None => probe_create_only(&location, &clear)?,
                }
                let opened = make(store.clone());
                (
                    Some(Mutex::new(opened.index)),
                    opened.covered,
                    opened.saved,
                    opened.listed,
                )
            }
        };
        let writer: [u8; 8] = crate::crypto::random::random_bytes()?;
        let writer: String = writer.iter().map(|b| format!("{b:02x}")).collect();
        let mut repo = Repository {
            location,
            store,
            index,
            config,
            catalogs: Arc::new(Mutex::new(CatalogCache::new(DEFAULT_CATALOGS))),
            epochs: Mutex::new(Epochs::new(writer, 0)),
            protection: Mutex::new(Protection::default()),
            inflight: Mutex::new(InFlight::default()),
            damaged: Vec::new(),
            part_segments: AtomicUsize::new(crate::recipe::parts::PART_SEGMENTS),
            unlocked,
            saved_checkpoint: Mutex::new(saved),
            checkpoints: Mutex::new(Vec::new()),
            records: Mutex::new(HashMap::new()),
            deletes: false,
        };
        if let Ok(mut index) = repo.index() {
            index.read_catalogs_through(repo.catalog_loader());
        }
        repo.load_catalogs(covered, listed)?;
        if repo.is_writable() {
            // What the kept epochs condemned is never handed out.
            repo.refresh_epochs()?;
        }
        Ok(repo)
    }

    /// Write backups' recipes in parts of `segments` references from now
    /// on (at least 1) instead of `recipe::parts::PART_SEGMENTS`: for tests
    /// that want many parts from little data.
    #[doc(hidden)]
    pub fn set_recipe_part_segments(&self, segments: usize) {
        self.part_segments.store(segments.max(1), Ordering::SeqCst);
    }

    /// Give the index the catalog of every container from `covered` up (it
    /// has the others from a checkpoint) and find the next free id.
    /// A container whose catalog is damaged is left out of the index (its
    /// segments are stored again if seen again) and listed in `damaged`;
    /// the restores that need it fail naming it.
    /// A read-only handle reads none.
    fn load_catalogs(&mut self, covered: u64, listed: Option<Listed>) -> RepoResult<()> {
        if self.index.is_none() {
            return Ok(());
        }
        let listed = listed.unwrap_or_else(|| checkpoint_objects::checkpoints(&*self.store));
        // A compaction a crash interrupted may have left an id with only
        // its compacted version: put it back under its name (safe beside
        // a collection still compacting, see `gc/compact.rs`).
        self.repair_compactions()?;
        // Only the containers the checkpoint does not cover: a listing of
        // every container would cost a request per 1,000 of them.
        let ids = self.container_ids_from(covered)?;
        let index = self.index.as_mut().expect("writable");
        let index = index.get_mut().unwrap_or_else(|p| p.into_inner());
        // Ids are never reused, even after GC deleted the newest: no lower
        // than any checkpoint says was handed out.
        let mut next = covered.max(checkpoint_objects::highest_covered(&listed));
        *self
            .checkpoints
            .get_mut()
            .unwrap_or_else(|p| p.into_inner()) = listed;
        for id in ids.into_iter().filter(|&id| id >= covered) {
            if id > crate::index::hooks::MAX_CONTAINER {
                // An id no repository hands out (a foreign or damaged
                // name): damaged, and never a reason to hand out ids past
                // it, which no hook could name.
                self.damaged.push(crate::container_name(id));
                continue;
            }
            next = next.max(id + 1);
            match Catalog::read(&*self.store, id) {
                Ok(catalog) => index.insert(id, catalog.entries()),
                Err(Error::Corrupt { .. }) => self.damaged.push(crate::container_name(id)),
                Err(e) => return Err(e.into()),
            }
        }
        let epochs = self.epochs.get_mut().unwrap_or_else(|p| p.into_inner());
        epochs.raise_floor(next);
        Ok(())
    }

    /// The ids of every container in the store, ascending.
    pub(crate) fn store_container_ids(&self) -> RepoResult<Vec<u64>> {
        self.container_ids_from(0)
    }

    /// The ids of the containers from `from` up, ascending.
    fn container_ids_from(&self, from: u64) -> RepoResult<Vec<u64>> {
        let names = match from.checked_sub(1) {
            None => self.store.list(CONTAINERS_PREFIX)?,
            Some(last) => self
                .store
                .list_after(CONTAINERS_PREFIX, &crate::container_name(last))?,
        };
        let mut ids = Vec::new();
        for name in names {
            let id = name
                .strip_prefix(CONTAINERS_PREFIX)
                .filter(|h| h.len() == 16)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| RepoError::corrupt(&name, "not a container name"))?;
            ids.push(id);
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Where the repository lives, as `REPO` names it.
    pub fn location(&self) -> &RepoLocation {
        &self.location
    }

    /// The repository's directory; `None` for one in a bucket.
    pub fn dir(&self) -> Option<&Path> {
        self.location.dir()
    }

    /// How this repository fingerprints segments: keyed if encrypted.
    pub fn segment_hash(&self) -> SegmentHash {
        self.store.segment_hash()
    }

    /// The key of the segments' fingerprints, if the repository is
    /// encrypted: what a client of `store serve` hashes with.
    pub fn fingerprint_key(&self) -> Option<([u8; 32], KeyedOf)> {
        self.segment_hash().key()
    }

    pub fn config(&self) -> &RepoConfig {
        &self.config
    }

    /// The object store holding the repository's objects, for an index
    /// that reads catalogs itself.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// Containers whose catalogs failed their checks at open.
    pub fn damaged_containers(&self) -> &[String] {
        &self.damaged
    }

    /// Replace the index, giving it every container's catalog. For tests
    /// and for trying another index on an open repository.
    pub fn set_index(&mut self, mut index: Box<dyn SegmentIndex>) -> RepoResult<()> {
        if self.index.is_none() {
            return Err(RepoError::ReadOnly);
        }
        for id in self.store_container_ids()? {
            if let Ok(catalog) = Catalog::read(&*self.store, id) {
                index.insert(id, catalog.entries());
            }
        }
        index.read_catalogs_through(self.catalog_loader());
        let slot = self.index.as_mut().expect("writable");
        *slot.get_mut().unwrap_or_else(|p| p.into_inner()) = index;
        Ok(())
    }

    /// The index, locked; `ReadOnly` for a read-only handle.
    pub(crate) fn index(&self) -> RepoResult<MutexGuard<'_, Box<dyn SegmentIndex>>> {
        let index = self.index.as_ref().ok_or(RepoError::ReadOnly)?;
        Ok(index.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn protection(&self) -> MutexGuard<'_, Protection> {
        self.protection.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn inflight(&self) -> MutexGuard<'_, InFlight> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Container `id`'s catalog, from the cache or read (without holding
    /// the cache's lock over the read).
    pub(crate) fn catalog(&self, id: u64) -> crate::error::Result<Arc<Catalog>> {
        cached_catalog(&*self.store, &self.catalogs, id)
    }

    /// How the index reads catalogs: through the cache, as `catalog`.
    fn catalog_loader(&self) -> CatalogLoader {
        let (store, cache) = (self.store.clone(), self.catalogs.clone());
        Arc::new(move |id| cached_catalog(&*store, &cache, id))
    }

    pub(crate) fn catalog_cache(&self) -> MutexGuard<'_, CatalogCache> {
        self.catalogs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the index costs in RAM and for how many fingerprints; `None`
    /// for a read-only handle.
    pub fn index_ram(&self) -> Option<crate::index::seam::IndexRam> {
        self.index().ok().map(|i| i.ram())
    }

    /// Whether this handle may write (opened to write, not read-only).
    pub fn is_writable(&self) -> bool {
        self.index.is_some()
    }

    /// The committed backups, by name.
    pub fn list_backups(&self) -> RepoResult<Vec<BackupRecord>> {
        let mut out = Vec::new();
        for object in self.store.list(BACKUPS_PREFIX)? {
            out.push(BackupRecord::decode(&object, &self.store.get(&object)?)?);
        }
        Ok(out)
    }

    pub fn backup(&self, name: &str) -> RepoResult<BackupRecord> {
        validate_name(name)?;
        let object = BackupRecord::object_name(name);
        match self.store.get(&object) {
            Err(Error::NotFound { .. }) => Err(RepoError::NoSuchBackup { name: name.into() }),
            other => BackupRecord::decode(&object, &other?),
        }
    }

    /// Remove a backup: its backup object first (after which it is gone),
    /// then its tree. Its recipe (and the recipe's parts) and its
    /// containers stay for garbage collection ([`Repository::gc`]): where
    /// its group's marks are counted (`gc/marks.rs`), the collection reads
    /// the recipe once more to take the backup's references out, instead
    /// of reading the recipes of every backup the group keeps; the
    /// collection after the one that first finds the recipe unnamed (the
    /// same `gc`, which runs two) removes it as an orphan. A damaged
    /// backup object is removed alone: the recipe and tree it named cannot
    /// be known from it, and the next collection removes them as orphans.
    pub fn delete_backup(&self, name: &str) -> RepoResult<()> {
        if !self.is_writable() && !self.deletes {
            return Err(RepoError::ReadOnly);
        }
        let record = match self.backup(name) {
            Err(RepoError::Corrupt { .. } | RepoError::Store(Error::Corrupt { .. })) => {
                return match self.store.delete(&BackupRecord::object_name(name)) {
                    Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(e.into()),
                };
            }
            other => other?,
        };
        self.store.delete(&BackupRecord::object_name(name))?;
        if let Some(tree) = &record.tree {
            match self.store.delete(tree) {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

impl Repository {
    /// Save the index's checkpoint (`index/checkpoint_objects.rs`), if it has one,
    /// and drop older ones. Done only while no backup runs: a running
    /// backup's container may have a lower id than a sealed one, and would
    /// be missed. Whether a checkpoint was saved.
    pub fn save_index(&self) -> RepoResult<bool> {
        if !self.is_writable() {
            return Ok(false);
        }
        // Read before the check: a session that starts after it takes ids
        // at or above it, which the next open lists.
        let covered = self.epochs().covered();
        let (covered, bytes) = {
            let protection = self.protection();
            if protection.sessions() > 0 {
                return Ok(false);
            }
            let Some(bytes) = self.index()?.checkpoint() else {
                return Ok(false);
            };
            drop(protection);
            (covered, bytes)
        };
        let saved = Saved::of(covered, &bytes);
        let mut last = self
            .saved_checkpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *last == Some(saved) {
            return Ok(false);
        }
        let mut known = self.checkpoints.lock().unwrap_or_else(|p| p.into_inner());
        checkpoint_objects::save(&*self.store, covered, &bytes, &mut known)?;
        *last = Some(saved);
        Ok(true)
    }
}

impl Drop for Repository {
    /// A writing handle leaves a checkpoint behind so the next open is
    /// quick; failing to is harmless (the next open rebuilds).
    fn drop(&mut self) {
        let _ = self.save_index();
        if self.is_writable() {
            self.drop_own_pins();
        }
    }
}

fn io_err(dir: &Path, doing: &str, cause: std::io::Error) -> RepoError {
    RepoError::Io {
        context: format!("{doing} {}", dir.display()),
        cause,
    }
}
