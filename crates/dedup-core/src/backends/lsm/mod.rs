//! lsm backend: the LBN map, hash index and reference counts in a
//! log-structured merge tree (fjall), the log-structured backend Dmdedup's
//! future work names. fjall keeps its files in a directory next to the
//! metadata device (`DIR/meta.lsm`); our superblock stays in `DIR/meta`.
//!
//! Transactions are `KvBackend`'s: a commit is one fjall write batch,
//! atomic across the three keyspaces, persisted with `SyncAll`; fjall's
//! journal replays it after a crash.

mod sums;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::backend::{MetaIoStats, MetadataBackend};
use crate::backends::kv::guard::Guarded;
use crate::backends::kv::store::{check_entry, entry_crc, Changes, KvStore, StoreState, Table};
use crate::backends::kv::KvBackend;
use crate::backends::{BackendParams, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, IoContext, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::{DeviceState, Superblock};

pub const NAME: &str = "lsm";
const S: &str = "lsm tables";
const STATE_KEY: &[u8] = b"state";

fn db_err(e: fjall::Error) -> Error {
    match e {
        fjall::Error::Io(io) => Error::io("lsm metadata I/O", io),
        e @ (fjall::Error::JournalRecovery(_)
        | fjall::Error::Decompress(_)
        | fjall::Error::InvalidTrailer
        | fjall::Error::InvalidTag(_)) => Error::corrupt(S, format!("{e}; {}", super::NOT_REBUILT)),
        other => Error::corrupt(S, other.to_string()),
    }
}

/// The engine, behind a guard (see `kv/guard.rs`).
pub struct FjallStore {
    engine: Guarded<FjallInner>,
    dir: PathBuf,
    meta: Arc<dyn BlockFile>,
    writes: AtomicU64,
    syncs: AtomicU64,
    bytes_written: AtomicU64,
    /// Inspection: the private copy of the tables fjall was opened on
    /// (fjall writes while it opens), removed after it closes.
    _scratch: Option<tempfile::TempDir>,
}

struct FjallInner {
    db: Database,
    lbn_map: Keyspace,
    hash_index: Keyspace,
    refcounts: Keyspace,
    state: Keyspace,
}

/// An entry's value: the number, then the crc32c of table, key and value
/// (see `kv/store.rs`).
fn encode_value(table: Table, key: &[u8], value: u64) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[..8].copy_from_slice(&value.to_le_bytes());
    v[8..].copy_from_slice(&entry_crc(table, key, value).to_le_bytes());
    v
}

fn decode_value(table: Table, key: &[u8], v: &[u8]) -> Result<u64> {
    let v: [u8; 12] = v
        .try_into()
        .map_err(|_| Error::corrupt(S, format!("a value of {} bytes", v.len())))?;
    let value = u64::from_le_bytes(v[..8].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(v[8..].try_into().expect("4 bytes"));
    check_entry(NAME, table, key, value, crc)
}

fn key_u64(k: &[u8], what: &str) -> Result<u64> {
    k.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| Error::corrupt(S, format!("{what} key of {} bytes", k.len())))
}

impl FjallInner {
    fn open(dir: &Path, cache_bytes: u64) -> Result<FjallInner> {
        let db = Database::builder(dir)
            .cache_size(cache_bytes)
            .open()
            .map_err(db_err)?;
        let ks = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(db_err)
        };
        Ok(FjallInner {
            lbn_map: ks("lbn_map")?,
            hash_index: ks("hash_index")?,
            refcounts: ks("refcounts")?,
            state: ks("state")?,
            db,
        })
    }

    fn scan_lbn(&self, after: Option<Lbn>, max: usize, out: &mut Vec<(Lbn, Pbn)>) -> Result<()> {
        let start = match after {
            Some(u64::MAX) => return Ok(()),
            Some(a) => a + 1,
            None => 0,
        };
        for g in self.lbn_map.range(start.to_be_bytes()..).take(max) {
            let (k, v) = g.into_inner().map_err(db_err)?;
            out.push((key_u64(&k, "LBN")?, decode_value(Table::LbnMap, &k, &v)?));
        }
        Ok(())
    }

    fn scan_hash(
        &self,
        after: Option<&Fingerprint>,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<()> {
        let iter = match after {
            Some(a) => self
                .hash_index
                .range::<[u8; 32], _>((std::ops::Bound::Excluded(a.0), std::ops::Bound::Unbounded)),
            None => self.hash_index.range::<[u8; 32], _>(..),
        };
        for g in iter.take(max) {
            let (k, v) = g.into_inner().map_err(db_err)?;
            let fp: [u8; 32] = k
                .as_ref()
                .try_into()
                .map_err(|_| Error::corrupt(S, "fingerprint key of the wrong size"))?;
            out.push((Fingerprint(fp), decode_value(Table::HashIndex, &k, &v)?));
        }
        Ok(())
    }

    fn for_each_refcount(&self, f: &mut dyn FnMut(Pbn, u32) -> Result<()>) -> Result<()> {
        for g in self.refcounts.iter() {
            let (k, v) = g.into_inner().map_err(db_err)?;
            let count = decode_value(Table::Refcounts, &k, &v)? as u32;
            f(key_u64(&k, "PBN")?, count)?;
        }
        Ok(())
    }

    /// Returns the bytes handed to the engine.
    fn apply(&self, changes: &Changes, state: &StoreState) -> Result<u64> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncAll));
        let mut bytes = 0u64;
        for (&lbn, v) in &changes.lbn_map {
            match v {
                Some(pbn) => {
                    let key = lbn.to_be_bytes();
                    batch.insert(&self.lbn_map, key, encode_value(Table::LbnMap, &key, *pbn))
                }
                None => batch.remove(&self.lbn_map, lbn.to_be_bytes()),
            }
            bytes += 16;
        }
        for (fp, v) in &changes.hash_index {
            match v {
                Some(pbn) => batch.insert(
                    &self.hash_index,
                    fp.0,
                    encode_value(Table::HashIndex, &fp.0, *pbn),
                ),
                None => batch.remove(&self.hash_index, fp.0),
            }
            bytes += 40;
        }
        for (&pbn, &count) in &changes.refcounts {
            if count == 0 {
                batch.remove(&self.refcounts, pbn.to_be_bytes());
            } else {
                let key = pbn.to_be_bytes();
                batch.insert(
                    &self.refcounts,
                    key,
                    encode_value(Table::Refcounts, &key, count as u64),
                );
            }
            bytes += 12;
        }
        let st = state.encode();
        bytes += st.len() as u64;
        batch.insert(&self.state, STATE_KEY, st);
        batch.commit().map_err(db_err)?;
        Ok(bytes)
    }
}

impl KvStore for FjallStore {
    fn get_lbn(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        let key = lbn.to_be_bytes();
        self.engine
            .with(|i| match i.lbn_map.get(key).map_err(db_err)? {
                Some(v) => decode_value(Table::LbnMap, &key, &v).map(Some),
                None => Ok(None),
            })
    }

    fn get_hash(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        self.engine
            .with(|i| match i.hash_index.get(fp.0).map_err(db_err)? {
                Some(v) => decode_value(Table::HashIndex, &fp.0, &v).map(Some),
                None => Ok(None),
            })
    }

    fn get_refcount(&mut self, pbn: Pbn) -> Result<u32> {
        let key = pbn.to_be_bytes();
        self.engine
            .with(|i| match i.refcounts.get(key).map_err(db_err)? {
                Some(v) => decode_value(Table::Refcounts, &key, &v).map(|c| c as u32),
                None => Ok(0),
            })
    }

    fn scan_lbn(
        &mut self,
        after: Option<Lbn>,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<()> {
        self.engine.with(|i| i.scan_lbn(after, max, out))
    }

    fn scan_hash(
        &mut self,
        after: Option<&Fingerprint>,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<()> {
        self.engine.with(|i| i.scan_hash(after, max, out))
    }

    fn for_each_refcount(&mut self, f: &mut dyn FnMut(Pbn, u32) -> Result<()>) -> Result<()> {
        self.engine.with(|i| i.for_each_refcount(f))
    }

    fn state(&mut self) -> Result<StoreState> {
        self.engine
            .with(|i| match i.state.get(STATE_KEY).map_err(db_err)? {
                Some(v) => StoreState::decode(&v, "lsm state record"),
                None => Ok(StoreState::default()),
            })
    }

    fn apply(&mut self, changes: &Changes, state: &StoreState) -> Result<()> {
        let bytes = self.engine.with(|i| i.apply(changes, state))?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Persist, shut fjall down (its files then stay put), and record their
    /// checksums so the next clean open can check them before fjall reads them.
    fn close(&mut self) -> Result<()> {
        self.engine
            .with(|i| i.db.persist(PersistMode::SyncAll).map_err(db_err))?;
        self.engine.close();
        sums::record(self.meta.as_ref(), &self.dir)
    }

    fn io_stats(&self) -> MetaIoStats {
        let mut stats = MetaIoStats {
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            ..MetaIoStats::default()
        };
        if let Some(i) = self.engine.peek() {
            for ks in [&i.lbn_map, &i.hash_index, &i.refcounts] {
                let m = ks.metrics();
                stats.reads += m.block_load_io_count() as u64;
                stats.cache_hits += m.block_load_cached_count() as u64;
                stats.bytes_read += m.block_io();
            }
            stats.cache_misses = stats.reads;
        }
        stats
    }

    fn size_bytes(&self) -> u64 {
        self.engine
            .peek()
            .and_then(|i| i.db.disk_space().ok())
            .unwrap_or(0)
    }
}

/// Open fjall under a guard.
fn open_store(dir: &Path, cache_bytes: u64, meta: Arc<dyn BlockFile>) -> Result<FjallStore> {
    open_store_in(dir, cache_bytes, meta, None)
}

fn open_store_in(
    dir: &Path,
    cache_bytes: u64,
    meta: Arc<dyn BlockFile>,
    scratch: Option<tempfile::TempDir>,
) -> Result<FjallStore> {
    Ok(FjallStore {
        engine: Guarded::open(S, || FjallInner::open(dir, cache_bytes))?,
        dir: dir.to_path_buf(),
        meta,
        writes: AtomicU64::new(0),
        syncs: AtomicU64::new(0),
        bytes_written: AtomicU64::new(0),
        _scratch: scratch,
    })
}

/// A private copy of the tables to open for inspection, so that `status`
/// and `check` leave the device's own files as they were.
fn inspection_copy(dir: &Path) -> Result<tempfile::TempDir> {
    let copy = tempfile::Builder::new()
        .prefix("dedup-inspect-")
        .tempdir()
        .map_err(|e| Error::io("making a scratch directory to inspect the lsm tables", e))?;
    copy_tree(dir, copy.path())?;
    Ok(copy)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let what = || format!("copying {} to inspect it", from.display());
    std::fs::create_dir_all(to).context(what)?;
    for e in std::fs::read_dir(from).context(what)? {
        let e = e.context(what)?;
        let target = to.join(e.file_name());
        if e.file_type().context(what)?.is_dir() {
            copy_tree(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), &target).context(what)?;
        }
    }
    Ok(())
}

fn need_dir(dir: Option<&Path>) -> Result<&Path> {
    dir.ok_or_else(|| {
        Error::InvalidArgument(
            "the lsm backend keeps its tables in a directory next to the metadata file; \
             give the metadata as a file path (not a block device)"
                .into(),
        )
    })
}

pub fn format(
    cfg: &DeviceConfig,
    meta: Arc<dyn BlockFile>,
    params: &BackendParams,
    dir: Option<&Path>,
) -> Result<()> {
    let dir = need_dir(dir)?;
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::Exists {
            path: dir.to_path_buf(),
        });
    }

    // The tables hold the device's map and fingerprints: owner-only, like
    // the metadata file. fjall creates its files with the process's umask,
    // so those it made here are narrowed after it closes; while served,
    // the plugin's umask (077) covers the ones it makes later, and the
    // directory being 0700 covers any made by an offline gc or check.
    if dir.exists() {
        std::fs::set_permissions(
            dir,
            std::os::unix::fs::PermissionsExt::from_mode(crate::perms::DIR_MODE),
        )
    } else {
        crate::perms::create_dir_all(dir)
    }
    .map_err(|e| Error::io(format!("creating {} owner-only", dir.display()), e))?;
    let mut store = open_store(dir, params.cache_bytes, meta.clone())?;
    store.apply(&Changes::default(), &StoreState::default())?;
    store.close()?;
    crate::perms::restrict_tree(dir)
        .map_err(|e| Error::io(format!("making {} owner-only", dir.display()), e))?;
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = params.encode();
    sb.write(meta.as_ref())
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let params = BackendParams::decode(&superblock.backend_area)?;
    let dir: PathBuf = need_dir(opts.aux_dir.as_deref())?.to_path_buf();
    if !dir.is_dir() {
        return Err(Error::foreign(
            &dir,
            "the lsm tables are missing (was the .lsm directory moved or deleted?)",
        ));
    }
    let meta: Arc<dyn BlockFile> = Arc::from(meta);
    if superblock.state == DeviceState::Clean {
        // fjall may abort on some damaged files: check them first.
        sums::verify(meta.as_ref(), &dir)?;
    }
    let cache = opts.cache_bytes.unwrap_or(params.cache_bytes);
    let store = if opts.writable {
        open_store(&dir, cache, meta.clone())?
    } else {
        let copy = inspection_copy(&dir)?;
        let path = copy.path().to_path_buf();
        open_store_in(&path, cache, meta.clone(), Some(copy))?
    };
    let backend: Box<dyn MetadataBackend> = Box::new(KvBackend::open(
        NAME,
        store,
        superblock,
        Box::new(meta),
        params.txn_writes,
        cache,
        opts.writable,
    )?);
    Ok(Opened {
        backend,
        rolled_back: false,
    })
}
