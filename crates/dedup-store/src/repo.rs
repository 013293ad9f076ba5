//! `Repository`: a deduplicating backup store in one local directory: its
//! config, containers, recipes and backups as objects in a `LocalDir`, and
//! a fingerprint index rebuilt from the containers' catalogs at open.
//!
//! Backing up is in `backup_stream.rs`, restoring in `restore.rs`.

use std::collections::HashMap;
use std::fs::{self, File, Permissions};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backup::{validate_name, BackupRecord, BACKUPS_PREFIX};
use crate::config::{RepoConfig, CONFIG_OBJECT};
use crate::container::Catalog;
use crate::error::Error;
use crate::index::{IndexConfig, SampledIndex};
use crate::local::LocalDir;
use crate::objects::ObjectStore;
use crate::repo_error::{RepoError, RepoResult};
use crate::segment_index::{ExactIndex, SegmentIndex};
use crate::segmenter::Segmenting;
use crate::writer::DEFAULT_TARGET;

pub const CONTAINERS_PREFIX: &str = "containers/";

/// How `init` sets a repository up.
#[derive(Clone, Copy, Debug)]
pub struct RepoOptions {
    pub segmenting: Segmenting,
    pub container_target: u64,
    /// Create the repository even if the directory holds other files.
    pub force: bool,
}

impl Default for RepoOptions {
    fn default() -> RepoOptions {
        RepoOptions {
            segmenting: Segmenting::DEFAULT,
            container_target: DEFAULT_TARGET as u64,
            force: false,
        }
    }
}

pub struct Repository {
    pub(crate) dir: PathBuf,
    /// Shared with an index that prefetches catalogs ([`SampledIndex`]).
    pub(crate) store: Arc<LocalDir>,
    pub(crate) config: RepoConfig,
    pub(crate) index: Box<dyn SegmentIndex>,
    /// Catalogs read so far; containers are immutable, so never stale.
    pub(crate) catalogs: HashMap<u64, Catalog>,
    pub(crate) next_container: u64,
    damaged: Vec<String>,
}

impl Repository {
    /// Create a repository with the default options in `dir`.
    pub fn init(dir: impl AsRef<Path>) -> RepoResult<Repository> {
        Repository::init_with(dir, RepoOptions::default())
    }

    pub fn init_with(dir: impl AsRef<Path>, options: RepoOptions) -> RepoResult<Repository> {
        let dir = dir.as_ref().to_path_buf();
        options.segmenting.check().map_err(Error::InvalidArgument)?;
        if options.container_target == 0 {
            return Err(Error::InvalidArgument("container target is 0".into()).into());
        }
        if dir.exists() && !options.force {
            let mut entries = fs::read_dir(&dir).map_err(|e| io_err(&dir, "reading", e))?;
            if entries.next().is_some() {
                return Err(RepoError::NotEmpty { dir });
            }
        }
        let store = LocalDir::open(&dir)?;
        // It holds every byte ever backed up: owner only, even if it existed.
        fs::set_permissions(&dir, Permissions::from_mode(0o700))
            .map_err(|e| io_err(&dir, "restricting", e))?;
        let config = RepoConfig {
            uuid: random_bytes()?,
            segmenting: options.segmenting,
            container_target: options.container_target,
        };
        // A refused put (Exists) means a repository is already there.
        store.put(CONFIG_OBJECT, &config.encode())?;
        Repository::open(dir)
    }

    /// Open the repository in `dir` with an exact in-RAM index.
    pub fn open(dir: impl AsRef<Path>) -> RepoResult<Repository> {
        Repository::open_with_index(dir, Box::new(ExactIndex::new()))
    }

    /// Open the repository in `dir` with the sampled index of §3.2
    /// ([`SampledIndex`]), built from every catalog at open and prefetching
    /// catalogs through the repository's own object store.
    pub fn open_sampled(dir: impl AsRef<Path>, config: IndexConfig) -> RepoResult<Repository> {
        Repository::open_inner(dir, |store| Box::new(SampledIndex::new(store, config)))
    }

    /// Open with `index`, which is given every container's catalog.
    pub fn open_with_index(
        dir: impl AsRef<Path>,
        index: Box<dyn SegmentIndex>,
    ) -> RepoResult<Repository> {
        Repository::open_inner(dir, |_| index)
    }

    /// Open with the index `make` builds from the repository's store.
    fn open_inner(
        dir: impl AsRef<Path>,
        make: impl FnOnce(Arc<dyn ObjectStore>) -> Box<dyn SegmentIndex>,
    ) -> RepoResult<Repository> {
        let dir = dir.as_ref().to_path_buf();
        let foreign = |detail: String| RepoError::NotARepository {
            dir: dir.clone(),
            detail,
        };
        if !dir.is_dir() {
            return Err(foreign("not a directory".into()));
        }
        let store = Arc::new(LocalDir::open(&dir)?);
        let config = match store.get(CONFIG_OBJECT) {
            Err(Error::NotFound { .. }) => return Err(foreign("it has no config object".into())),
            other => RepoConfig::decode(&other?).map_err(|e| foreign(e.to_string()))?,
        };
        let index = make(store.clone());
        let mut repo = Repository {
            dir,
            store,
            index,
            config,
            catalogs: HashMap::new(),
            next_container: 0,
            damaged: Vec::new(),
        };
        repo.load_catalogs()?;
        Ok(repo)
    }

    /// Give the index every container's catalog and find the next free id.
    /// A container whose catalog is damaged is left out of the index (its
    /// segments are stored again if seen again) and listed in `damaged`;
    /// the restores that need it fail naming it.
    fn load_catalogs(&mut self) -> RepoResult<()> {
        for name in self.store.list(CONTAINERS_PREFIX)? {
            let id = name
                .strip_prefix(CONTAINERS_PREFIX)
                .filter(|h| h.len() == 16)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| RepoError::corrupt(&name, "not a container name"))?;
            self.next_container = self.next_container.max(id + 1);
            match Catalog::read(&*self.store, id) {
                Ok(catalog) => {
                    self.index.insert(id, catalog.entries());
                    self.catalogs.insert(id, catalog);
                }
                Err(Error::Corrupt { .. }) => self.damaged.push(name),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// Replace the index (given every catalog read so far). For tests and
    /// for trying another index on an open repository.
    pub fn set_index(&mut self, mut index: Box<dyn SegmentIndex>) {
        let mut ids: Vec<_> = self.catalogs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            index.insert(id, self.catalogs[&id].entries());
        }
        self.index = index;
    }

    /// Container `id`'s catalog, read once.
    pub(crate) fn catalog(&mut self, id: u64) -> crate::error::Result<&Catalog> {
        if !self.catalogs.contains_key(&id) {
            let catalog = Catalog::read(&*self.store, id)?;
            self.catalogs.insert(id, catalog);
        }
        Ok(&self.catalogs[&id])
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
    /// then its recipe. Its containers stay until a garbage collection.
    pub fn delete_backup(&mut self, name: &str) -> RepoResult<()> {
        let record = self.backup(name)?;
        self.store.delete(&BackupRecord::object_name(name))?;
        match self.store.delete(&record.recipe) {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

fn io_err(dir: &Path, doing: &str, cause: std::io::Error) -> RepoError {
    RepoError::Io {
        context: format!("{doing} {}", dir.display()),
        cause,
    }
}

/// Random bytes from the kernel, for the repository uuid and recipe nonces.
pub(crate) fn random_bytes<const N: usize>() -> RepoResult<[u8; N]> {
    let mut b = [0u8; N];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|cause| RepoError::Io {
            context: "reading /dev/urandom".into(),
            cause,
        })?;
    Ok(b)
}
