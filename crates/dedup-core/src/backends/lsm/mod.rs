//! lsm backend: the LBN map, hash index and reference counts in a
//! log-structured merge tree (fjall), the log-structured backend Dmdedup's
//! future work names. fjall keeps its files in a directory next to the
//! metadata device (`DIR/meta.lsm`); our superblock stays in `DIR/meta`.
//!
//! Transactions are `KvBackend`'s: a commit is one fjall write batch,
//! atomic across the three keyspaces, persisted with `SyncAll`; fjall's
//! journal replays it after a crash.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::backend::{MetaIoStats, MetadataBackend};
use crate::backends::kv::store::{Changes, KvStore, StoreState};
use crate::backends::kv::KvBackend;
use crate::backends::{BackendParams, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::Superblock;

pub const NAME: &str = "lsm";
const S: &str = "lsm tables";
const STATE_KEY: &[u8] = b"state";

fn db_err(e: fjall::Error) -> Error {
    match e {
        fjall::Error::Io(io) => Error::io("lsm metadata I/O", io),
        other => Error::corrupt(S, other.to_string()),
    }
}

pub struct FjallStore {
    db: Database,
    lbn_map: Keyspace,
    hash_index: Keyspace,
    refcounts: Keyspace,
    state: Keyspace,
    writes: AtomicU64,
    syncs: AtomicU64,
    bytes_written: AtomicU64,
}

fn decode_u64(v: &[u8], what: &str) -> Result<u64> {
    v.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| Error::corrupt(S, format!("{what} value of {} bytes", v.len())))
}

impl FjallStore {
    fn open(dir: &Path, cache_bytes: u64) -> Result<FjallStore> {
        let db = Database::builder(dir)
            .cache_size(cache_bytes)
            .open()
            .map_err(db_err)?;
        let ks = |name: &str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(db_err)
        };
        Ok(FjallStore {
            lbn_map: ks("lbn_map")?,
            hash_index: ks("hash_index")?,
            refcounts: ks("refcounts")?,
            state: ks("state")?,
            db,
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
        })
    }
}

impl KvStore for FjallStore {
    fn get_lbn(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        match self.lbn_map.get(lbn.to_be_bytes()).map_err(db_err)? {
            Some(v) => decode_u64(&v, "LBN map").map(Some),
            None => Ok(None),
        }
    }

    fn get_hash(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        match self.hash_index.get(fp.0).map_err(db_err)? {
            Some(v) => decode_u64(&v, "hash index").map(Some),
            None => Ok(None),
        }
    }

    fn get_refcount(&mut self, pbn: Pbn) -> Result<u32> {
        match self.refcounts.get(pbn.to_be_bytes()).map_err(db_err)? {
            Some(v) => v
                .as_ref()
                .try_into()
                .map(u32::from_le_bytes)
                .map_err(|_| Error::corrupt(S, "refcount value of the wrong size")),
            None => Ok(0),
        }
    }

    fn scan_lbn(
        &mut self,
        after: Option<Lbn>,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<()> {
        let start = after.map_or(0, |a| a + 1);
        if after == Some(u64::MAX) {
            return Ok(());
        }
        for g in self.lbn_map.range(start.to_be_bytes()..).take(max) {
            let (k, v) = g.into_inner().map_err(db_err)?;
            let lbn = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| Error::corrupt(S, "LBN key of the wrong size"))?,
            );
            out.push((lbn, decode_u64(&v, "LBN map")?));
        }
        Ok(())
    }

    fn scan_hash(
        &mut self,
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
            out.push((Fingerprint(fp), decode_u64(&v, "hash index")?));
        }
        Ok(())
    }

    fn for_each_refcount(&mut self, f: &mut dyn FnMut(Pbn, u32) -> Result<()>) -> Result<()> {
        for g in self.refcounts.iter() {
            let (k, v) = g.into_inner().map_err(db_err)?;
            let pbn = u64::from_be_bytes(
                k.as_ref()
                    .try_into()
                    .map_err(|_| Error::corrupt(S, "PBN key of the wrong size"))?,
            );
            let count = u32::from_le_bytes(
                v.as_ref()
                    .try_into()
                    .map_err(|_| Error::corrupt(S, "refcount value of the wrong size"))?,
            );
            f(pbn, count)?;
        }
        Ok(())
    }

    fn state(&mut self) -> Result<StoreState> {
        match self.state.get(STATE_KEY).map_err(db_err)? {
            Some(v) => StoreState::decode(&v, "lsm state record"),
            None => Ok(StoreState::default()),
        }
    }

    fn apply(&mut self, changes: &Changes, state: &StoreState) -> Result<()> {
        let mut batch = self.db.batch().durability(Some(PersistMode::SyncAll));
        let mut bytes = 0u64;
        for (&lbn, v) in &changes.lbn_map {
            match v {
                Some(pbn) => batch.insert(&self.lbn_map, lbn.to_be_bytes(), pbn.to_le_bytes()),
                None => batch.remove(&self.lbn_map, lbn.to_be_bytes()),
            }
            bytes += 16;
        }
        for (fp, v) in &changes.hash_index {
            match v {
                Some(pbn) => batch.insert(&self.hash_index, fp.0, pbn.to_le_bytes()),
                None => batch.remove(&self.hash_index, fp.0),
            }
            bytes += 40;
        }
        for (&pbn, &count) in &changes.refcounts {
            if count == 0 {
                batch.remove(&self.refcounts, pbn.to_be_bytes());
            } else {
                batch.insert(&self.refcounts, pbn.to_be_bytes(), count.to_le_bytes());
            }
            bytes += 12;
        }
        let st = state.encode();
        bytes += st.len() as u64;
        batch.insert(&self.state, STATE_KEY, st);
        batch.commit().map_err(db_err)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        self.db.persist(PersistMode::SyncAll).map_err(db_err)
    }

    fn io_stats(&self) -> MetaIoStats {
        let (mut reads, mut hits, mut bytes_read) = (0u64, 0u64, 0u64);
        for ks in [&self.lbn_map, &self.hash_index, &self.refcounts] {
            let m = ks.metrics();
            reads += m.block_load_io_count() as u64;
            hits += m.block_load_cached_count() as u64;
            bytes_read += m.block_io();
        }
        MetaIoStats {
            reads,
            writes: self.writes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            bytes_read,
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            cache_hits: hits,
            cache_misses: reads,
        }
    }

    fn size_bytes(&self) -> u64 {
        self.db.disk_space().unwrap_or(0)
    }
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
    meta: &dyn BlockFile,
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
    let mut store = FjallStore::open(dir, params.cache_bytes)?;
    store.apply(&Changes::default(), &StoreState::default())?;
    store.close()?;
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = params.encode();
    sb.write(meta)
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
    let cache = opts.cache_bytes.unwrap_or(params.cache_bytes);
    let store = FjallStore::open(&dir, cache)?;
    let backend: Box<dyn MetadataBackend> = Box::new(KvBackend::open(
        NAME,
        store,
        superblock,
        meta,
        params.txn_writes,
        cache,
        opts.writable,
    )?);
    Ok(Opened {
        backend,
        rolled_back: false,
    })
}
