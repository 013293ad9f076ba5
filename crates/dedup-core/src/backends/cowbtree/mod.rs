//! cowbtree backend (Dmdedup §2.6.3, CBT): the LBN map, hash index and
//! reference counts in a transactional copy-on-write B-tree (redb), on the
//! metadata device after our superblock. A commit is one redb transaction
//! with immediate durability: after a crash the metadata is exactly the
//! last committed transaction. Transactions end on FLUSH/FUA, after
//! `txn_writes` writes (default 1000, as the paper; 1 = every write; 0 =
//! only flushes and cache pressure), or when the write set fills 3/4 of
//! the cache budget.

mod region;

use std::sync::Arc;

use redb::{Database, ReadOnlyTable, ReadableDatabase, TableDefinition};

use crate::backend::{MetaIoStats, MetadataBackend};
use crate::backends::kv::guard::Guarded;
use crate::backends::kv::store::{check_entry, entry_crc, Changes, KvStore, StoreState, Table};
use crate::backends::kv::KvBackend;
use crate::backends::{BackendParams, OpenOptions, Opened};
use crate::blockfile::BlockFile;
use crate::config::{DeviceConfig, Lbn, Pbn};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::superblock::Superblock;

use region::{IoCounters, Region};

pub const NAME: &str = "cowbtree";

// Values carry a crc32c of table, key and value (see `kv/store.rs`).
const LBN_MAP: TableDefinition<u64, (u64, u32)> = TableDefinition::new("lbn_map");
const HASH_INDEX: TableDefinition<[u8; 32], (u64, u32)> = TableDefinition::new("hash_index");
const REFCOUNTS: TableDefinition<u64, (u32, u32)> = TableDefinition::new("refcounts");
const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");
const STATE_KEY: &str = "state";
const S: &str = "cowbtree B-tree";

fn lbn_value(lbn: Lbn, (pbn, crc): (u64, u32)) -> Result<Pbn> {
    check_entry(NAME, Table::LbnMap, &lbn.to_le_bytes(), pbn, crc)
}

fn hash_value(fp: &[u8; 32], (pbn, crc): (u64, u32)) -> Result<Pbn> {
    check_entry(NAME, Table::HashIndex, fp, pbn, crc)
}

fn ref_value(pbn: Pbn, (count, crc): (u32, u32)) -> Result<u32> {
    check_entry(
        NAME,
        Table::Refcounts,
        &pbn.to_le_bytes(),
        count as u64,
        crc,
    )
    .map(|c| c as u32)
}

fn db_err(e: impl Into<redb::Error>) -> Error {
    match e.into() {
        redb::Error::Io(io) => Error::io("cowbtree metadata I/O", io),
        e @ redb::Error::Corrupted(_) => Error::corrupt(S, format!("{e}; {}", super::NOT_REBUILT)),
        other => Error::corrupt(S, other.to_string()),
    }
}

/// Committed-state views, refreshed after every commit.
struct Snapshot {
    lbn_map: ReadOnlyTable<u64, (u64, u32)>,
    hash_index: ReadOnlyTable<[u8; 32], (u64, u32)>,
    refcounts: ReadOnlyTable<u64, (u32, u32)>,
    state: ReadOnlyTable<&'static str, &'static [u8]>,
}

/// The engine, behind a guard (see `kv/guard.rs`).
pub struct RedbStore {
    engine: Guarded<RedbInner>,
    io: Arc<IoCounters>,
    file: Arc<dyn BlockFile>,
}

struct RedbInner {
    db: Database,
    snap: Option<Snapshot>,
}

fn build(cache_bytes: u64, region: Region) -> Result<Database> {
    redb::Builder::new()
        .set_cache_size(cache_bytes as usize)
        .create_with_backend(region)
        .map_err(db_err)
}

impl RedbInner {
    fn snapshot(&mut self) -> Result<&Snapshot> {
        if self.snap.is_none() {
            let txn = self.db.begin_read().map_err(db_err)?;
            self.snap = Some(Snapshot {
                lbn_map: txn.open_table(LBN_MAP).map_err(db_err)?,
                hash_index: txn.open_table(HASH_INDEX).map_err(db_err)?,
                refcounts: txn.open_table(REFCOUNTS).map_err(db_err)?,
                state: txn.open_table(STATE).map_err(db_err)?,
            });
        }
        Ok(self.snap.as_ref().expect("just opened"))
    }

    fn scan_lbn(
        &mut self,
        after: Option<Lbn>,
        max: usize,
        out: &mut Vec<(Lbn, Pbn)>,
    ) -> Result<()> {
        let snap = self.snapshot()?;
        let range = match after {
            Some(a) => snap
                .lbn_map
                .range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => snap.lbn_map.range::<u64>(..),
        }
        .map_err(db_err)?;
        for entry in range.take(max) {
            let (k, v) = entry.map_err(db_err)?;
            out.push((k.value(), lbn_value(k.value(), v.value())?));
        }
        Ok(())
    }

    fn scan_hash(
        &mut self,
        after: Option<&Fingerprint>,
        max: usize,
        out: &mut Vec<(Fingerprint, Pbn)>,
    ) -> Result<()> {
        let snap = self.snapshot()?;
        let range = match after {
            Some(a) => snap
                .hash_index
                .range((std::ops::Bound::Excluded(a.0), std::ops::Bound::Unbounded)),
            None => snap.hash_index.range::<[u8; 32]>(..),
        }
        .map_err(db_err)?;
        for entry in range.take(max) {
            let (k, v) = entry.map_err(db_err)?;
            out.push((Fingerprint(k.value()), hash_value(&k.value(), v.value())?));
        }
        Ok(())
    }

    fn for_each_refcount(&mut self, f: &mut dyn FnMut(Pbn, u32) -> Result<()>) -> Result<()> {
        let snap = self.snapshot()?;
        for entry in snap.refcounts.range::<u64>(..).map_err(db_err)? {
            let (k, v) = entry.map_err(db_err)?;
            f(k.value(), ref_value(k.value(), v.value())?)?;
        }
        Ok(())
    }

    fn state(&mut self) -> Result<StoreState> {
        let snap = self.snapshot()?;
        match snap.state.get(STATE_KEY).map_err(db_err)? {
            Some(v) => StoreState::decode(v.value(), "cowbtree state record"),
            None => Ok(StoreState::default()),
        }
    }

    fn apply(&mut self, changes: &Changes, state: &StoreState) -> Result<()> {
        // Let redb free the pages only the old snapshot still uses.
        self.snap = None;
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut lbn_map = txn.open_table(LBN_MAP).map_err(db_err)?;
            for (&lbn, v) in &changes.lbn_map {
                match v {
                    Some(pbn) => {
                        let crc = entry_crc(Table::LbnMap, &lbn.to_le_bytes(), *pbn);
                        lbn_map.insert(lbn, (*pbn, crc)).map(|_| ())
                    }
                    None => lbn_map.remove(lbn).map(|_| ()),
                }
                .map_err(db_err)?;
            }
            let mut hash_index = txn.open_table(HASH_INDEX).map_err(db_err)?;
            for (fp, v) in &changes.hash_index {
                match v {
                    Some(pbn) => {
                        let crc = entry_crc(Table::HashIndex, &fp.0, *pbn);
                        hash_index.insert(fp.0, (*pbn, crc)).map(|_| ())
                    }
                    None => hash_index.remove(fp.0).map(|_| ()),
                }
                .map_err(db_err)?;
            }
            let mut refcounts = txn.open_table(REFCOUNTS).map_err(db_err)?;
            for (&pbn, &count) in &changes.refcounts {
                if count == 0 {
                    refcounts.remove(pbn).map(|_| ())
                } else {
                    let crc = entry_crc(Table::Refcounts, &pbn.to_le_bytes(), count as u64);
                    refcounts.insert(pbn, (count, crc)).map(|_| ())
                }
                .map_err(db_err)?;
            }
            let mut st = txn.open_table(STATE).map_err(db_err)?;
            st.insert(STATE_KEY, state.encode().as_slice())
                .map_err(db_err)?;
        }
        txn.commit().map_err(db_err)
    }
}

impl KvStore for RedbStore {
    fn get_lbn(&mut self, lbn: Lbn) -> Result<Option<Pbn>> {
        self.engine.with(|i| {
            let v = i.snapshot()?.lbn_map.get(lbn).map_err(db_err)?;
            v.map(|v| lbn_value(lbn, v.value())).transpose()
        })
    }

    fn get_hash(&mut self, fp: &Fingerprint) -> Result<Option<Pbn>> {
        self.engine.with(|i| {
            let v = i.snapshot()?.hash_index.get(fp.0).map_err(db_err)?;
            v.map(|v| hash_value(&fp.0, v.value())).transpose()
        })
    }

    fn get_refcount(&mut self, pbn: Pbn) -> Result<u32> {
        self.engine.with(|i| {
            let v = i.snapshot()?.refcounts.get(pbn).map_err(db_err)?;
            v.map_or(Ok(0), |v| ref_value(pbn, v.value()))
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
        self.engine.with(|i| i.state())
    }

    fn apply(&mut self, changes: &Changes, state: &StoreState) -> Result<()> {
        self.engine.with(|i| i.apply(changes, state))
    }

    fn close(&mut self) -> Result<()> {
        self.engine.with(|i| {
            i.snap = None;
            Ok(())
        })
    }

    fn io_stats(&self) -> MetaIoStats {
        let mut stats = self.io.snapshot();
        if let Some(inner) = self.engine.peek() {
            let cache = inner.db.cache_stats();
            stats.cache_hits = cache.read_hits() + cache.write_hits();
            stats.cache_misses = cache.read_misses() + cache.write_misses();
        }
        stats
    }

    fn size_bytes(&self) -> u64 {
        self.file.len().unwrap_or(0)
    }
}

/// Room the B-tree may grow into (None: the metadata file grows as needed).
fn capacity(meta: &dyn BlockFile) -> Result<Option<u64>> {
    Ok(meta
        .capacity()?
        .map(|cap| cap.saturating_sub(region::REGION_START)))
}

/// Lay out an empty cowbtree metadata device.
pub fn format(cfg: &DeviceConfig, meta: Box<dyn BlockFile>, params: &BackendParams) -> Result<()> {
    let mut sb = Superblock::new(cfg.clone());
    sb.backend_area = params.encode();
    let meta: Arc<dyn BlockFile> = Arc::from(meta);
    let cap = capacity(meta.as_ref())?;
    let region = Region::create(meta.clone(), Arc::default(), cap)?;
    let db = build(params.cache_bytes, region)?;
    let txn = db.begin_write().map_err(db_err)?;
    {
        txn.open_table(LBN_MAP).map_err(db_err)?;
        txn.open_table(HASH_INDEX).map_err(db_err)?;
        txn.open_table(REFCOUNTS).map_err(db_err)?;
        let mut st = txn.open_table(STATE).map_err(db_err)?;
        st.insert(STATE_KEY, StoreState::default().encode().as_slice())
            .map_err(db_err)?;
    }
    txn.commit().map_err(db_err)?;
    drop(db);
    // The superblock last: a device is only a device once its tree exists.
    sb.write(meta.as_ref())
}

pub fn open(
    superblock: Superblock,
    meta: Box<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    let params = BackendParams::decode(&superblock.backend_area)?;
    let cache = opts.cache_bytes.unwrap_or(params.cache_bytes);
    let file: Arc<dyn BlockFile> = Arc::from(meta);
    let io = Arc::new(IoCounters::default());
    let region = Region::open(file.clone(), io.clone(), capacity(file.as_ref())?)?;
    if region.len() == 0 {
        return Err(Error::corrupt(
            S,
            "the B-tree was never created (interrupted `dedup create`?)",
        ));
    }
    let engine = Guarded::open(S, || {
        Ok(RedbInner {
            db: build(cache, region)?,
            snap: None,
        })
    })?;
    let store = RedbStore {
        engine,
        io,
        file: file.clone(),
    };
    let backend: Box<dyn MetadataBackend> = Box::new(KvBackend::open(
        NAME,
        store,
        superblock,
        Box::new(file),
        params.txn_writes,
        cache,
        opts.writable,
    )?);
    Ok(Opened {
        backend,
        rolled_back: false,
    })
}
