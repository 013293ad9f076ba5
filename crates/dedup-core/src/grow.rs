//! Growing a stopped device: a larger logical size (what clients see, as
//! `vdo growLogical`) or more data space (`vdo growPhysical`, after
//! `lvextend` of the data device or on a file that simply gets longer).
//!
//! NBD clients (the kernel's nbd, nbdfuse, qemu) learn the export's size
//! when they connect and do not follow a change on a live connection, so
//! a device grows while it is stopped: stop the server, grow, serve again,
//! then grow the filesystem (`resize2fs`).
//!
//! Two ways, by store (`registry::resize`):
//! - **In place** (cowbtree, lsm): their keys are LBNs and (block, slot)
//!   addresses, and no table is sized by the device, so the new sizes are
//!   written into both superblock slots and nothing else changes.
//! - **Copy** (sparse, disktable, inram): their tables are dense arrays laid
//!   out by the sizes (and sparse's packed-fragment addresses follow the
//!   block count), so every mapping, fingerprint and count is copied into a
//!   new store of the new sizes, in a new file beside the old. Renaming it
//!   over the old one is the commit: a crash before leaves the old device
//!   as it was (the next grow removes the half-made copy), after leaves
//!   the new one. Its superblock takes a generation above the old one's, so
//!   the data device's record (`generation.rs`) accepts it.
//!
//! The data device gets longer first; the extra bytes are unused space to
//! the old metadata, so a crash there loses nothing either. Data never
//! moves: a chunk keeps its block, only how the store numbers the block's
//! slots may change.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend::{MetadataBackend, ScanCursor};
use crate::blockfile::overlay::Overlay;
use crate::blockfile::{BlockFile, FileBlockFile};
use crate::config::{DeviceConfig, Pbn};
use crate::error::{Error, IoContext, Result};
use crate::layout::{is_block_device, DevicePaths};
use crate::lock::DeviceLock;
use crate::options::{BackendParams, OpenOptions};
use crate::registry::{self, Resize};
use crate::size::format_size;
use crate::superblock::{DeviceState, Superblock};

/// What to grow to; `None` keeps a size.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrowOptions {
    /// New logical size, bytes.
    pub size: Option<u64>,
    /// New data capacity, bytes (the overwrite reserve `create` adds on a
    /// file comes on top, as there).
    pub physical_size: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct GrowReport {
    pub logical_size_before: u64,
    pub logical_size: u64,
    pub physical_size_before: u64,
    pub physical_size: u64,
    /// "in place" or "copied".
    pub method: &'static str,
    /// Entries copied (LBN mappings, then chunks); 0 in place.
    pub lbns_copied: u64,
    pub chunks_copied: u64,
    pub seconds: f64,
    /// The new configuration.
    pub config: DeviceConfig,
    /// What the grown device costs in metadata and RAM (sparse).
    pub sizing: Option<crate::backends::sparse::Sizing>,
}

/// Grow the stopped device in `dir`. `progress(done, total)` follows the
/// copy (entries; total is an estimate from the recorded totals).
pub fn grow(dir: &Path, opts: &GrowOptions, progress: &dyn Fn(u64, u64)) -> Result<GrowReport> {
    let started = Instant::now();
    let paths = DevicePaths::from_dir(dir)?;
    let _lock = DeviceLock::acquire(&paths.meta)
        .and_then(|l| l.and(&paths.data))
        .map_err(|e| match Error::from(e) {
            Error::Locked { .. } => Error::InvalidArgument(format!(
                "{} is open (being served?): stop it first. NBD clients do not see a size change on a live connection, so a device grows while stopped: stop `dedup serve`, run `dedup grow`, serve again, then grow the filesystem (resize2fs)",
                dir.display()
            )),
            e => e,
        })?;
    let meta = FileBlockFile::open(&paths.meta, true)?;
    let data = FileBlockFile::open(&paths.data, true)?;
    let mut sb = Superblock::read(&meta, &paths.meta)?;
    sb.check_data(&data, &paths.meta, &paths.data)?;
    if sb.state != DeviceState::Clean {
        return Err(Error::InvalidArgument(format!(
            "{} was not stopped cleanly; serve it once and stop it (crash-safe backends recover on their own), or run `dedup check --repair {}`, then grow it",
            dir.display(),
            dir.display()
        )));
    }
    let old = sb.config.clone();
    let new = grown_config(&old, opts, is_block_device(&paths.data))?;
    let resize = registry::resize(&old)?;
    if let Resize::No(why) = resize {
        return Err(Error::Unsupported(format!(
            "the {} backend cannot grow: {why}. Make a new device of the size you need and copy the data over (nbdcopy)",
            old.backend
        )));
    }
    let params = registry::recorded_params(&sb)?;
    let (method, lbns, chunks) = match resize {
        Resize::InPlace => {
            extend_data(&data, &paths.data, &new)?;
            rewrite_config(&meta, sb, &new)?;
            ("in place", 0, 0)
        }
        _ => {
            let (lbns, chunks) =
                copy_into_new_store(&paths, meta, data, sb, &new, &params, progress)?;
            ("copied", lbns, chunks)
        }
    };
    Ok(GrowReport {
        logical_size_before: old.logical_size,
        logical_size: new.logical_size,
        physical_size_before: old.physical_size(),
        physical_size: new.physical_size(),
        method,
        lbns_copied: lbns,
        chunks_copied: chunks,
        seconds: started.elapsed().as_secs_f64(),
        sizing: registry::sizing(&new, &params),
        config: new,
    })
}

/// The configuration after growing: sizes only ever grow.
fn grown_config(
    old: &DeviceConfig,
    opts: &GrowOptions,
    data_is_block_device: bool,
) -> Result<DeviceConfig> {
    let chunk = old.chunk_size as u64;
    let mut new = old.clone();
    if let Some(size) = opts.size {
        if size < old.logical_size {
            return Err(Error::InvalidArgument(format!(
                "--size {} is smaller than the device's {}: grow never shrinks a device (that would drop the data mapped beyond the new end)",
                format_size(size),
                format_size(old.logical_size)
            )));
        }
        new.logical_size = size;
    }
    if let Some(physical) = opts.physical_size {
        if physical % chunk != 0 {
            return Err(Error::InvalidArgument(format!(
                "--physical-size {physical} is not a multiple of the chunk size {chunk}"
            )));
        }
        let reserve = if data_is_block_device {
            0
        } else {
            crate::engine::overwrite_reserve_chunks(old.chunk_size)
        };
        let chunks = physical / chunk + reserve;
        if chunks < old.physical_chunks {
            return Err(Error::InvalidArgument(format!(
                "--physical-size {} is smaller than the device's {}: grow never shrinks a device",
                format_size(physical),
                format_size((old.physical_chunks - reserve.min(old.physical_chunks)) * chunk)
            )));
        }
        new.physical_chunks = chunks;
    }
    if new == *old {
        return Err(Error::InvalidArgument(format!(
            "nothing to grow: the device is already {} logical with {} of chunk space; give a larger --size or --physical-size",
            format_size(old.logical_size),
            format_size(old.physical_size())
        )));
    }
    new.validate()?;
    Ok(new)
}

/// Make the data device long enough for the new physical size. A block
/// device cannot be made longer here: it must have been grown first.
fn extend_data(data: &FileBlockFile, path: &Path, new: &DeviceConfig) -> Result<()> {
    let need = new.data_device_len();
    let have = data.len()?;
    if have >= need {
        return Ok(());
    }
    if is_block_device(path) {
        return Err(Error::InvalidArgument(format!(
            "the data device {} holds {have} bytes but {} bytes of chunk space need {need} (4 KiB of header on top): grow the block device first (lvextend), or give a --physical-size of at most {} bytes",
            path.display(),
            new.physical_size(),
            (have.saturating_sub(crate::config::DATA_OFFSET)) / new.chunk_size as u64 * new.chunk_size as u64
        )));
    }
    data.file()
        .set_len(need)
        .context(|| format!("growing {} to {need} bytes", path.display()))?;
    data.sync()
}

/// In place: the new sizes in both superblock slots (one would do, but
/// then a damaged newest slot would fall back to the old sizes).
fn rewrite_config(meta: &FileBlockFile, mut sb: Superblock, new: &DeviceConfig) -> Result<()> {
    sb.config = new.clone();
    sb.write(meta)?;
    sb.write(meta)
}

/// Where a chunk's address moves: the same block and slot, numbered by the
/// new store. Only sparse's packed layout numbers fragments after every
/// block, so its fragment addresses move when the block count does.
fn translate(old: &DeviceConfig, new: &DeviceConfig) -> impl Fn(Pbn) -> Result<Pbn> {
    let (from, to) = (old.addressing(), new.addressing());
    let packs = old.packs();
    let old_blocks = old.physical_chunks;
    move |pbn| {
        if !packs || from == to {
            return Ok(pbn);
        }
        let (block, slot) = from.split(pbn);
        if block >= old_blocks {
            return Err(Error::corrupt(
                "chunk address",
                format!("PBN {pbn} names block {block}, beyond the device's {old_blocks}; run `dedup check --repair` first"),
            ));
        }
        Ok(to.addr(block, slot))
    }
}

/// Copy every mapping, chunk record and count of the old store into a new
/// store of the new sizes, then rename it over the old metadata.
/// Returns (LBNs, chunks) copied.
fn copy_into_new_store(
    paths: &DevicePaths,
    meta: FileBlockFile,
    data: FileBlockFile,
    sb: Superblock,
    new: &DeviceConfig,
    params: &BackendParams,
    progress: &dyn Fn(u64, u64),
) -> Result<(u64, u64)> {
    let target =
        fs::canonicalize(&paths.meta).context(|| format!("resolving {}", paths.meta.display()))?;
    if is_block_device(&target) {
        return Err(Error::Unsupported(format!(
            "the {} backend grows by writing its metadata anew beside the old and renaming it over it, which a block device ({}) cannot take; make a new device of the size you need and copy the data over (nbdcopy)",
            sb.config.backend,
            target.display()
        )));
    }
    let staging = staging_path(&target);
    match fs::remove_file(&staging) {
        Ok(()) => tracing::info!("removed {} left by an interrupted grow", staging.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("removing {}", staging.display()), e)),
    }
    let old_generation = sb.generation;
    let old = sb.config.clone();
    let read_only = OpenOptions {
        writable: false,
        // The copy scans the chunk records; an index would be wasted.
        open_warm_records: Some(0),
        ..Default::default()
    };
    // A copy that fails (a full disk) is removed, not left for the next grow.
    let undo = crate::layout::Undo::removing(staging.clone());
    let old_meta: Arc<dyn BlockFile> = Arc::new(Overlay::new(meta));
    let mut from = registry::open_store_of(sb, old_meta, &read_only)?;
    let new_meta = make_staging(&staging, new, params)?;
    // Longer data only now that nothing can refuse for want of room, and
    // before the new metadata, which names the new blocks, is renamed in.
    extend_data(&data, &paths.data, new)?;
    let sb_new = Superblock::read(new_meta.as_ref(), &staging)?;
    let writable = OpenOptions {
        writable: true,
        ..Default::default()
    };
    let mut to = registry::open_store_of(sb_new, new_meta.clone(), &writable)?;
    let copied = copy(from.as_mut(), to.as_mut(), translate(&old, new), progress)?;
    to.close(from.private_data())?;
    drop((from, to, new_meta, data));
    keep_owner_and_mode(&target, &staging)?;
    // A generation above the old metadata's in both slots: the data
    // device's record is at most the old one's.
    let staged = FileBlockFile::open(&staging, true)?;
    let mut sb_new = Superblock::read(&staged, &staging)?;
    sb_new.generation = sb_new.generation.max(old_generation);
    sb_new.write(&staged)?;
    sb_new.write(&staged)?;
    drop(staged);
    fs::rename(&staging, &target)
        .context(|| format!("renaming {} over {}", staging.display(), target.display()))?;
    undo.disarm();
    let parent = target.parent().unwrap_or(Path::new("."));
    fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .context(|| format!("syncing directory {}", parent.display()))?;
    Ok(copied)
}

/// The new metadata takes the old file's owner, group and mode, so a grow
/// run as root does not leave a service user's device unopenable.
fn keep_owner_and_mode(old: &Path, new: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(old).context(|| format!("reading the owner of {}", old.display()))?;
    std::os::unix::fs::chown(new, Some(m.uid()), Some(m.gid()))
        .context(|| format!("giving {} the owner of {}", new.display(), old.display()))?;
    fs::set_permissions(new, m.permissions())
        .context(|| format!("giving {} the mode of {}", new.display(), old.display()))
}

fn staging_path(target: &Path) -> PathBuf {
    let mut name = target
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".grow");
    target.with_file_name(name)
}

/// A new metadata file laid out for `new`, with the old store's parameters.
fn make_staging(
    path: &Path,
    new: &DeviceConfig,
    params: &BackendParams,
) -> Result<Arc<dyn BlockFile>> {
    let space = registry::metadata_space(new)?;
    let file = FileBlockFile::create(path, space.len)?;
    if !space.grows {
        crate::layout::reserve_space(&file, path, space.len).map_err(|e| match e {
            Error::InvalidArgument(_) => Error::InvalidArgument(format!(
                "not enough free space for the grown metadata {} ({}), which is written beside the old before it replaces it: free some space and grow again; the device is unchanged",
                path.display(),
                format_size(space.len)
            )),
            e => e,
        })?;
    }
    let file: Arc<dyn BlockFile> = Arc::new(file);
    registry::format(new, file.clone(), params, None)?;
    Ok(file)
}

/// Entries read from the old store per scan page.
const PAGE: usize = 4096;

/// Chunks first (count, then fingerprint), then the LBN map; a mapped
/// chunk without a fingerprint (none after a clean stop, but cheap to
/// cover) gets its count with its first mapping. Commits as the new
/// store asks, so its journal and dirty cache stay bounded.
fn copy(
    from: &mut dyn MetadataBackend,
    to: &mut dyn MetadataBackend,
    translate: impl Fn(Pbn) -> Result<Pbn>,
    progress: &dyn Fn(u64, u64),
) -> Result<(u64, u64)> {
    let private = from.private_data().to_vec();
    let totals = crate::record::Record::decode(&private, 0)
        .totals
        .unwrap_or_default();
    let total = totals.lbns_mapped + totals.hash_entries;
    let mut done = 0u64;
    let mut step = |to: &mut dyn MetadataBackend, n: u64| -> Result<()> {
        done += n;
        progress(done, total.max(done));
        if to.wants_commit() {
            to.commit(&private)?;
        }
        Ok(())
    };
    let mut chunks = 0u64;
    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = from.hash_index_scan(&c, PAGE, &mut page)?;
        for (fp, pbn) in &page {
            let count = from.refcount_get(*pbn)?;
            let at = translate(*pbn)?;
            if count > 0 {
                to.refcount_set(at, count)?;
            }
            to.hash_index_insert(fp, at)?;
        }
        chunks += page.len() as u64;
        step(to, page.len() as u64)?;
    }
    let mut lbns = 0u64;
    let mut page = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        page.clear();
        cursor = from.lbn_map_scan(&c, PAGE, &mut page)?;
        for (lbn, pbn) in &page {
            let at = translate(*pbn)?;
            to.lbn_map_insert(*lbn, at)?;
            if to.refcount_get(at)? == 0 {
                to.refcount_set(at, from.refcount_get(*pbn)?.max(1))?;
            }
        }
        lbns += page.len() as u64;
        step(to, page.len() as u64)?;
    }
    Ok((lbns, chunks))
}
