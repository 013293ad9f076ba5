//! The client side: one connection whose calls can be pipelined. `send`
//! writes a request and returns at once with a [`Pending`] answer; a
//! reader thread hands each response to its request by id. `call` is
//! `send` then `wait`.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::auth::{Key, Proved};
use super::frame::{decode, read_frame, write_frame};
use super::item_ref::{AppendOut, ItemRef};
use super::protocol::{
    Call, Endpoint, ErrorKind, Reply, Request, Response, WireBackup, WireError, WireStats,
    MAX_FRAME, PROTOCOL_VERSION,
};
use super::stream::Stream;
use crate::restore::salvage::{note, write_zeros, Salvage};
use crate::segmenter::Segmenting;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {to}: {cause}")]
    Connect { to: String, cause: io::Error },
    /// The server answered the request with an error.
    #[error("the server refused: {0}")]
    Server(WireError),
    #[error("the connection to the server was lost: {0}")]
    Lost(String),
    /// The server answered something this client cannot use.
    #[error("the server answered unexpectedly: {0}")]
    Protocol(String),
    /// The stream to back up could not be read.
    #[error("{0}")]
    Local(String),
    /// The key was refused, missing, or not proved by the server.
    #[error("{0}")]
    Auth(String),
}

impl ClientError {
    /// The server's error kind, if the server refused.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Server(e) => Some(e.kind),
            _ => None,
        }
    }
}

type Answer = Result<Reply, ClientError>;

/// Where a request's answers go: one answer, or a restore's stream of
/// chunks through a bounded queue (a slow reader of a restore stops the
/// connection rather than buffering the backup in memory).
#[derive(Clone)]
enum Slot {
    One(mpsc::Sender<Answer>),
    Stream(mpsc::SyncSender<Answer>),
}

impl Slot {
    fn send(&self, a: Answer) {
        let _ = match self {
            Slot::One(s) => s.send(a),
            Slot::Stream(s) => s.send(a),
        };
    }

    /// Fail the request without blocking (its reader may be gone).
    fn fail(&self, a: Answer) {
        match self {
            Slot::One(s) => drop(s.send(a)),
            Slot::Stream(s) => drop(s.try_send(a)),
        }
    }
}

#[derive(Default)]
struct Waiting {
    slots: HashMap<u64, Slot>,
    /// Why the connection is over, once it is.
    closed: Option<String>,
}

/// How long a client waits for an answer, or for the server to take a
/// request, before it gives up on the connection (`--timeout`): as long
/// as the server waits for an idle client. A server that hangs without
/// closing (a stopped process, a host gone without TCP noticing) no
/// longer hangs its clients for ever. The server does not see the client
/// give up until it next reads or writes, so a commit, delete or garbage
/// collection that was running may still finish there; the error says so.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

pub struct Client {
    writer: Mutex<BufWriter<Stream>>,
    next_id: AtomicU64,
    /// The connection's waiting requests are `closer.waiting`.
    closer: Arc<Closer>,
    reader: Option<JoinHandle<()>>,
    segmenting: Segmenting,
    timeout: Option<Duration>,
    over_tcp: bool,
    /// The TLS session's binding, which key proofs cover (zeros on a Unix
    /// socket).
    binding: super::tls::Binding,
}

/// An answer still on its way.
pub struct Pending {
    answer: mpsc::Receiver<Result<Reply, ClientError>>,
    timeout: Option<Duration>,
    closer: Arc<Closer>,
}

/// Closes the connection for a reason that every request still waiting on
/// it, and every later one, is failed with (the reader thread would
/// otherwise only see the socket end).
struct Closer {
    stream: Stream,
    waiting: Arc<Mutex<Waiting>>,
}

impl Closer {
    /// Close the connection, failing its requests with `why` (unless it
    /// was closed for another reason first), and give the error.
    fn close(&self, why: String) -> ClientError {
        let why = lock(&self.waiting).closed.get_or_insert(why).clone();
        self.stream.shutdown();
        ClientError::Lost(why)
    }
}

impl Pending {
    /// The answer; after the client's timeout with none, the connection
    /// is closed (failing every other request on it) and this is `Lost`.
    pub fn wait(self) -> Result<Reply, ClientError> {
        match receive(&self.answer, self.timeout, &self.closer) {
            Some(answer) => answer,
            None => Err(ClientError::Lost("no answer".into())),
        }
    }
}

/// The next answer on `rx`; `None` once its sender is gone. After
/// `timeout` with nothing, `closer` is shut and the answer is the error.
fn receive(
    rx: &mpsc::Receiver<Answer>,
    timeout: Option<Duration>,
    closer: &Closer,
) -> Option<Answer> {
    let Some(t) = timeout else {
        return rx.recv().ok();
    };
    match rx.recv_timeout(t) {
        Ok(answer) => Some(answer),
        Err(mpsc::RecvTimeoutError::Disconnected) => None,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            Some(Err(closer.close(timed_out(t, "sent no answer"))))
        }
    }
}

fn timed_out(t: Duration, what: &str) -> String {
    format!(
        "the server {what} in {} s, so the connection was closed (--timeout sets how long to wait); a commit, delete or gc it was running may still finish there (dedup store remote list shows the backups)",
        t.as_secs_f64()
    )
}

impl Client {
    /// Connect and agree on the protocol version, with the default timeout.
    pub fn connect(to: &Endpoint) -> Result<Client, ClientError> {
        Client::connect_with(to, Some(DEFAULT_TIMEOUT))
    }

    /// Connect; give up on a call whose answer, or on a request the server
    /// does not take, after `timeout` (`None` or zero: wait for ever).
    pub fn connect_with(to: &Endpoint, timeout: Option<Duration>) -> Result<Client, ClientError> {
        Client::connect_with_key(to, timeout, None)
    }

    /// `connect_with`, and with `key`, prove to the server that this
    /// client holds it and have the server prove the same, before anything
    /// else is sent: a server without the key (another process on the
    /// port, or a server started without `--psk`) is refused.
    pub fn connect_with_key(
        to: &Endpoint,
        timeout: Option<Duration>,
        key: Option<&Key>,
    ) -> Result<Client, ClientError> {
        let timeout = timeout.filter(|t| !t.is_zero());
        let (stream, binding) =
            Stream::connect(to, timeout).map_err(|cause| ClientError::Connect {
                to: to.to_string(),
                cause,
            })?;
        let io_err = |cause| ClientError::Connect {
            to: to.to_string(),
            cause,
        };
        // Only writes time out on the socket (a server that takes no more
        // requests); answers are waited for in `receive`, so a reader
        // thread never gives up part-way through a frame.
        stream.set_write_timeout(timeout).map_err(io_err)?;
        let read_half = stream.try_clone().map_err(io_err)?;
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let closer = Arc::new(Closer {
            stream: stream.try_clone().map_err(io_err)?,
            waiting: waiting.clone(),
        });
        let w = waiting.clone();
        let reader = std::thread::Builder::new()
            .name("dedup-rpc-reader".into())
            .spawn(move || read_responses(read_half, &w))
            .map_err(io_err)?;
        let mut client = Client {
            writer: Mutex::new(BufWriter::with_capacity(256 << 10, stream)),
            next_id: AtomicU64::new(1),
            closer,
            reader: Some(reader),
            segmenting: Segmenting::DEFAULT,
            timeout,
            over_tcp: matches!(to, Endpoint::Tcp(_)),
            binding,
        };
        let challenge = match client.call(Call::Hello {
            protocol: PROTOCOL_VERSION,
        })? {
            Reply::Hello {
                segmenting,
                challenge,
                ..
            } => {
                client.segmenting = segmenting.check().map_err(ClientError::Protocol)?;
                challenge
            }
            other => return Err(unexpected(&other)),
        };
        match (key, challenge) {
            (None, None) => {}
            (Some(key), Some(challenge)) => client.authenticate(to, key, &challenge)?,
            (None, Some(_)) => {
                return Err(ClientError::Auth(format!(
                    "the server at {to} asks for its key: give --psk FILE, a copy of the key file it was started with"
                )))
            }
            (Some(_), None) => {
                return Err(ClientError::Auth(format!(
                    "the server at {to} asks for no key, so it cannot prove it holds yours: nothing was sent to it. \
                     Start it with --psk FILE, or connect without --psk if it is the server you meant"
                )))
            }
        }
        Ok(client)
    }

    /// Answer the server's challenge, then check its proof.
    fn authenticate(
        &self,
        to: &Endpoint,
        key: &Key,
        challenge: &[u8; 32],
    ) -> Result<(), ClientError> {
        let nonce = crate::crypto::random::random_bytes::<32>()
            .map_err(|e| ClientError::Local(format!("making a nonce: {e}")))?;
        let proved = Proved {
            challenge,
            nonce: &nonce,
            binding: &self.binding,
        };
        let proof = key.client_proof(&proved);
        match self.call(Call::Authenticate { nonce, proof }) {
            Ok(Reply::Authenticated { proof }) if key.is_server_proof(&proved, &proof) => {
                Ok(())
            }
            Ok(Reply::Authenticated { .. }) => Err(ClientError::Auth(format!(
                "the server at {to} did not prove it holds the key: it is not the server you meant, or its key differs; nothing was sent to it"
            ))),
            Ok(other) => Err(unexpected(&other)),
            Err(ClientError::Server(e)) if e.kind == ErrorKind::Unauthorized => {
                Err(ClientError::Auth(format!("the server at {to} refused: {}", e.message)))
            }
            Err(e) => Err(e),
        }
    }

    /// How the repository cuts streams.
    pub fn segmenting(&self) -> Segmenting {
        self.segmenting
    }

    /// Whether the connection is TCP (else a Unix socket, on this machine).
    pub(crate) fn over_tcp(&self) -> bool {
        self.over_tcp
    }

    /// Send `call` without waiting for its answer.
    pub fn send(&self, call: Call) -> Result<Pending, ClientError> {
        self.send_pending(|id| Request { id, call })
    }

    /// Send an append of `items` to `session` without waiting for its
    /// answer: `Call::Append`, encoded from where the segments' bytes are.
    pub(crate) fn send_append(
        &self,
        session: u64,
        items: &[ItemRef<'_>],
    ) -> Result<Pending, ClientError> {
        self.send_pending(|id| AppendOut { id, session, items })
    }

    fn send_pending<M: Serialize>(
        &self,
        message: impl FnOnce(u64) -> M,
    ) -> Result<Pending, ClientError> {
        let (tx, rx) = mpsc::channel();
        self.send_message(message, Slot::One(tx))?;
        Ok(Pending {
            answer: rx,
            timeout: self.timeout,
            closer: self.closer.clone(),
        })
    }

    /// Send the request `message(id)` makes, its answer to go to `slot`.
    fn send_message<M: Serialize>(
        &self,
        message: impl FnOnce(u64) -> M,
        slot: Slot,
    ) -> Result<(), ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut w = lock(&self.closer.waiting);
            if let Some(why) = &w.closed {
                return Err(ClientError::Lost(why.clone()));
            }
            w.slots.insert(id, slot);
        }
        let mut writer = lock(&self.writer);
        let sent = write_frame(&mut *writer, &message(id)).and_then(|()| writer.flush());
        match sent {
            Ok(()) => Ok(()),
            // Not encodable: the connection is fine, this request is not.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                lock(&self.closer.waiting).slots.remove(&id);
                Err(ClientError::Local(e.to_string()))
            }
            // The server took nothing for the whole timeout.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                lock(&self.closer.waiting).slots.remove(&id);
                let t = self.timeout.unwrap_or_default();
                Err(self.closer.close(timed_out(t, "took no data")))
            }
            // The server closed: the reader thread will fail the request
            // with the reason the server gave, if it gave one (busy).
            Err(_) => Ok(()),
        }
    }

    /// Write backup `name`'s stream to `out` as the server reads it, past
    /// damage as a restore beside the repository goes: zeros in place of
    /// each range the server names as damaged. What was written, and the
    /// damaged ranges.
    pub fn restore(&self, name: &str, out: &mut impl Write) -> Result<Salvage, ClientError> {
        let (tx, rx) = mpsc::sync_channel(8);
        let call = Call::Restore { name: name.into() };
        self.send_message(|id| Request { id, call }, Slot::Stream(tx))?;
        let mut s = Salvage::default();
        let writing = |e: io::Error| ClientError::Local(format!("writing the restore: {e}"));
        loop {
            match receive(&rx, self.timeout, &self.closer) {
                Some(Ok(Reply::Chunk(bytes))) => {
                    out.write_all(&bytes).map_err(writing)?;
                    s.bytes += bytes.len() as u64;
                }
                Some(Ok(Reply::Damaged { offset, len, error })) => {
                    let end = offset.checked_add(len);
                    if offset != s.bytes || end.is_none() {
                        return Err(ClientError::Protocol(format!(
                            "a damaged range of {len} bytes at byte {offset} of a restore that had sent {} bytes",
                            s.bytes
                        )));
                    }
                    write_zeros(out, len).map_err(writing)?;
                    note(&mut s.damaged, offset, len, error);
                    s.bytes += len;
                }
                Some(Ok(Reply::Restored { bytes })) if bytes == s.bytes => return Ok(s),
                Some(Ok(other)) => return Err(unexpected(&other)),
                Some(Err(e)) => return Err(e),
                None => return Err(ClientError::Lost("the restore was cut off".into())),
            }
        }
    }

    pub fn call(&self, call: Call) -> Result<Reply, ClientError> {
        self.send(call)?.wait()
    }

    /// The backups that read (`list_all` also names the damaged ones).
    pub fn list(&self) -> Result<Vec<WireBackup>, ClientError> {
        self.list_all().map(|(backups, _)| backups)
    }

    /// The backups that read, and those whose backup objects do not.
    pub fn list_all(
        &self,
    ) -> Result<(Vec<WireBackup>, Vec<crate::repo::listing::DamagedBackup>), ClientError> {
        match self.call(Call::List)? {
            Reply::Backups(backups) => Ok((backups, Vec::new())),
            Reply::Listing { backups, damaged } => Ok((backups, damaged)),
            other => Err(unexpected(&other)),
        }
    }

    pub fn delete(&self, name: &str) -> Result<(), ClientError> {
        match self.call(Call::Delete { name: name.into() })? {
            Reply::Deleted => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub fn stats(&self) -> Result<WireStats, ClientError> {
        match self.call(Call::Stats)? {
            Reply::Stats(s) => Ok(s),
            other => Err(unexpected(&other)),
        }
    }

    /// Collect garbage in the server's repository.
    pub fn gc(&self, compact_below: Option<f64>) -> Result<crate::gc::GcReport, ClientError> {
        match self.call(Call::Gc { compact_below })? {
            Reply::Collected(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.closer.stream.shutdown();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

pub(crate) fn unexpected(reply: &Reply) -> ClientError {
    let mut s = format!("{reply:?}");
    s.truncate(200);
    ClientError::Protocol(s)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hand each response to the request it answers until the connection ends,
/// then fail whatever still waits.
fn read_responses(stream: Stream, waiting: &Mutex<Waiting>) {
    let mut r = BufReader::with_capacity(64 << 10, stream);
    let why = loop {
        let body = match read_frame(&mut r, MAX_FRAME) {
            Ok(Some(b)) => b,
            Ok(None) => break "the server closed the connection".to_string(),
            Err(e) => break e.to_string(),
        };
        let resp: Response = match decode(&body) {
            Ok(r) => r,
            Err(e) => break e,
        };
        // A restore's stream goes on after these.
        let chunk = matches!(resp.reply, Ok(Reply::Chunk(_) | Reply::Damaged { .. }));
        let slot = {
            let mut w = lock(waiting);
            if chunk {
                w.slots.get(&resp.id).cloned()
            } else {
                w.slots.remove(&resp.id)
            }
        };
        match (slot, resp.reply) {
            (Some(slot), reply) => slot.send(reply.map_err(ClientError::Server)),
            // Id 0 answers no request: the server refused the connection
            // (busy) or the last frame; it closes next.
            (None, Err(e)) => break e.message,
            (None, Ok(_)) => break format!("an answer to request {} never sent", resp.id),
        }
    };
    let mut w = lock(waiting);
    // A reason given by whoever closed it (a timeout) comes first.
    let why = w.closed.get_or_insert(why).clone();
    for (_, slot) in w.slots.drain() {
        slot.fail(Err(ClientError::Lost(why.clone())));
    }
}
