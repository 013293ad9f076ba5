//! dedup-nbd: the nbdkit plugin that serves a dedup device over NBD.
//!
//! Thin on purpose: nbdkit config keys become an open `Device`, and each NBD
//! callback becomes one `Device` call. All dedup logic lives in dedup-core.
//!
//! Keys: `dir=DIR` (a device directory; also the bare argument), or
//! `data=PATH meta=PATH` for explicit halves; `control=PATH` for the control
//! socket (default `DIR/control.sock`); `accept_unclean=true` to roll back
//! after an unclean stop; `record=FILE` to record every request as a
//! trace for `dedup replay`; `writeback=SIZE` for the write-back queue
//! (default 32M; 0 applies every write before acknowledging it).

mod record;

/// Write-back queue by default: enough to keep a one-request-at-a-time
/// client (loop over nbdfuse) from waiting on fingerprinting and
/// compression, small enough that a FLUSH waits well under a second.
const DEFAULT_WRITE_BACK: u64 = 32 << 20;
/// Writes from this size on are worth queueing: fio's 4 KiB random
/// writes at depth 16, queued when they happened to arrive alone, ran
/// 17-26 % slower (the hand-over cost more than the write), while ext4's
/// writeback over loop sends most of its bytes in larger requests.
const WRITE_BACK_FROM: u64 = 32 << 10;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use dedup_core::control::ControlServer;
use dedup_core::layout::{self, DevicePaths, CONTROL_SOCKET_NAME};
use dedup_core::{Device, OpenOptions};
use dedup_trace::Op;
use nbdkit::*;
use record::Recorder;

#[derive(Default)]
struct Settings {
    dir: Option<PathBuf>,
    data: Option<PathBuf>,
    meta: Option<PathBuf>,
    control: Option<PathBuf>,
    accept_unclean: bool,
    cache_bytes: Option<u64>,
    index_memory: Option<u64>,
    index_cache: Option<u64>,
    record: Option<PathBuf>,
    write_back_bytes: Option<u64>,
}

#[derive(Default)]
struct Served {
    device: Option<Arc<Device>>,
    control: Option<ControlServer>,
    recorder: Option<Arc<Recorder>>,
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    dir: None,
    data: None,
    meta: None,
    control: None,
    accept_unclean: false,
    cache_bytes: None,
    index_memory: None,
    index_cache: None,
    record: None,
    write_back_bytes: None,
});
static SERVED: Mutex<Served> = Mutex::new(Served {
    device: None,
    control: None,
    recorder: None,
});

/// A poisoned mutex only means another callback panicked; the data is fine.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn nbd_error(e: dedup_core::Error) -> Error {
    Error::new(e.errno(), e.to_string())
}

/// An open that failed for lack of room on the host filesystem, in plain
/// words: where, how much is free, and what to do. (Recovery and the first
/// commit write metadata blocks; a commit journals at most the metadata
/// cache's dirty blocks, then writes them in place: twice the cache.)
fn full_host_advice(e: dedup_core::Error, meta: &std::path::Path) -> dedup_core::Error {
    let dedup_core::Error::Io { cause, .. } = &e else {
        return e;
    };
    if cause.raw_os_error() != Some(libc::ENOSPC) {
        return e;
    }
    let dir = std::fs::canonicalize(meta)
        .ok()
        .and_then(|m| m.parent().map(|p| p.to_path_buf()))
        .unwrap_or_else(|| meta.to_path_buf());
    let free = free_bytes(&dir)
        .map(|b| format!(" ({} free)", dedup_core::size::format_size(b)))
        .unwrap_or_default();
    dedup_core::Error::InvalidArgument(format!(
        "the filesystem holding {}{free} is full: opening the device writes metadata there. \
         Free up to twice the metadata cache (--cache; 64M unless set at create, so 128 MB) \
         and run again; nothing was lost ({e})",
        dir.display()
    ))
}

/// Bytes an unprivileged writer may still use on the filesystem of `dir`.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct from a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Run one request. A panic (a bug) fails that request with EIO instead of
/// unwinding into nbdkit, which would abort the server and, for INRAM, lose
/// every mapping made since the last clean stop.
fn request<T>(what: &str, f: impl FnOnce() -> dedup_core::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(nbd_error),
        Err(_) => {
            tracing::error!(
                "internal error during {what}; the request failed: stop the server and run `dedup check`"
            );
            Err(Error::new(
                libc::EIO,
                format!("internal error during {what}"),
            ))
        }
    }
}

/// Stop the control socket and the recorder, save the metadata and mark
/// the device clean (with retries: a full filesystem may clear up).
fn save_and_close() {
    let mut served = lock(&SERVED);
    if let Some(control) = served.control.take() {
        control.stop();
    }
    if let Some(recorder) = served.recorder.take() {
        recorder.finish();
    }
    if let Some(device) = served.device.take() {
        let _ = close_with_retries(&device);
    }
}

/// Save the metadata and close: a failed save (say, a full filesystem
/// under the metadata file) may clear up, and the session's metadata is
/// worth a few retries.
fn close_with_retries(device: &Device) -> dedup_core::Result<()> {
    let mut attempt = 1;
    loop {
        match device.close() {
            Ok(()) => return Ok(()),
            // The metadata is saved; the stop only tells what was lost
            // (and a second close would find the device closed).
            Err(e @ dedup_core::Error::WritesLost { .. }) => {
                tracing::error!("{e}");
                return Err(e);
            }
            Err(e) if attempt < 5 => {
                tracing::error!("saving metadata failed (attempt {attempt} of 5), retrying: {e}");
                std::thread::sleep(std::time::Duration::from_secs(2));
                attempt += 1;
            }
            Err(e) => {
                let backend = &device.config().backend;
                let next = if dedup_core::registry::crash_safe(backend) {
                    format!("the {backend} store recovers from its journal at the next serve, which needs room on that filesystem too (no --accept-unclean needed)")
                } else {
                    format!("the {backend} store then needs `dedup serve --accept-unclean`, which rolls back to its last clean stop")
                };
                tracing::error!(
                    "saving metadata failed: {e}. Free space on the filesystem holding the metadata if it is full; {next}"
                );
                return Err(e);
            }
        }
    }
}

/// `Request::Save` (`dedup serve`'s second Ctrl-C while clients keep
/// nbdkit from unloading): the same clean stop as `unload`, but the
/// control server, which runs this, keeps running until then.
fn save_from_control(device: &Device) -> dedup_core::Result<()> {
    let recorder = lock(&SERVED).recorder.take();
    if let Some(r) = recorder {
        r.finish();
    }
    close_with_retries(device)
}

/// A callback outside the request path (start, stop): a panic fails it
/// with a message instead of unwinding into nbdkit's C code, which would
/// abort the process.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::new(
            libc::EIO,
            format!("internal error during {what}; stop the server and run `dedup check`"),
        ))
    })
}

fn einval(msg: String) -> Error {
    Error::new(libc::EINVAL, msg)
}

fn paths(s: &Settings) -> Result<DevicePaths> {
    match (&s.dir, &s.data, &s.meta) {
        (Some(dir), None, None) => DevicePaths::from_dir(dir).map_err(nbd_error),
        (None, Some(data), Some(meta)) => Ok(DevicePaths {
            data: data.clone(),
            meta: meta.clone(),
        }),
        _ => Err(einval(
            "give either dir=DIR (a directory made by `dedup create`) or both data=PATH and meta=PATH".into(),
        )),
    }
}

struct DedupPlugin {
    device: Arc<Device>,
    recorder: Option<Arc<Recorder>>,
}

impl DedupPlugin {
    /// Record a completed request without data (`record=FILE`).
    fn record(&self, op: Op, offset: u64, len: u64, fua: bool) {
        if let Some(r) = &self.recorder {
            r.other(op, offset, len, fua);
        }
    }
}

impl Server for DedupPlugin {
    fn name() -> &'static str {
        "dedup"
    }

    fn longname() -> Option<&'static str> {
        Some("dedup: inline deduplicating block device")
    }

    fn description() -> Option<&'static str> {
        Some("Serves a dedup device: identical chunks are stored once (see `dedup --help`).")
    }

    fn version() -> Option<&'static str> {
        Some(env!("CARGO_PKG_VERSION"))
    }

    /// nbdkit sets its umask to 022 before loading the plugin, so its pid
    /// file and the files the device makes while served (lsm's tables)
    /// would be readable by other users, and the NBD socket 0755. 077
    /// makes all of them owner-only from the moment they exist (`dedup
    /// serve` then sets the socket to exactly 0600); nbdkit is still
    /// single-threaded here, so nothing races the change.
    fn load() {
        // SAFETY: umask(2) cannot fail and touches no memory.
        unsafe { libc::umask(0o077) };
    }

    fn magic_config_key() -> Option<&'static str> {
        Some("dir")
    }

    fn config_help() -> Option<&'static str> {
        Some(
            "dir=DIR                 Device directory made by `dedup create` (required,\n\
             \x20                       unless data= and meta= are given).\n\
             data=PATH meta=PATH     Explicit data and metadata devices.\n\
             control=PATH            Control socket for `dedup status/gc` (default DIR/control.sock).\n\
             accept_unclean=BOOL     After an unclean stop, roll back to the last clean state.\n\
             cache=SIZE              Metadata cache size (overrides the one chosen at create).\n\
             record=FILE             Record every request as a trace (`dedup replay`).\n\
             writeback=SIZE          Acknowledge writes once queued in RAM, up to SIZE\n\
             \x20                       (default 32M; FLUSH/FUA wait for them); 0 = off.",
        )
    }

    fn config(key: &str, value: &str) -> Result<()> {
        let mut s = lock(&SETTINGS);
        match key {
            "dir" => s.dir = Some(PathBuf::from(value)),
            "data" => s.data = Some(PathBuf::from(value)),
            "meta" => s.meta = Some(PathBuf::from(value)),
            "control" => s.control = Some(PathBuf::from(value)),
            "accept_unclean" => s.accept_unclean = parse_bool(value)?,
            "cache" => s.cache_bytes = Some(parse_size(value)? as u64),
            "index_memory" => s.index_memory = Some(parse_size(value)? as u64),
            "index_cache" => s.index_cache = Some(parse_size(value)? as u64),
            "record" => s.record = Some(PathBuf::from(value)),
            "writeback" => s.write_back_bytes = Some(parse_size(value)? as u64),
            _ => {
                return Err(einval(format!(
                    "unknown key {key:?}: the dedup plugin takes dir, data, meta, control, accept_unclean, cache, index_memory, index_cache, record, writeback"
                )))
            }
        }
        Ok(())
    }

    fn config_complete() -> Result<()> {
        paths(&lock(&SETTINGS)).map(|_| ())
    }

    fn thread_model() -> Result<ThreadModel> {
        Ok(ThreadModel::Parallel)
    }

    /// Logging only: the device opens in `after_fork`.
    fn get_ready() -> Result<()> {
        guarded("start", || {
            let _ = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                // Its default reports a failed log write with eprintln!,
                // which panics when stderr fails too (a full disk under a
                // log file): a log line is never worth the server.
                .log_internal_errors(false)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("DEDUP_LOG")
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .try_init();
            Ok(())
        })
    }

    /// Open the device once nbdkit has bound its sockets and forked, so a
    /// start that fails (a port in use) leaves the device as it was (an
    /// INRAM device opened and never closed would need --accept-unclean),
    /// and threads (write-back, index warm, the control socket) start in
    /// the process that serves. nbdkit runs in the foreground under `dedup
    /// serve`, so an error here still reaches the terminal, and no client
    /// is accepted before this returns.
    fn after_fork() -> Result<()> {
        guarded("start", || {
            let s = lock(&SETTINGS);
            let paths = paths(&s)?;
            let opts = OpenOptions {
                writable: true,
                accept_unclean: s.accept_unclean,
                // Never to serve: `check --repair --data` verifies first.
                accept_stale: false,
                cache_bytes: s.cache_bytes,
                index_memory: s.index_memory,
                index_cache: s.index_cache,
                // layout::open puts lsm's files next to the metadata path.
                aux_dir: None,
                for_check: false,
                // Started below, once the device is open.
                write_back_bytes: 0,
                write_back_from_bytes: 0,
                open_warm_records: None,
                defer_threads: true,
                // layout::open names the changed-block tracking file.
                changes: None,
                lean: false,
            };
            // The trace file first: failing after the open would drop the
            // device unclosed, which an INRAM device takes for a crash.
            let recorder = match &s.record {
                Some(path) => Some(Arc::new(Recorder::create(path).map_err(|e| {
                    let fix = if e.kind() == std::io::ErrorKind::AlreadyExists {
                        " (--record makes a new file and never overwrites one: pick a new name)"
                    } else {
                        ""
                    };
                    Error::new(
                        libc::EIO,
                        format!("cannot create the trace file {}: {e}{fix}", path.display()),
                    )
                })?)),
                None => None,
            };
            let device = Arc::new(
                layout::open(&paths, &opts)
                    .map_err(|e| nbd_error(full_host_advice(e, &paths.meta)))?,
            );
            let limit = s.write_back_bytes.unwrap_or(DEFAULT_WRITE_BACK);
            device.start_write_back(limit, WRITE_BACK_FROM);
            device.start_index_warm();
            let mut served = lock(&SERVED);
            served.device = Some(device.clone());
            served.recorder = recorder;
            let control = s
                .control
                .clone()
                .or_else(|| s.dir.as_ref().map(|d| d.join(CONTROL_SOCKET_NAME)));
            if let Some(path) = control {
                match ControlServer::start(&path, device, Arc::new(save_from_control)) {
                    Ok(c) => served.control = Some(c),
                    Err(e) => {
                        // nbdkit exits without unloading: close here, so
                        // the device is left clean.
                        drop(served);
                        save_and_close();
                        return Err(nbd_error(e));
                    }
                }
            }
            Ok(())
        })
    }

    /// nbdkit is shutting down (SIGINT/SIGTERM): save metadata, mark clean.
    fn unload() {
        let _ = guarded("stop", || {
            save_and_close();
            Ok(())
        });
    }
    fn open(_readonly: bool) -> Result<Box<dyn Server>> {
        let served = lock(&SERVED);
        let device = served
            .device
            .clone()
            .ok_or_else(|| Error::new(libc::EIO, "the dedup device is not open"))?;
        Ok(Box::new(DedupPlugin {
            device,
            recorder: served.recorder.clone(),
        }))
    }

    fn get_size(&self) -> Result<i64> {
        Ok(self.device.size() as i64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        request("read", || self.device.read(offset, buf))?;
        self.record(Op::Read, offset, buf.len() as u64, false);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: Flags) -> Result<()> {
        let fua = flags.contains(Flags::FUA);
        request("write", || self.device.write(offset, buf, fua))?;
        if let Some(r) = &self.recorder {
            r.write(offset, buf, fua);
        }
        Ok(())
    }

    fn trim(&self, count: u32, offset: u64, flags: Flags) -> Result<()> {
        let fua = flags.contains(Flags::FUA);
        request("trim", || self.device.discard(offset, count as u64, fua))?;
        self.record(Op::Trim, offset, count as u64, fua);
        Ok(())
    }

    /// Zeroing is always fast here (zero chunks are unmapped, never
    /// written), so FAST_ZERO needs no special case.
    fn zero(&self, count: u32, offset: u64, flags: Flags) -> Result<()> {
        let fua = flags.contains(Flags::FUA);
        request("write zeroes", || {
            self.device.write_zeroes(offset, count as u64, fua)
        })?;
        self.record(Op::Zero, offset, count as u64, fua);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        request("flush", || self.device.flush())?;
        self.record(Op::Flush, 0, 0, false);
        Ok(())
    }

    fn extents(&self, count: u32, offset: u64, flags: Flags, h: &mut ExtentHandle) -> Result<()> {
        let extents = request("block status", || self.device.extents(offset, count as u64))?;
        for e in extents {
            let kind = if e.mapped {
                ExtentType::Allocated
            } else {
                ExtentType::HoleZero
            };
            h.add(e.offset, e.len, kind)?;
            if flags.contains(Flags::REQ_ONE) {
                break;
            }
        }
        Ok(())
    }

    fn can_write(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_flush(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_trim(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_zero(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_fast_zero(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_fua(&self) -> Result<FuaFlags> {
        Ok(FuaFlags::Native)
    }
    /// Safe: one device behind every connection, and a flush on any
    /// connection makes all completed writes durable.
    fn can_multi_conn(&self) -> Result<bool> {
        Ok(true)
    }
    fn can_extents(&self) -> Result<bool> {
        Ok(true)
    }
    fn is_rotational(&self) -> Result<bool> {
        Ok(false)
    }
}

plugin!(DedupPlugin {
    load,
    config,
    config_complete,
    config_help,
    thread_model,
    get_ready,
    after_fork,
    unload,
    write_at,
    trim,
    zero,
    flush,
    extents,
    can_write,
    can_flush,
    can_trim,
    can_zero,
    can_fast_zero,
    can_fua,
    can_multi_conn,
    can_extents,
    is_rotational
});
