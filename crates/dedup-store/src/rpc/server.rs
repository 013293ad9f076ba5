//! The listening side of `dedup store serve`: binds a Unix socket (0600,
//! removed at exit) or a TCP address, gives each connection a thread of
//! its own (see `connection.rs`), and stops cleanly: [`StopHandle::stop`]
//! closes every connection (aborting their running backups, which leave no
//! backup), waits for their threads, then releases the repository.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{self, BufWriter, Write};
use std::net::TcpListener;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::auth::Key;
use super::connection;
use super::frame::write_frame;
use super::protocol::{Endpoint, ErrorKind, Response, WireError};
use super::stream::{Listener, Stream};
use crate::repo::Repository;

/// How often an idle accept loop looks for a stop: the most a stop, or a
/// new connection, waits.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// How much one server takes on at once; past these, new connections and
/// backups are refused with `Busy` rather than queued without bound.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    pub max_connections: usize,
    pub max_sessions_per_connection: usize,
    /// How long a connection may send nothing (or take nothing it was sent)
    /// before it is closed and its backups aborted; `None` or zero: for
    /// ever. A client that vanished without closing (a TCP peer that lost
    /// power, a stopped process) would otherwise hold its connection slot,
    /// and its backup's containers from the collector, until the server
    /// stops.
    pub idle_timeout: Option<Duration>,
}

/// The default `idle_timeout`: long enough for a backup whose source
/// stalls (a dump waiting on a lock), short enough to free a dead peer's
/// slot the same hour.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            max_connections: 64,
            max_sessions_per_connection: 8,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

/// What the server's threads share.
pub(crate) struct Shared {
    pub(crate) stopping: AtomicBool,
    pub(crate) next_session: AtomicU64,
    /// Backups running, for `Stats`.
    pub(crate) running: AtomicU64,
    conns: Mutex<HashMap<u64, Stream>>,
    /// Connections that have yet to prove the key, oldest (lowest id)
    /// first; empty on a server without one.
    unproven: Mutex<BTreeSet<u64>>,
    endpoint: Endpoint,
    pub(crate) limits: ServerLimits,
    /// Clients must prove they hold it before anything else.
    pub(crate) key: Option<Key>,
    /// TLS settings for a TCP endpoint (`tls.rs`); `None` on a Unix socket.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
    /// TCP peers being told they are refused (`refuse`).
    refusing: AtomicUsize,
}

impl Shared {
    pub(crate) fn connections(&self) -> u64 {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len() as u64
    }

    /// Connection `id` proved the key: it keeps its slot from now on.
    /// False if it was closed for room first (it must then end without
    /// answering): the set decides which of the two came first.
    pub(crate) fn proven(&self, id: u64) -> bool {
        self.unproven
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
    }

    /// Close the oldest connection that has not proved the key, to make
    /// room for a new one; false if every connection has.
    fn close_oldest_unproven(&self) -> bool {
        loop {
            let oldest = self
                .unproven
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_first();
            let Some(id) = oldest else { return false };
            let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            // One that ended meanwhile makes no room: the next, then.
            if let Some(s) = conns.get(&id) {
                s.shutdown();
                return true;
            }
        }
    }

    fn close_all(&self) {
        for s in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            s.shutdown();
        }
    }
}

/// Stops a running [`Server`] from another thread (a signal handler's).
#[derive(Clone)]
pub struct StopHandle(Arc<Shared>);

impl StopHandle {
    pub fn stop(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        self.0.close_all();
    }
}

pub struct Server {
    repo: Arc<Repository>,
    listener: Listener,
    shared: Arc<Shared>,
    /// The socket file this server made, removed when it ends.
    socket: Option<std::path::PathBuf>,
}

impl Server {
    /// Listen at `at` for clients of `repo`, which must be open to write.
    /// A Unix socket is created owner-only (0600); a stale socket file
    /// left by a dead server is replaced, a live one refused.
    pub fn bind(repo: Repository, at: &Endpoint, limits: ServerLimits) -> io::Result<Server> {
        Server::bind_with_key(repo, at, limits, None)
    }

    /// `bind`, and with `key`, serve only clients that prove they hold the
    /// same key (and prove to them that this server does).
    pub fn bind_with_key(
        repo: Repository,
        at: &Endpoint,
        limits: ServerLimits,
        key: Option<Key>,
    ) -> io::Result<Server> {
        if !repo.is_writable() {
            return Err(io::Error::other(
                "the repository must be opened to write to serve it",
            ));
        }
        // A server outlives its backups: it must not leave a pin holding
        // what they held for collections to wait on.
        repo.repin_when_idle();
        let (listener, endpoint, socket, tls) = match at {
            Endpoint::Unix(path) => {
                remove_stale_socket(path)?;
                let l = UnixListener::bind(path)
                    .map_err(|e| annotate(e, &format!("binding {}", path.display())))?;
                // connect(2) needs write permission, which the usual umask
                // already withholds from others before this chmod.
                fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
                (Listener::Unix(l), at.clone(), Some(path.clone()), None)
            }
            Endpoint::Tcp(addr) => {
                let l = TcpListener::bind(addr)
                    .map_err(|e| annotate(e, &format!("listening on {addr}")))?;
                let bound = Endpoint::Tcp(l.local_addr()?);
                (
                    Listener::Tcp(l),
                    bound,
                    None,
                    Some(super::tls::server_config()?),
                )
            }
        };
        Ok(Server {
            repo: Arc::new(repo),
            listener,
            shared: Arc::new(Shared {
                stopping: AtomicBool::new(false),
                next_session: AtomicU64::new(1),
                running: AtomicU64::new(0),
                conns: Mutex::new(HashMap::new()),
                unproven: Mutex::new(BTreeSet::new()),
                endpoint,
                limits,
                key,
                tls,
                refusing: AtomicUsize::new(0),
            }),
            socket,
        })
    }

    /// Where clients reach it (a TCP port 0 resolved).
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.shared.clone())
    }

    /// Serve until stopped; returns once every connection has ended and
    /// the repository is released.
    pub fn run(self) -> io::Result<()> {
        self.listener.set_nonblocking()?;
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let mut next_conn = 0u64;
        while !self.shared.stopping.load(Ordering::SeqCst) {
            let stream = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(ACCEPT_POLL);
                    continue;
                }
                Err(_) => {
                    // Out of descriptors or a connection reset before we
                    // took it: not the server's end. Back off a little.
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            threads.retain(|t| !t.is_finished());
            // Full: room at the expense of the oldest connection that has
            // not proved the key (it ends at once; its thread goes soon),
            // so peers without the key, holding slots for the handshake's
            // 10 seconds at a time, cannot keep out a client that has it:
            // they would have to take every slot again within that
            // client's handshake. Connections that proved it are never
            // closed for room.
            // Closed connections' threads end soon but not at once: twice
            // the limit in connections at most, however fast peers come
            // (each a thread, and one reading its frames ahead once in).
            let max = self.shared.limits.max_connections;
            if threads.len() >= max
                && (threads.len() >= max.saturating_mul(2) || !self.shared.close_oldest_unproven())
            {
                refuse(
                    stream,
                    "too many connections; try again later",
                    &self.shared,
                );
                continue;
            }
            next_conn += 1;
            let id = next_conn;
            match stream.try_clone() {
                Ok(clone) => {
                    self.shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, clone);
                }
                Err(_) => continue,
            }
            // Until its handshake is done (the key proved, or without a
            // key its Hello answered), on either transport.
            self.shared
                .unproven
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id);
            let (repo, shared) = (self.repo.clone(), self.shared.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("dedup-conn-{id}"))
                .spawn(move || {
                    // Its entries go however it ends (a panic too).
                    let _forget = Forget(&shared, id);
                    connection::serve(&repo, stream, id, &shared);
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(_) => {
                    self.shared.proven(id);
                    if let Some(s) = self
                        .shared
                        .conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id)
                    {
                        s.shutdown();
                    }
                }
            }
        }
        // A connection accepted while `stop` was closing the others.
        self.shared.close_all();
        for t in threads {
            let _ = t.join();
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(path) = &self.socket {
            let _ = fs::remove_file(path);
        }
    }
}

/// Removes connection `id` from the server's tables when dropped.
struct Forget<'s>(&'s Shared, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        let Forget(shared, id) = self;
        shared.proven(*id);
        shared
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// Answer a connection we will not serve, then close it.
/// Tell a connection why it is refused, and close it. A TCP peer speaks
/// TLS, so the answer goes through a handshake, on a thread of its own
/// (bounded by the handshake's timeout) so that a slow peer cannot hold
/// the accept loop; past `MOST_REFUSING` at once, a TCP peer is closed
/// without a word.
fn refuse(stream: Stream, why: &str, shared: &Arc<Shared>) {
    let answer = move |stream: Stream, why: String| {
        let mut w = BufWriter::new(stream);
        let response = Response {
            id: 0,
            reply: Err(WireError::new(ErrorKind::Busy, why)),
        };
        let _ = write_frame(&mut w, &response).and_then(|()| w.flush());
    };
    let (tcp, config) = match (stream, &shared.tls) {
        (Stream::Tcp(tcp), Some(config)) => (tcp, config.clone()),
        (other, _) => return answer(other, why.to_string()),
    };
    if shared.refusing.fetch_add(1, Ordering::SeqCst) >= MOST_REFUSING {
        shared.refusing.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let (why, counted) = (why.to_string(), shared.clone());
    let spawned = std::thread::Builder::new()
        .name("dedup-refuse".into())
        .spawn(move || {
            if let Ok((plain, _)) = super::tls::accept(tcp, config) {
                // Until the peer has read the answer and closed (at most a
                // few seconds): closing first could reset the connection
                // under the answer.
                let drain = plain.try_clone();
                answer(Stream::Unix(plain), why);
                if let Ok(mut d) = drain {
                    let _ = d.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = std::io::copy(&mut d, &mut std::io::sink());
                }
            }
            counted.refusing.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        shared.refusing.fetch_sub(1, Ordering::SeqCst);
    }
}

/// TCP peers being refused at once (each a TLS handshake on a thread).
const MOST_REFUSING: usize = 16;

/// Remove a socket file no server listens on; refuse a live one or a file
/// that is not a socket.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; choose another --socket path",
                path.display()
            ),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{}: another server is listening on this socket",
                path.display()
            ),
        ));
    }
    fs::remove_file(path)
}

fn annotate(e: io::Error, doing: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{doing}: {e}"))
}
