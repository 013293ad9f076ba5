//! The registry: the one place that builds a device's (metadata store ×
//! placement) pair from its configuration and decides whether it is
//! crash-safe. The engine sees only the two traits.

use std::sync::Arc;

use crate::backend::MetadataBackend;
use crate::backends::{
    cowbtree, disktable, inram, lsm, sparse, BackendParams, OpenOptions, Opened, WindowParams,
};
use crate::blockfile::written::{DataCheck, WrittenBlocks};
use crate::blockfile::BlockFile;
use crate::config::DeviceConfig;
use crate::error::{Error, Result};
use crate::kinds::{self, Kind, PlacementKind, StoreKind, ThinPolicy, KINDS};
use crate::placement::{packed, plain::Plain, thin, Placement};
use crate::record::Record;
use crate::superblock::{DeviceState, Superblock, SUPERBLOCK_AREA};

/// Names users can pick with `dedup create --backend`, in the table's order.
pub fn names() -> impl Iterator<Item = &'static str> + Clone {
    KINDS.iter().map(|k| k.name)
}

/// The names as a list for messages: "inram, disktable, ...".
fn name_list() -> String {
    names().collect::<Vec<_>>().join(", ")
}

pub const DEFAULT: &str = "sparse";

fn kind_of(name: &str) -> Result<&'static Kind> {
    kinds::kind(name).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "unknown backend {name:?}: choose one of {}",
            name_list()
        ))
    })
}

pub fn check_name(name: &str) -> Result<()> {
    kind_of(name).map(|_| ())
}

/// Whether a device of this backend recovers on its own after a crash.
pub fn crash_safe(name: &str) -> bool {
    kinds::kind(name).is_some_and(|k| k.crash_safe)
}

/// The metadata size benchmarks scale caches by (as Dmdedup §4.1 does):
/// one LBN map entry (8 bytes) per logical chunk, and per physical chunk a
/// reference count (4 bytes) and a hash table slot (40 bytes, 10 % spare).
pub fn metadata_reference_bytes(cfg: &DeviceConfig) -> u64 {
    cfg.logical_chunks() * 8 + cfg.physical_chunks * (4 + 44)
}

/// How much metadata device a backend needs at create time.
#[derive(Clone, Copy, Debug)]
pub struct MetaSpace {
    /// Bytes the device must hold now (files may grow later where `grows`).
    pub len: u64,
    /// Whether the metadata grows into a regular file as needed.
    pub grows: bool,
}

pub fn metadata_space(cfg: &DeviceConfig) -> Result<MetaSpace> {
    let kind = kind_of(&cfg.backend)?;
    let fixed = |len| MetaSpace { len, grows: false };
    Ok(match (kind.store, kind.placement) {
        (_, PlacementKind::Thin) => fixed(thin::placement::metadata_device_len(cfg)),
        (StoreKind::InRam, _) => fixed(inram::metadata_device_len(cfg)),
        (StoreKind::DiskTable, _) => fixed(disktable::metadata_device_len(cfg)),
        (StoreKind::Lsm, _) => fixed(SUPERBLOCK_AREA),
        // Address space in a sparse file: not reserved, it fills as written.
        (StoreKind::Sparse, _) => MetaSpace {
            len: sparse::metadata_device_len(cfg),
            grows: true,
        },
        (StoreKind::CowBtree, _) => MetaSpace {
            len: SUPERBLOCK_AREA + (1 << 20),
            grows: true,
        },
    })
}

/// What the device will cost in metadata and RAM, for stores whose costs
/// follow the data (sparse); `None` for the others, sized by the device.
pub fn sizing(cfg: &DeviceConfig, params: &BackendParams) -> Option<sparse::Sizing> {
    let kind = kinds::kind(&cfg.backend)?;
    (kind.store == StoreKind::Sparse).then(|| sparse::sizing(cfg, params))
}

/// Bytes the metadata device needs for this device (at create time).
pub fn metadata_device_len(cfg: &DeviceConfig) -> Result<u64> {
    metadata_space(cfg).map(|s| s.len)
}

/// Write an empty metadata layout (superblock included) for a new device.
/// `aux_dir` is where a store with files of its own (lsm) keeps them.
pub fn format(
    cfg: &DeviceConfig,
    meta: Arc<dyn BlockFile>,
    params: &BackendParams,
    aux_dir: Option<&std::path::Path>,
) -> Result<()> {
    let kind = kind_of(&cfg.backend)?;
    params.validate()?;
    if kind.placement == PlacementKind::Thin {
        check_window(params.window)?;
    }
    match kind.store {
        StoreKind::InRam => inram::format(cfg, meta.as_ref())?,
        StoreKind::DiskTable => disktable::format(cfg, meta.as_ref(), params)?,
        StoreKind::CowBtree => cowbtree::format(cfg, Box::new(meta.clone()), params)?,
        StoreKind::Lsm => lsm::format(cfg, meta.clone(), params, aux_dir)?,
        StoreKind::Sparse => sparse::format(cfg, meta.as_ref(), params)?,
    }
    if kind.placement == PlacementKind::Thin {
        thin::placement::format(cfg, meta.as_ref(), params, params.window)?;
    }
    Ok(())
}

fn check_window(window: WindowParams) -> Result<()> {
    if window.blocks == 0 || window.blocks > 4096 {
        return Err(Error::InvalidArgument(format!(
            "--window-blocks {} is out of range: give 1 to 4096 (default 32)",
            window.blocks
        )));
    }
    Ok(())
}

/// A device's store and placement, as the engine runs them.
pub struct Pair {
    pub store: Box<dyn MetadataBackend>,
    pub placement: Box<dyn Placement>,
    /// The engine's record as the store last committed it.
    pub record: Record,
    /// The engine must run commits even when they persist nothing of the
    /// store (thin's `ideal` ends its windows in them).
    pub commits: bool,
    /// The store rolled back to its last save after an unclean stop: the
    /// engine verifies the stored chunks before serving.
    pub rolled_back: bool,
    /// The placement recovered after an unclean stop and changed the
    /// tables: the engine commits before serving and moves its totals by
    /// (mapped LBNs, index entries).
    pub recovered: Option<(i64, i64)>,
    /// The data device's I/O must stay in program order (a crash test's
    /// disk): the engine runs no data sync on a helper thread.
    pub data_ordered: bool,
    /// What each commit wrote to the data device (journaled stores opened
    /// for writing): the engine has the placement keep the live blocks of
    /// it and hands them to `Upkeep::commit_beside_data`.
    pub written: Option<Arc<WrittenBlocks>>,
}

/// Open the store, then the placement over it.
pub fn open(
    mut superblock: Superblock,
    meta: Box<dyn BlockFile>,
    data: Arc<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Pair> {
    if let Some(cache) = opts.cache_bytes {
        BackendParams {
            cache_bytes: cache,
            ..BackendParams::default()
        }
        .validate()?;
    }
    let cfg = superblock.config.clone();
    let kind = kinds::kind(&cfg.backend).ok_or_else(|| {
        Error::Unsupported(format!(
            "this metadata uses the {:?} backend, which this dedup does not have (it has {})",
            cfg.backend,
            name_list()
        ))
    })?;
    let unclean = superblock.state == DeviceState::Open;
    if kind.policy == Some(ThinPolicy::Ideal) && unclean && opts.writable && !opts.accept_unclean {
        return Err(Error::Unclean {
            path: std::path::PathBuf::from(meta.describe()),
            backend: kind.name.into(),
        });
    }
    let meta: Arc<dyn BlockFile> = Arc::from(meta);
    let data_ordered = data.ordered_io();
    let (data, written) = check_data(&mut superblock, kind, data, opts.writable);
    let Opened {
        backend: mut store,
        rolled_back,
    } = open_store(kind, superblock, meta.clone(), opts)?;
    let mut recovered = None;
    let mut rolled_back = rolled_back;
    let (record, placement): (Record, Box<dyn Placement>) = match cfg.placement() {
        PlacementKind::Plain => (
            Record::decode(store.private_data(), 0),
            Box::new(Plain::new(&cfg, data, kind.crash_safe)),
        ),
        PlacementKind::Packed => (
            Record::decode(store.private_data(), 0),
            Box::new(packed::open(
                &cfg,
                data,
                store.as_mut(),
                opts.for_check,
                kind.crash_safe,
                opts.lean && !opts.writable && !opts.for_check && !rolled_back,
            )?),
        ),
        PlacementKind::Thin => {
            let record = Record::decode(store.private_data(), 1);
            let policy = match kind.policy {
                Some(ThinPolicy::Ordered) => thin::placement::Policy::Ordered,
                Some(ThinPolicy::Ideal) => thin::placement::Policy::Ideal,
                _ => thin::placement::Policy::Thin,
            };
            let t = thin::placement::open(
                &cfg,
                policy,
                meta,
                data,
                store.as_mut(),
                &record.placement,
                unclean,
                opts.writable,
            )?;
            rolled_back = policy == thin::placement::Policy::Ideal && unclean;
            recovered = t.recovered.then_some((t.mapped_delta, t.indexed_delta));
            (record, Box::new(t.placement))
        }
    };
    Ok(Pair {
        store,
        placement,
        record,
        commits: kind.crash_safe || kind.placement == PlacementKind::Thin,
        rolled_back,
        recovered,
        data_ordered,
        written,
    })
}

/// Give a journaled store the data device to check its last transaction
/// against (`blockfile/written.rs`), and, opened for writing, the data
/// device the placement gets: one that lists what each commit writes.
fn check_data(
    superblock: &mut Superblock,
    kind: &Kind,
    data: Arc<dyn BlockFile>,
    writable: bool,
) -> (Arc<dyn BlockFile>, Option<Arc<WrittenBlocks>>) {
    let cfg = &superblock.config;
    let journaled = matches!(kind.store, StoreKind::DiskTable | StoreKind::Sparse)
        && kind.placement != PlacementKind::Thin;
    if !journaled {
        return (data, None);
    }
    let block = cfg.chunk_size as usize;
    superblock.data_check = Some(DataCheck {
        data: data.clone(),
        block,
        first: cfg.pbn_offset(0),
    });
    if !writable {
        return (data, None);
    }
    let written = Arc::new(WrittenBlocks::new(data, block, cfg.pbn_offset(0)));
    (written.clone(), Some(written))
}

/// Open the metadata store alone, without a placement over it.
fn open_store(
    kind: &Kind,
    superblock: Superblock,
    meta: Arc<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Opened> {
    match kind.store {
        StoreKind::InRam => inram::open(superblock, Box::new(meta), opts),
        StoreKind::DiskTable => disktable::open(superblock, Box::new(meta), opts),
        StoreKind::CowBtree => cowbtree::open(superblock, Box::new(meta), opts),
        StoreKind::Lsm => lsm::open(superblock, Box::new(meta), opts),
        StoreKind::Sparse => sparse::open(superblock, Box::new(meta), opts),
    }
}

/// How a device's metadata follows a change of its sizes (`grow.rs`).
pub enum Resize {
    /// Nothing in the store depends on the sizes: rewriting the
    /// superblock's configuration is the whole change.
    InPlace,
    /// The store's tables are laid out by the sizes: the metadata is
    /// copied into a new store of the new sizes.
    Copy,
    /// Not possible (the reason, for the message).
    No(&'static str),
}

pub fn resize(cfg: &DeviceConfig) -> Result<Resize> {
    let kind = kind_of(&cfg.backend)?;
    Ok(match (kind.store, kind.placement) {
        (_, PlacementKind::Thin) => Resize::No(
            "thin keeps its metadata in the data blocks' windows, laid out by the device's sizes",
        ),
        // Keys by LBN and by (block, slot) address: no table is sized
        // by the device (the space map is rebuilt at open from the counts).
        (StoreKind::CowBtree | StoreKind::Lsm, _) => Resize::InPlace,
        (StoreKind::InRam | StoreKind::DiskTable | StoreKind::Sparse, _) => Resize::Copy,
    })
}

/// A store's parameters as recorded at create time, for a new store that
/// takes over from it.
pub fn recorded_params(sb: &Superblock) -> Result<BackendParams> {
    let kind = kind_of(&sb.config.backend)?;
    match kind.store {
        StoreKind::InRam => Ok(BackendParams::default()),
        StoreKind::Sparse => sparse::recorded_params(sb),
        _ => BackendParams::decode(&sb.backend_area),
    }
}

/// Open the store of an existing device alone (`grow.rs` copies from
/// one store into another).
pub fn open_store_of(
    superblock: Superblock,
    meta: Arc<dyn BlockFile>,
    opts: &OpenOptions,
) -> Result<Box<dyn MetadataBackend>> {
    let kind = kind_of(&superblock.config.backend)?;
    Ok(open_store(kind, superblock, meta, opts)?.backend)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_is_in_the_table() {
        assert!(crate::kinds::kind(super::DEFAULT).is_some());
        assert!(super::names().any(|n| n == super::DEFAULT));
    }
}
