//! The control socket: how `dedup status`, `dedup gc` and `dedup check`
//! reach a device while it is being served. A Unix socket next to the
//! device; one JSON request per line in, one JSON reply per line out:
//! `{"op":"status"}` -> `{"ok":true,"result":{...}}` or `{"ok":false,"error":"..."}`.

pub mod snapshot;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::engine::Device;
use crate::error::{Error, IoContext, Result};

/// Longest request line accepted; anything longer is not ours.
const MAX_REQUEST: u64 = 64 * 1024;
/// How often the accept loop looks for connections and for `stop`.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// Remove a socket left behind at `path` by a dead process. Refuses to
/// touch anything that is not a socket, or a socket someone still answers on.
pub fn remove_stale_socket(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(Error::InvalidArgument(format!(
            "{} exists and is not a socket; refusing to replace it (pick another path)",
            path.display()
        )));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::InvalidArgument(format!(
            "another process is listening on {}; pick another path or stop it",
            path.display()
        )));
    }
    std::fs::remove_file(path).context(|| format!("removing stale socket {}", path.display()))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Gc,
    Check {
        data: bool,
    },
    /// Save the metadata and close the device (a clean stop) while nbdkit
    /// still runs: `dedup serve`'s second Ctrl-C, when clients that stay
    /// attached keep nbdkit from unloading. Requests after it fail.
    Save,
    /// Freeze the LBN map for a backup and keep the connection as its
    /// session (`snapshot.rs`).
    Snapshot,
}

/// How `Request::Save` saves and closes the device: the server's own clean
/// stop (retries, and whatever else it finishes at a stop, such as a trace).
pub type SaveHook = Arc<dyn Fn(&Device) -> Result<()> + Send + Sync>;

pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listen at `path`. A socket file already there is replaced only if
    /// nothing answers on it (a crash leaves one behind); any other kind of
    /// file, or a live socket, is an error.
    pub fn start(path: &Path, device: Arc<Device>, save: SaveHook) -> Result<ControlServer> {
        remove_stale_socket(path)?;
        // Owner-only: whoever connects can read the device's statistics
        // and start GC or a full check.
        let listener = crate::perms::bind_socket(path)
            .context(|| format!("listening on {}", path.display()))?;
        // Polled, so `stop` never depends on reaching the socket by its path
        // (which someone may have removed).
        listener
            .set_nonblocking(true)
            .context(|| format!("configuring {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dedup-control".into())
            .spawn(move || {
                while !stop2.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let _ = stream.set_nonblocking(false);
                            let dev = device.clone();
                            let save = save.clone();
                            let spawned = std::thread::Builder::new()
                                .name("dedup-control-conn".into())
                                .spawn(move || serve_one(stream, &dev, &save));
                            if let Err(e) = spawned {
                                warn!("control socket: cannot start a handler thread: {e}");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(ACCEPT_POLL);
                        }
                        Err(e) => {
                            warn!("control socket: accept failed: {e}");
                            std::thread::sleep(ACCEPT_POLL);
                        }
                    }
                }
            })
            .context(|| "starting the control socket thread".to_string())?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stop listening and remove the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

fn serve_one(stream: UnixStream, device: &Device, save: &SaveHook) {
    let mut line = String::new();
    let read = BufReader::new(&stream)
        .take(MAX_REQUEST)
        .read_line(&mut line);
    let reply = match read {
        Ok(_) => match serde_json::from_str::<Request>(line.trim()) {
            Ok(Request::Snapshot) => return snapshot::serve(&stream, device),
            Ok(req) => {
                debug!("control request {req:?}");
                execute(&req, device, save)
            }
            Err(e) => Err(Error::InvalidArgument(format!("bad control request: {e}"))),
        },
        Err(e) => Err(Error::io("reading a control request", e)),
    };
    let body = match reply {
        Ok(result) => serde_json::json!({ "ok": true, "result": result }),
        Err(e) => serde_json::json!({ "ok": false, "error": e.to_string() }),
    };
    let mut out = &stream;
    let _ = writeln!(out, "{body}");
}

fn execute(req: &Request, device: &Device, save: &SaveHook) -> Result<serde_json::Value> {
    let value = match req {
        Request::Status => serde_json::to_value(device.stats()),
        Request::Gc => serde_json::to_value(device.gc()?),
        Request::Check { data } => serde_json::to_value(device.check(*data)?),
        Request::Save => serde_json::to_value(save(device)?),
        Request::Snapshot => Err(Error::InvalidArgument(
            "a snapshot is a session of its own (serve_one)".into(),
        ))?,
    };
    value.map_err(|e| Error::InvalidArgument(format!("encoding reply: {e}")))
}

/// Connect to a served device's socket; `Ok(None)`: nobody is listening.
fn connect(path: &Path) -> Result<Option<UnixStream>> {
    match UnixStream::connect(path) {
        Ok(s) => Ok(Some(s)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(Error::io(format!("connecting to {}", path.display()), e)),
    }
}

/// Send one request to a served device. `Ok(None)`: nobody is listening
/// (the device is not being served, or its server died).
pub fn request(path: &Path, req: &Request) -> Result<Option<serde_json::Value>> {
    let Some(stream) = connect(path)? else {
        return Ok(None);
    };
    // GC and check of a large device can take a while; status is instant.
    stream
        .set_read_timeout(Some(Duration::from_secs(3600)))
        .context(|| "setting a socket timeout".to_string())?;
    let mut w = &stream;
    let line = serde_json::to_string(req).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    writeln!(w, "{line}").context(|| format!("sending to {}", path.display()))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .context(|| format!("reading the reply from {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&reply)
        .map_err(|e| Error::InvalidArgument(format!("bad reply from {}: {e}", path.display())))?;
    if v["ok"] == serde_json::Value::Bool(true) {
        Ok(Some(v["result"].clone()))
    } else {
        Err(Error::Remote(
            v["error"].as_str().unwrap_or("no reason given").to_string(),
        ))
    }
}
