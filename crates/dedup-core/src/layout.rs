//! The device directory: where a device's data and metadata live and how
//! they are created and opened. By default `DIR/data` and `DIR/meta` are
//! plain files; with explicit paths (files or block devices) they are
//! symlinks to those. `DIR/control.sock` exists while the device is served.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::backends::{self, BackendParams, OpenOptions};
use crate::blockfile::{BlockFile, FileBlockFile};
use crate::config::{DeviceConfig, DATA_OFFSET};
use crate::engine::Device;
use crate::error::{Error, IoContext, Result};
use crate::fingerprint::HashAlgo;
use crate::lock::DeviceLock;
use crate::size::format_size;
use crate::superblock::Superblock;

pub const DATA_NAME: &str = "data";
pub const META_NAME: &str = "meta";
pub const CONTROL_SOCKET_NAME: &str = "control.sock";

/// Where one device's two halves are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePaths {
    pub data: PathBuf,
    pub meta: PathBuf,
}

impl DevicePaths {
    /// The paths inside a device directory, which must hold a device.
    pub fn from_dir(dir: &Path) -> Result<DevicePaths> {
        let meta = dir.join(META_NAME);
        match fs::symlink_metadata(&meta) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::InvalidArgument(format!(
                    "{} is not a dedup device directory (it has no {META_NAME}); create one with `dedup create {} --size 10G`",
                    dir.display(),
                    dir.display()
                )))
            }
            // Not "no device here": the device may well be there, and
            // creating one would be the wrong advice.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Error::InvalidArgument(format!(
                    "permission denied looking up {}: the device directory is not yours to read; run as its owner (or root)",
                    meta.display()
                )))
            }
            Err(e) => return Err(Error::io(format!("looking up {}", meta.display()), e)),
        }
        Ok(DevicePaths {
            data: dir.join(DATA_NAME),
            meta,
        })
    }
}

#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// Logical size clients see.
    pub size: u64,
    /// Data device capacity; default: the data device's size if it exists
    /// already, else the logical size.
    pub physical_size: Option<u64>,
    pub backend: String,
    pub chunk_size: u32,
    pub hash: HashAlgo,
    pub verify: bool,
    /// Existing file or block device for data (else `DIR/data`).
    pub data: Option<PathBuf>,
    /// Existing file or block device for metadata (else `DIR/meta`).
    pub meta: Option<PathBuf>,
    /// Overwrite data/metadata devices that already hold a dedup device.
    pub force: bool,
    /// Backend tunables (cache, transaction length).
    pub params: BackendParams,
    /// How new chunks are compressed (default lz4).
    pub compression: crate::compress::Compression,
}

impl CreateOptions {
    pub fn new(size: u64) -> Self {
        CreateOptions {
            size,
            physical_size: None,
            backend: crate::registry::DEFAULT.to_string(),
            chunk_size: crate::config::DEFAULT_CHUNK_SIZE,
            hash: HashAlgo::Blake3,
            verify: false,
            compression: Default::default(),
            data: None,
            meta: None,
            force: false,
            params: BackendParams::default(),
        }
    }
}

pub(crate) fn is_block_device(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.file_type().is_block_device())
        .unwrap_or(false)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).context(|| format!("resolving {}", path.display()))
}

/// Files this `create` (or a `grow`: its staging copy) made, removed again
/// if it fails half-way; and the locks `create` holds on existing files it
/// lays the device out on, and the block devices it holds open
/// exclusively (nothing mounts them meanwhile).
#[derive(Default)]
pub(crate) struct Undo(Vec<PathBuf>, Vec<DeviceLock>, Vec<fs::File>);

impl Undo {
    /// Remove `path` if dropped before `disarm`.
    pub(crate) fn removing(path: PathBuf) -> Undo {
        Undo(vec![path], Vec::new(), Vec::new())
    }

    pub(crate) fn disarm(mut self) {
        self.0.clear();
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = fs::remove_file(p).or_else(|_| fs::remove_dir_all(p));
        }
    }
}

/// Prepare one half: an explicit path (existing or new file, or block
/// device) or a new file in the directory. Returns the open file. With
/// `reserve`, a regular file gets its blocks allocated now, so that saving
/// metadata later can never fail for lack of space on the host filesystem.
fn prepare(
    explicit: Option<&Path>,
    in_dir: &Path,
    min_len: u64,
    what: &str,
    force: bool,
    reserve: bool,
    undo: &mut Undo,
) -> Result<FileBlockFile> {
    let Some(path) = explicit else {
        let f = FileBlockFile::create(in_dir, min_len)?;
        undo.0.push(in_dir.to_path_buf());
        if reserve {
            reserve_space(&f, in_dir, min_len)?;
        }
        return Ok(f);
    };
    let path = absolute(path)?;
    let file = if path.exists() {
        // A served device holds this lock on both halves: never overwritten,
        // --force or not. Held until the new device is laid out.
        undo.1.push(DeviceLock::acquire(&path).map_err(|e| match Error::from(e) {
            Error::Locked { path } => Error::InvalidArgument(format!(
                "{} belongs to a device that is open (being served?); create never overwrites a device in use, even with --force: stop it first",
                path.display()
            )),
            e => e,
        })?);
        // Mounted, stacked on, or backing a loop device in use: never
        // overwritten, --force or not (mkfs refuses these too).
        undo.2.extend(crate::guard::not_in_use(&path)?);
        let f = FileBlockFile::open(&path, true)?;
        if !force {
            if let Some(held) = crate::guard::contents(&f)? {
                return Err(Error::InvalidArgument(format!(
                    "the {what} path {} already holds {held}; pass --force to overwrite it (what it holds is lost)",
                    path.display()
                )));
            }
        }
        let len = f.len()?;
        if len < min_len {
            if is_block_device(&path) {
                return Err(Error::InvalidArgument(format!(
                    "{what} device {} holds {} but needs {}: use a larger device or a smaller --size/--physical-size",
                    path.display(),
                    format_size(len),
                    format_size(min_len)
                )));
            }
            f.file()
                .set_len(min_len)
                .context(|| format!("growing {} to {min_len} bytes", path.display()))?;
        }
        f
    } else {
        let f = FileBlockFile::create(&path, min_len)?;
        undo.0.push(path.clone());
        f
    };
    if reserve && !is_block_device(&path) {
        reserve_space(&file, &path, min_len)?;
    }
    std::os::unix::fs::symlink(&path, in_dir)
        .context(|| format!("linking {} to {}", in_dir.display(), path.display()))?;
    undo.0.push(in_dir.to_path_buf());
    Ok(file)
}

pub(crate) fn reserve_space(f: &FileBlockFile, path: &Path, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate on a valid, owned descriptor; no memory is touched.
    let rc = unsafe { libc::posix_fallocate(f.file().as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        // Filesystems without fallocate: the file stays sparse.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        libc::ENOSPC => Err(Error::InvalidArgument(format!(
            "not enough free space for the metadata file {} ({}): free some space or put --meta elsewhere",
            path.display(),
            format_size(len)
        ))),
        e => Err(Error::io(
            format!("reserving {} for {}", format_size(len), path.display()),
            std::io::Error::from_raw_os_error(e),
        )),
    }
}

/// Create a new device in `dir`. Returns its configuration.
pub fn create(dir: &Path, opts: &CreateOptions) -> Result<DeviceConfig> {
    crate::registry::check_name(&opts.backend)?;
    crate::config::validate_chunk_size(opts.chunk_size)?;
    let meta_link = dir.join(META_NAME);
    let data_link = dir.join(DATA_NAME);
    let aux = backends::aux_dir(&meta_link);
    if fs::symlink_metadata(&meta_link).is_ok()
        || fs::symlink_metadata(&data_link).is_ok()
        || aux.exists()
    {
        return Err(Error::Exists {
            path: dir.to_path_buf(),
        });
    }
    if let (Some(data), Some(meta)) = (&opts.data, &opts.meta) {
        crate::guard::distinct(data, meta)?;
    }
    let mut undo = Undo::default();
    if !dir.exists() {
        crate::perms::create_dir_all(dir)
            .context(|| format!("creating directory {}", dir.display()))?;
        undo.0.push(dir.to_path_buf());
    }
    let chunk = opts.chunk_size as u64;
    let physical_size = match (opts.physical_size, &opts.data) {
        (Some(p), _) => p,
        (None, Some(path)) if path.exists() => {
            let len = FileBlockFile::open(path, false)?.len()?;
            if len > DATA_OFFSET {
                (len - DATA_OFFSET) / chunk * chunk
            } else {
                opts.size
            }
        }
        _ => opts.size,
    };
    // Room for overwrites in flight beyond what was asked for, except on
    // an existing data device whose size is taken as it is (and on any
    // block device, which cannot grow).
    let reserve = match (&opts.data, opts.physical_size) {
        (Some(path), _) if is_block_device(path) => 0,
        (Some(path), None) if path.exists() => 0,
        _ => crate::engine::overwrite_reserve_chunks(opts.chunk_size),
    };
    if physical_size % chunk != 0 {
        return Err(Error::InvalidArgument(format!(
            "the physical size {physical_size} is not a multiple of the chunk size {chunk}"
        )));
    }
    let cfg = DeviceConfig {
        uuid: *uuid::Uuid::new_v4().as_bytes(),
        backend: opts.backend.clone(),
        chunk_size: opts.chunk_size,
        hash: opts.hash,
        verify: opts.verify,
        logical_size: opts.size,
        physical_chunks: physical_size / chunk + reserve,
        compression: opts.compression,
    };
    cfg.validate()?;
    let data = prepare(
        opts.data.as_deref(),
        &data_link,
        cfg.data_device_len(),
        "data",
        opts.force,
        false,
        &mut undo,
    )?;
    opts.params.validate()?;
    let space = crate::registry::metadata_space(&cfg)?;
    let meta = prepare(
        opts.meta.as_deref(),
        &meta_link,
        space.len,
        "metadata",
        opts.force,
        !space.grows,
        &mut undo,
    )?;
    if cfg.backend == backends::lsm::NAME && is_block_device(&meta_link) {
        return Err(Error::InvalidArgument(
            "the lsm backend keeps its tables in files next to the metadata file: give --meta a file path, not a block device".into(),
        ));
    }
    undo.0.push(aux.clone());
    Device::format(
        &cfg,
        &data,
        std::sync::Arc::new(meta),
        &opts.params,
        Some(&aux),
    )?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .context(|| format!("syncing directory {}", dir.display()))?;
    undo.disarm();
    Ok(cfg)
}

/// Open a device for serving (or with `writable: false`, for inspection),
/// holding its lock until the device is dropped.
pub fn open(paths: &DevicePaths, opts: &OpenOptions) -> Result<Device> {
    // The data half too, so `create --force` can tell it is in use.
    let lock = DeviceLock::acquire(&paths.meta)?.and(&paths.data)?;
    let opts = &OpenOptions {
        aux_dir: opts
            .aux_dir
            .clone()
            .or_else(|| Some(backends::aux_dir(&paths.meta))),
        changes: Some(crate::options::ChangesAt {
            file: paths.meta.with_file_name(crate::changes::CHANGES_NAME),
            meta: paths.meta.clone(),
        }),
        ..opts.clone()
    };
    // To inspect, read-only: what the engines write while opening
    // (recovery) goes to a RAM overlay (`Engine::open`).
    let mut data = FileBlockFile::open(&paths.data, opts.writable)?;
    if opts.writable {
        data = data.with_early_writeback();
    }
    let meta = FileBlockFile::open(&paths.meta, opts.writable)?;
    Device::open(Box::new(data), Box::new(meta), opts, Some(lock))
}

/// Read a device's configuration without opening (or locking) it; refuse
/// metadata older than its data device's record (`generation.rs`), as
/// opening would, so `serve` says so before starting a server.
pub fn read_config(paths: &DevicePaths) -> Result<(DeviceConfig, crate::superblock::DeviceState)> {
    let meta = FileBlockFile::open(&paths.meta, false)?;
    let mut sb = Superblock::read(&meta, &paths.meta)?;
    let data = FileBlockFile::open(&paths.data, false)?;
    sb.check_data(&data, &paths.meta, &paths.data)?;
    Ok((sb.config, sb.state))
}
