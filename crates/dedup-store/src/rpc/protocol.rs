//! The messages of the store's RPC protocol and its limits. Types here are
//! the wire: they mirror the store's own types (`Segmenting`,
//! `BackupReport`) rather than deriving serde on them, so the store can
//! change its types without silently changing the protocol.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::backup::BackupReport;
use crate::gc::GcReport;
use crate::segmenter::Segmenting;

/// Bumped on any incompatible change; `Hello` refuses a mismatch.
/// 2: a commit's tree is a version 2 tree object (its body compressed),
/// which a server of protocol 1 refuses only at the commit.
/// 3: `TreePart`, so a tree larger than a frame can be sent.
/// 4: `Hello` answers with a challenge when the server holds a key, and
/// `Authenticate` answers it (`auth.rs`).
/// 5: `ParentTree` and `Item::Parent`, so a backup of files through a
/// server reuses its parent's unchanged files without reading them.
/// 6: `Item::Unhashed`, so a client need not hash segments it expects
/// the server lacks.
/// 7: `List` is answered `Listing` when a backup object does not read
/// (the backups that do, and those named), and a GC's report says what a
/// damaged backup made it keep.
/// 8: `Damaged` among a restore's `Chunk`s: a restore goes on past
/// damage, each damaged range named (and written as zeros by the client).
/// 9: `Begun` carries the key of an encrypted repository's fingerprints.
/// 10: TCP is TLS 1.3, and key proofs cover the session's exporter.
/// 11: a GC's report says how long it waited for writers.
/// 12: `Begun` says whether the key hashes each segment's plain BLAKE3
/// (config version 3), so a device's fingerprints can name segments.
/// 13: `ParentImage` and `DeviceMark`, so a device backup through a
/// server takes regions its tracking says are unchanged from its parent
/// and records the mark the next one walks from.
pub const PROTOCOL_VERSION: u32 = 13;

/// Largest segment the server takes: what a container holds.
pub const MAX_SEGMENT: usize = crate::format::MAX_SEGMENT_LEN;

/// Largest frame either side reads: one largest segment and its batch's
/// framing. Checked before the frame is allocated.
pub const MAX_FRAME: usize = MAX_SEGMENT + (1 << 20);

/// Bytes per `Chunk` of a restore.
pub const RESTORE_CHUNK: usize = 1 << 20;

/// Largest tree object a backup may send in `TreePart`s: the server holds
/// it in RAM until the commit. About 13 million files at the 20 bytes a
/// file the 40 tokio releases' tree took.
pub const MAX_TREE: usize = 256 << 20;

/// Bytes of the parent's tree object per `ParentTree` answer.
pub const PARENT_TREE_CHUNK: usize = 4 << 20;

/// Most fingerprints or items in one `Lookup` or `Append`.
pub const MAX_BATCH: usize = 4096;

/// Where a server listens: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl Endpoint {
    /// Parse `unix:PATH` or `tcp:HOST:PORT` (HOST an IP address).
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/dedup.sock".into());
            }
            return Ok(Endpoint::Unix(path.into()));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            return addr.parse().map(Endpoint::Tcp).map_err(|e| {
                format!("{addr:?} is not an IP address and port ({e}), e.g. tcp:127.0.0.1:7070")
            });
        }
        Err(format!(
            "{s:?} is not a server address: give unix:PATH or tcp:HOST:PORT"
        ))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub call: Call,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Call {
    Hello {
        protocol: u32,
    },
    /// The answer to `Hello`'s challenge: a random nonce of the client's
    /// and its proof of the key over both (`auth.rs`); `Authenticated`.
    /// A server with a key takes no other call before it.
    Authenticate {
        nonce: [u8; 32],
        proof: [u8; 32],
    },
    /// Start a backup; answered with `Begun`.
    BeginBackup {
        name: String,
        group: String,
    },
    /// Which of these segments the repository has (and holds for the
    /// session: GC will not take them before it ends); `Found`.
    Lookup {
        session: u64,
        fingerprints: Vec<[u8; 32]>,
    },
    /// The next segments of the stream, in order; `Appended`.
    Append {
        session: u64,
        items: Vec<Item>,
    },
    /// Make the backup durable and visible, with an optional tree object;
    /// `Committed`.
    Commit {
        session: u64,
        #[serde(with = "serde_bytes")]
        tree: Option<Vec<u8>>,
    },
    Abort {
        session: u64,
    },
    /// Stream backup `name` back: `Chunk`s in order, a `Damaged` in place
    /// of each range that could not be restored, then `Restored`.
    Restore {
        name: String,
    },
    List,
    Delete {
        name: String,
    },
    Stats,
    /// Collect garbage beside the running backups (the protection map
    /// keeps what they use); `compact_below` as `dedup gc`'s, default if
    /// `None`. Answered with `Collected`.
    Gc {
        compact_below: Option<f64>,
    },
    /// The next bytes of the session's tree object, for a tree too large
    /// for the commit's frame; the commit then carries no tree of its own.
    /// Answered with `TreeTaken`.
    TreePart {
        session: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// The session's parent (the newest backup of files in its group, as
    /// a backup beside the repository picks it): its tree object from
    /// byte `at` on. The server holds the parent's recipe for the
    /// session's `Item::Parent`s from the first of these on. Answered
    /// with `ParentTree`.
    ParentTree {
        session: u64,
        at: u64,
    },
    /// The session's parent image: the newest stream backup of its group
    /// of at most `size` bytes, as a device backup beside the repository
    /// picks it. The server holds its recipe for the session's
    /// `Item::Parent`s (a session has one parent: this or `ParentTree`).
    /// Answered with `ParentImage`.
    ParentImage {
        session: u64,
        size: u64,
    },
    /// The device and changed-block tracking mark this backup walked from,
    /// kept in its record from the commit on (`BackupRecord::device_mark`).
    /// Answered with `MarkSet`.
    DeviceMark {
        session: u64,
        device: [u8; 16],
        mark: u64,
    },
}

/// One segment of a stream, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Item {
    /// A segment the server has (a lookup found it, or this session sent
    /// it before): the server takes its location and length from the store.
    Known { fingerprint: [u8; 32] },
    /// A segment's bytes. The server hashes them itself; a fingerprint that
    /// does not match them fails the append (and the session).
    New {
        fingerprint: [u8; 32],
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Bytes `offset..offset + len` of the parent's stream (unchanged
    /// files, which start and end on its segments): the server takes the
    /// parent's segments for them, each confirmed against its catalog.
    /// If it cannot take them all, the append fails with
    /// `ParentUnusable` (the client backs up again, reading every file).
    Parent { offset: u64, len: u64 },
    /// A segment's bytes the client did not hash (it expects them new):
    /// the server hashes them, as it hashes every segment it stores, and
    /// takes the repository's copy if it has one, else stores them.
    Unhashed {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub reply: Result<Reply, WireError>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Hello {
        protocol: u32,
        segmenting: WireSegmenting,
        /// Fresh for this connection if the server holds a key: the
        /// client must `Authenticate` before anything else.
        challenge: Option<[u8; 32]>,
    },
    /// The client's proof held; the server's own proof over the same
    /// challenge and nonce, for the client to check.
    Authenticated {
        proof: [u8; 32],
    },
    Begun {
        session: u64,
        segmenting: WireSegmenting,
        /// The key of the repository's segment fingerprints if it is
        /// encrypted (keyed BLAKE3), which the client hashes with: over a
        /// Unix socket (0600) or TLS (`tls.rs`), never in the clear.
        fingerprint_key: Option<WireKey>,
        /// The key hashes each segment's plain BLAKE3, not its bytes
        /// (`config::KeyedOf::PlainDigest`).
        keyed_plain_digest: bool,
    },
    /// One answer per fingerprint, in order.
    Found(Vec<bool>),
    /// The session's parent image, if it has one: its name and the device
    /// and mark it recorded.
    ParentImage {
        name: Option<String>,
        mark: Option<([u8; 16], u64)>,
    },
    MarkSet,
    /// Stream bytes appended so far.
    Appended {
        bytes_in: u64,
    },
    Committed(WireBackup),
    Aborted,
    /// The next bytes of a restore (at most [`RESTORE_CHUNK`]).
    Chunk(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A restore is complete: this many bytes were sent (the damaged
    /// ranges counted).
    Restored {
        bytes: u64,
    },
    Backups(Vec<WireBackup>),
    Deleted,
    Stats(WireStats),
    Collected(GcReport),
    /// Tree bytes the session holds so far.
    TreeTaken {
        bytes: u64,
    },
    /// The parent's name (`None`: the session has no parent, or it could
    /// not be read), its tree object's length, and its bytes from the
    /// `at` asked for (at most `PARENT_TREE_CHUNK`).
    ParentTree {
        name: Option<String>,
        total: u64,
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    /// The answer to `List` when some backup objects do not read: the
    /// backups that do, and those named, with why (`Backups` otherwise).
    Listing {
        backups: Vec<WireBackup>,
        damaged: Vec<crate::repo::listing::DamagedBackup>,
    },
    /// Among a restore's `Chunk`s: the next `len` bytes of the stream,
    /// from `offset` (the bytes sent so far), could not be restored, and
    /// why. The client writes zeros in their place, so what follows keeps
    /// its offset, as a restore beside the repository does.
    Damaged {
        offset: u64,
        len: u64,
        error: String,
    },
}

/// Why a request failed. `kind` is for programs, `message` for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Malformed, oversized or out-of-bounds request.
    BadRequest,
    /// No such session on this connection (never begun, ended, or failed).
    NoSuchSession,
    /// The repository refused (name taken, no such backup, I/O, ...).
    Repository,
    /// Too many connections or sessions: try again later.
    Busy,
    /// Not built in this server yet (kept for clients of later calls).
    NotBuilt,
    ShuttingDown,
    /// The server holds a key and the client has not proved it holds the
    /// same one (no `Authenticate`, or a wrong proof).
    Unauthorized,
    /// An `Item::Parent` the server could not take whole: the parent
    /// changed or is damaged. Back up again without it.
    ParentUnusable,
}

impl WireError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> WireError {
        WireError {
            kind,
            message: message.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireSegmenting {
    Fixed { size: u32 },
    FastCdc { min: u32, avg: u32, max: u32 },
}

impl From<Segmenting> for WireSegmenting {
    fn from(s: Segmenting) -> WireSegmenting {
        match s {
            Segmenting::Fixed { size } => WireSegmenting::Fixed { size },
            Segmenting::FastCdc { min, avg, max } => WireSegmenting::FastCdc { min, avg, max },
        }
    }
}

impl WireSegmenting {
    /// The segmenting, if its sizes are ones this side can cut with.
    pub fn check(self) -> Result<Segmenting, String> {
        let s = match self {
            WireSegmenting::Fixed { size } => Segmenting::Fixed { size },
            WireSegmenting::FastCdc { min, avg, max } => Segmenting::FastCdc { min, avg, max },
        };
        s.check().map(|()| s)
    }
}

/// A key on the wire (`Begun`'s fingerprint key): 32 bytes, never shown
/// by `Debug`, so an unexpected reply quoted in an error does not leak it.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WireKey(pub [u8; 32]);

impl fmt::Debug for WireKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WireKey(..)")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireBackup {
    pub name: String,
    pub group: String,
    pub time: u64,
    pub has_tree: bool,
    pub report: BackupReport,
}

impl From<&crate::BackupRecord> for WireBackup {
    fn from(r: &crate::BackupRecord) -> WireBackup {
        WireBackup {
            name: r.name.clone(),
            group: r.group.clone(),
            time: r.time,
            has_tree: r.tree.is_some(),
            report: r.report,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireStats {
    pub segmenting: WireSegmenting,
    pub backups: u64,
    pub containers: u64,
    pub logical_bytes: u64,
    pub damaged_containers: Vec<String>,
    /// Backups running in this server now.
    pub running_backups: u64,
    pub connections: u64,
}
