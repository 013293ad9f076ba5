//! One client connection: its requests answered in order, its backup
//! sessions. Every byte from the network is untrusted: frames, batches and
//! segments are bounded, names are checked by the repository, a segment's
//! bytes are hashed here whatever fingerprint came with them, and a
//! segment named only by fingerprint takes its location and length from
//! the store, and a run of the parent's stream takes its segments from the
//! parent's recipe, each confirmed against its catalog. A connection that
//! ends, however, drops its sessions, which aborts their backups.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dedup_common::fingerprint::Fingerprint;

use super::auth::Proved;
use super::found::Found;
use super::frame::{decode, write_frame};
use super::item_ref::{append_in_place, is_append, ItemRef};
use super::protocol::{
    Call, ErrorKind, Reply, Request, Response, WireBackup, WireError, WireKey, WireStats,
    MAX_BATCH, MAX_FRAME, MAX_SEGMENT, MAX_TREE, PARENT_TREE_CHUNK, PROTOCOL_VERSION,
};
use super::read_ahead::Frames;
use super::serve_restore;
use super::server::Shared;
use super::stream::{Deadlined, Stream};
use super::tls;
use crate::backup::DeviceMark;
use crate::backup_blocks::as_parent_had;
use crate::config::KeyedOf;
use crate::error::repo::RepoError;
use crate::repo::Repository;
use crate::segmenter::Segmenting;
use crate::session::BackupSession;
use crate::tree::parent::{parent_for_client, ParentRecipe, Unchanged};
use crate::writer::HASH;

/// Lookup hits remembered for the appends that follow them (`found.rs`):
/// the newest this many, far more than a client has in flight (at most
/// 4 batches of 256 by default, `MAX_BATCH` each at most).
const MAX_PENDING: usize = 1 << 16;

/// A running backup of this connection.
struct Live<'r> {
    session: BackupSession<'r>,
    /// Segments the latest lookups found, by fingerprint.
    found: Found,
    /// The tree object's bytes sent so far in `TreePart`s.
    tree: Vec<u8>,
    /// Which parent the client asked for (once: `ParentTree` or
    /// `ParentImage`), and the parent then found, if any.
    parent_asked: Option<Asked>,
    parent: Option<Parent>,
}

/// Which parent a session asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// A backup of files' (`ParentTree`).
    Tree,
    /// A device image's, of this block size (`ParentImage`): its runs
    /// are taken only as whole blocks, as a backup beside the repository
    /// takes them.
    Image(u32),
}

/// A session's parent: the tree object its client is sent, and the
/// recipe its `Item::Parent`s are taken from.
struct Parent {
    name: String,
    /// The tree object as stored; dropped once sent to its end.
    tree: Vec<u8>,
    total: u64,
    recipe: ParentRecipe,
    /// Where the last run taken ended: runs move forward through the
    /// parent's stream, so a session takes each of its segments once at
    /// most and reads each recipe part once (a client's walk reaches
    /// files in the parent's order).
    next: u64,
}

type Answer = Result<Reply, WireError>;

/// Serve connection `conn_id` until it ends.
pub(crate) fn serve(repo: &Repository, stream: Stream, conn_id: u64, shared: &Shared) {
    // TCP is TLS from its first byte (`tls.rs`); the rest of the
    // connection reads and writes the plain end of its pump.
    let (stream, binding) = match (stream, &shared.tls) {
        (Stream::Tcp(tcp), Some(config)) => match tls::accept(tcp, config.clone()) {
            Ok((plain, binding)) => (Stream::Unix(plain), binding),
            Err(_) => return,
        },
        (Stream::Tcp(_), None) => return,
        (unix, _) => (unix, [0u8; 32]),
    };
    // A read or write that times out ends the connection like any error,
    // so a peer that vanished without closing frees its slot and its
    // backups' containers. (A zero timeout, which the socket refuses,
    // means none.)
    let idle = shared.limits.idle_timeout.filter(|t| !t.is_zero());
    // A peer that is not in yet gets a short while, for the whole
    // handshake and not only for each read: on TCP or a Unix socket
    // alike, nobody holds a slot for long without one. With a key, it is
    // in once it proves the key, and its frames are small until then (no
    // large frame set aside for a stranger); without one, once a whole
    // frame arrives (a Unix socket is owner-only: its peers are trusted,
    // but one that says nothing must not hold a slot for the idle hour).
    let keyless = shared.key.is_none();
    let handshake = Some(idle.map_or(HANDSHAKE_TIMEOUT, |t| t.min(HANDSHAKE_TIMEOUT)));
    let deadline = handshake.map(|t| Instant::now() + t);
    if stream.set_timeouts(handshake).is_err() {
        return;
    }
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let reader = BufReader::with_capacity(256 << 10, Deadlined::new(read_half, deadline));
    let mut writer = BufWriter::with_capacity(64 << 10, stream);
    // Without a key the connection is trusted as it is (a Unix socket is
    // owner-only); with one, a challenge for it to answer first.
    let challenge = match &shared.key {
        None => None,
        Some(_) => match crate::crypto::random::random_bytes::<32>() {
            Ok(c) => Some(c),
            Err(_) => return,
        },
    };
    let mut conn = Conn {
        repo,
        shared,
        sessions: HashMap::new(),
        challenge,
        binding,
        authenticated: false,
        greeted: false,
    };
    std::thread::scope(|scope| {
        let mut frames = Frames::Inline(reader);
        loop {
            // Once the peer is in, its frames are read ahead.
            if conn.authenticated && !read_ahead(&mut frames, scope, idle) {
                break;
            }
            let limit = if conn.authenticated || keyless {
                MAX_FRAME
            } else {
                HANDSHAKE_FRAME
            };
            let next = frames.next(limit);
            if keyless && !conn.authenticated && matches!(next, Ok(Some(_))) {
                // In: a slot no new connection takes (unless one took it
                // first: then out), and the usual timeouts.
                conn.authenticated = true;
                if !shared.proven(conn_id) || !lifted(&mut frames, idle) {
                    break;
                }
            }
            let (id, reply) = match next {
                // An append, the bulk of a backup, is decoded in place.
                Ok(Some(body)) if conn.authenticated && is_append(&body) => {
                    match append_in_place(&body) {
                        Ok((id, session, items)) => (id, conn.append(session, items)),
                        Err(why) => {
                            let _ = send(&mut writer, 0, Err(bad(why)));
                            break;
                        }
                    }
                }
                Ok(Some(body)) => match decode::<Request>(&body) {
                    // A restore answers with many frames, written as it reads.
                    Ok(Request {
                        id,
                        call: Call::Restore { name },
                    }) if conn.authenticated => {
                        if serve_restore::restore(repo, &name, id, &mut writer).is_err() {
                            break;
                        }
                        continue;
                    }
                    // Before the key is proved, only the handshake is
                    // answered; anything else is refused and the connection
                    // closed.
                    Ok(req) if !conn.authenticated && !is_handshake(&req.call) => {
                        let _ = send(&mut writer, req.id, Err(unauthorized()));
                        break;
                    }
                    Ok(req) => {
                        let was = conn.authenticated;
                        let reply = conn.handle(req.call);
                        if !conn.authenticated && reply.is_err() {
                            // A wrong proof: no second guess.
                            let _ = send(&mut writer, req.id, reply);
                            break;
                        }
                        // In: a slot no new connection takes (unless one took it
                        // first: then out, unanswered), and the usual timeouts.
                        if !was
                            && conn.authenticated
                            && (!shared.proven(conn_id) || !lifted(&mut frames, idle))
                        {
                            break;
                        }
                        (req.id, reply)
                    }
                    // The frame was whole but not a request: answer, then close
                    // (a peer that sends garbage gets no second guess).
                    Err(why) => {
                        let _ = send(&mut writer, 0, Err(bad(why)));
                        break;
                    }
                },
                Ok(None) => break,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    let _ = send(&mut writer, 0, Err(bad(e.to_string())));
                    break;
                }
                Err(_) => break,
            };
            if send(&mut writer, id, reply).is_err() {
                break;
            }
        }
        // Stops the reading thread if it waits on the socket.
        writer.get_ref().shutdown();
    });
    // Dropping the sessions aborts them.
    let n = conn.sessions.len() as u64;
    shared.running.fetch_sub(n, Ordering::SeqCst);
}

/// Whether the handshake's deadline is lifted and `idle` set in its place
/// (on the inline reader: frames are read ahead only once that is done).
fn lifted(frames: &mut Frames<BufReader<Deadlined>>, idle: Option<Duration>) -> bool {
    frames
        .inline()
        .is_some_and(|r| r.get_mut().lift(idle).is_ok())
}

/// Read `frames` ahead (if not yet), the peer idle after `idle` without
/// one; false if the socket refused to wait for ever on reads or no
/// thread could be started.
fn read_ahead<'s>(
    frames: &mut Frames<BufReader<Deadlined>>,
    scope: &'s std::thread::Scope<'s, '_>,
    idle: Option<Duration>,
) -> bool {
    match frames.inline() {
        None => true,
        Some(r) => {
            r.get_mut().untimed_reads().is_ok() && frames.read_ahead(scope, MAX_FRAME, idle).is_ok()
        }
    }
}

pub(super) fn send(w: &mut impl Write, id: u64, reply: Answer) -> io::Result<()> {
    write_frame(w, &Response { id, reply })?;
    w.flush()
}

fn bad(message: impl Into<String>) -> WireError {
    WireError::new(ErrorKind::BadRequest, message)
}

pub(super) fn repo_err(e: RepoError) -> WireError {
    WireError::new(ErrorKind::Repository, e.to_string())
}

struct Conn<'r> {
    repo: &'r Repository,
    shared: &'r Shared,
    sessions: HashMap<u64, Live<'r>>,
    /// This connection's challenge, if the server holds a key.
    challenge: Option<[u8; 32]>,
    /// The TLS session's binding, which key proofs cover (`auth::Proved`).
    binding: tls::Binding,
    /// Whether the peer may make calls other than the handshake: it
    /// proved the key, or, without a key, sent a whole frame.
    authenticated: bool,
    /// Whether `Hello` was answered (once only before authenticating).
    greeted: bool,
}

/// How long a peer has to prove the key, from connecting to its proof
/// (the idle timeout instead, if shorter), and the largest frame it may
/// send before it has (a handshake's frames are under 100 bytes).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HANDSHAKE_FRAME: usize = 4 << 10;

fn is_handshake(call: &Call) -> bool {
    matches!(call, Call::Hello { .. } | Call::Authenticate { .. })
}

fn unauthorized() -> WireError {
    WireError::new(
        ErrorKind::Unauthorized,
        "this server asks for its key: connect with --psk FILE (a copy of the server's key file)",
    )
}

impl<'r> Conn<'r> {
    fn handle(&mut self, call: Call) -> Answer {
        let segmenting = self.repo.config().segmenting.into();
        match call {
            Call::Hello { .. } if self.greeted && !self.authenticated => Err(WireError::new(
                ErrorKind::Unauthorized,
                "a second Hello before authenticating",
            )),
            Call::Hello { protocol } if protocol == PROTOCOL_VERSION => {
                self.greeted = true;
                Ok(Reply::Hello {
                    protocol,
                    segmenting,
                    challenge: self.challenge.filter(|_| !self.authenticated),
                })
            }
            Call::Authenticate { nonce, proof } => self.authenticate(&nonce, &proof),
            Call::Hello { protocol } => Err(bad(format!(
                "the client speaks protocol {protocol}, this server {PROTOCOL_VERSION}: use a dedup of the same version"
            ))),
            Call::BeginBackup { name, group } => self.begin(&name, &group),
            Call::Lookup {
                session,
                fingerprints,
            } => self.lookup(session, &fingerprints),
            Call::Append { session, items } => {
                self.append(session, items.iter().map(ItemRef::from).collect())
            }
            Call::Commit { session, tree } => {
                let mut live = self.take(session)?;
                let tree = match (tree, std::mem::take(&mut live.tree)) {
                    (tree, parts) if parts.is_empty() => tree,
                    (None, parts) => Some(parts),
                    (Some(_), _) => {
                        return Err(bad(
                            "a commit with a tree after tree parts: send one or the other; backup aborted",
                        ))
                    }
                };
                let record = live
                    .session
                    .commit_with_tree(tree.as_deref())
                    .map_err(repo_err)?;
                Ok(Reply::Committed(WireBackup::from(&record)))
            }
            Call::TreePart { session, bytes } => self.tree_part(session, &bytes),
            Call::ParentTree { session, at } => self.parent_tree(session, at),
            Call::ParentImage { session, size } => self.parent_image(session, size),
            Call::DeviceMark {
                session,
                device,
                mark,
            } => {
                let live = (self.sessions.get_mut(&session)).ok_or_else(|| no_session(session))?;
                // A mark says the backup is the device's image: never on
                // a backup of files.
                if live.parent_asked == Some(Asked::Tree) || !live.tree.is_empty() {
                    return Err(bad("a device mark on a backup of files"));
                }
                live.session.set_device_mark(DeviceMark { device, mark });
                Ok(Reply::MarkSet)
            }
            Call::Abort { session } => self.take(session).map(|_| Reply::Aborted),
            Call::Restore { .. } => Err(bad("a restore is answered by the connection loop")),
            // A damaged backup object is named, the others still listed.
            Call::List => {
                let listing = self.repo.list_backups_all().map_err(repo_err)?;
                let backups = listing.backups.iter().map(WireBackup::from).collect();
                Ok(match listing.damaged.is_empty() {
                    true => Reply::Backups(backups),
                    false => Reply::Listing {
                        backups,
                        damaged: listing.damaged,
                    },
                })
            }
            Call::Delete { name } => self
                .repo
                .delete_backup(&name)
                .map(|()| Reply::Deleted)
                .map_err(repo_err),
            Call::Stats => self.stats(),
            Call::Gc { compact_below } => self.gc(compact_below),
        }
    }

    /// Check the client's proof of the key; answer with the server's.
    fn authenticate(&mut self, nonce: &[u8; 32], proof: &[u8; 32]) -> Answer {
        let (Some(key), Some(challenge)) = (&self.shared.key, &self.challenge) else {
            return Err(bad(
                "this server holds no key: connect without --psk (or give the server one)",
            ));
        };
        if self.authenticated {
            return Err(bad("this connection has already authenticated"));
        }
        let proved = Proved {
            challenge,
            nonce,
            binding: &self.binding,
        };
        if !key.is_client_proof(&proved, proof) {
            return Err(WireError::new(
                ErrorKind::Unauthorized,
                "the key does not match the server's: give --psk a copy of the key file the server was started with",
            ));
        }
        self.authenticated = true;
        Ok(Reply::Authenticated {
            proof: key.server_proof(&proved),
        })
    }

    fn begin(&mut self, name: &str, group: &str) -> Answer {
        if self.shared.stopping.load(Ordering::SeqCst) {
            return Err(WireError::new(
                ErrorKind::ShuttingDown,
                "the server is shutting down",
            ));
        }
        let max = self.shared.limits.max_sessions_per_connection;
        if self.sessions.len() >= max {
            return Err(WireError::new(
                ErrorKind::Busy,
                format!("{max} backups already run on this connection; open another connection"),
            ));
        }
        let session = self.repo.begin_backup(name, group).map_err(repo_err)?;
        let id = self.shared.next_session.fetch_add(1, Ordering::SeqCst);
        self.shared.running.fetch_add(1, Ordering::SeqCst);
        self.sessions.insert(
            id,
            Live {
                session,
                found: Found::new(MAX_PENDING),
                tree: Vec::new(),
                parent_asked: None,
                parent: None,
            },
        );
        Ok(Reply::Begun {
            session: id,
            segmenting: self.repo.config().segmenting.into(),
            fingerprint_key: self.repo.fingerprint_key().map(|(k, _)| WireKey(k)),
            keyed_plain_digest: (self.repo.fingerprint_key())
                .is_some_and(|(_, of)| of == KeyedOf::PlainDigest),
        })
    }

    /// End session `id` here (commit or abort), or say it is unknown.
    fn take(&mut self, id: u64) -> Result<Live<'r>, WireError> {
        let live = self.sessions.remove(&id).ok_or_else(|| no_session(id))?;
        self.shared.running.fetch_sub(1, Ordering::SeqCst);
        Ok(live)
    }

    /// Abort session `id` after `e`: a stream with a hole must not commit.
    fn fail(&mut self, id: u64, e: WireError) -> WireError {
        let _ = self.take(id);
        WireError::new(e.kind, format!("{}; backup aborted", e.message))
    }

    fn lookup(&mut self, id: u64, fps: &[[u8; 32]]) -> Answer {
        if fps.len() > MAX_BATCH {
            return Err(bad(format!(
                "{} fingerprints in one lookup; at most {MAX_BATCH}",
                fps.len()
            )));
        }
        let live = self.sessions.get_mut(&id).ok_or_else(|| no_session(id))?;
        let mut out = Vec::with_capacity(fps.len());
        for fp in fps {
            match live.session.lookup_ref(&Fingerprint(*fp)) {
                Ok(Some(r)) => {
                    live.found.insert(*fp, r);
                    out.push(true);
                }
                Ok(None) => out.push(false),
                Err(e) => return Err(self.fail(id, repo_err(e))),
            }
        }
        Ok(Reply::Found(out))
    }

    fn append(&mut self, id: u64, items: Vec<ItemRef<'_>>) -> Answer {
        if items.len() > MAX_BATCH {
            return Err(bad(format!(
                "{} segments in one append; at most {MAX_BATCH}",
                items.len()
            )));
        }
        let repo = self.repo;
        let live = self.sessions.get_mut(&id).ok_or_else(|| no_session(id))?;
        // Every segment's bytes hashed at once, before any is stored:
        // BLAKE3 then runs its lanes across segments (`fingerprint_many`).
        let bytes: Vec<&[u8]> = items.iter().filter_map(ItemRef::data).collect();
        let mut fps = repo.segment_hash().of_many(&bytes).into_iter();
        for (i, item) in items.into_iter().enumerate() {
            let fp = item.data().and_then(|_| fps.next());
            if let Err(e) = append_one(repo, live, item, fp) {
                let e = WireError::new(e.kind, format!("segment {i} of the append: {}", e.message));
                return Err(self.fail(id, e));
            }
        }
        Ok(Reply::Appended {
            bytes_in: live.session.report().bytes_in,
        })
    }

    /// The session's parent tree from byte `at` on. The parent is picked
    /// and loaded at the first ask; one that cannot be read, or whose tree
    /// is larger than a client takes (`MAX_TREE`), is none: the client
    /// then reads every file.
    fn parent_tree(&mut self, id: u64, at: u64) -> Answer {
        let repo = self.repo;
        let live = self.sessions.get_mut(&id).ok_or_else(|| no_session(id))?;
        if live.parent_asked.is_some_and(|a| a != Asked::Tree) {
            return Err(bad("this session asked for a parent image already"));
        }
        if live.parent_asked.is_none() {
            live.parent_asked = Some(Asked::Tree);
            let newest = repo
                .newest_files_backup(live.session.group())
                .map_err(repo_err)?;
            live.parent = newest.and_then(|record| {
                let name = record.name.clone();
                let (tree, recipe) = parent_for_client(repo, record, MAX_TREE).ok()??;
                Some(Parent {
                    name,
                    total: tree.len() as u64,
                    tree,
                    recipe,
                    next: 0,
                })
            });
        }
        let Some(p) = live.parent.as_mut() else {
            return Ok(Reply::ParentTree {
                name: None,
                total: 0,
                bytes: Vec::new(),
            });
        };
        if at > p.total || (at < p.total && p.tree.is_empty()) {
            return Err(bad(format!(
                "byte {at} of a parent tree of {} bytes, already sent to its end",
                p.total
            )));
        }
        let start = at as usize; // at most total, a Vec's length
        let end = p.tree.len().min(start + PARENT_TREE_CHUNK);
        let bytes = p.tree.get(start..end).unwrap_or_default().to_vec();
        if end == p.tree.len() {
            p.tree = Vec::new();
        }
        Ok(Reply::ParentTree {
            name: Some(p.name.clone()),
            total: p.total,
            bytes,
        })
    }

    /// The session's parent image (`Call::ParentImage`): picked and its
    /// recipe loaded here, once. One that cannot be read is none: the
    /// client then walks every block.
    fn parent_image(&mut self, id: u64, size: u64) -> Answer {
        let repo = self.repo;
        let live = self.sessions.get_mut(&id).ok_or_else(|| no_session(id))?;
        if live.parent_asked.is_some() {
            return Err(bad("this session asked for its parent already"));
        }
        let Segmenting::Fixed { size: bs } = repo.config().segmenting else {
            return Err(bad(
                "a parent image is for a repository of fixed segments (a device's blocks)",
            ));
        };
        live.parent_asked = Some(Asked::Image(bs));
        let Some(p) = repo.parent_image(live.session.group(), size) else {
            return Ok(Reply::ParentImage {
                name: None,
                mark: None,
            });
        };
        let reply = Reply::ParentImage {
            name: Some(p.name.clone()),
            mark: p.mark.map(|m| (m.device, m.mark)),
        };
        live.parent = Some(Parent {
            name: p.name,
            tree: Vec::new(),
            total: 0,
            recipe: p.recipe,
            next: 0,
        });
        Ok(reply)
    }

    /// Add `bytes` to the session's tree; past `MAX_TREE` the backup is
    /// aborted (its tree would not be taken).
    fn tree_part(&mut self, id: u64, bytes: &[u8]) -> Answer {
        let live = self.sessions.get_mut(&id).ok_or_else(|| no_session(id))?;
        if live.tree.len() + bytes.len() > MAX_TREE {
            let e = bad(format!(
                "a tree of more than {MAX_TREE} bytes; the server takes at most that"
            ));
            return Err(self.fail(id, e));
        }
        live.tree.extend_from_slice(bytes);
        Ok(Reply::TreeTaken {
            bytes: live.tree.len() as u64,
        })
    }

    /// A collection on this connection's thread: backups on the others
    /// go on (the protection map keeps what they use); this connection's
    /// next requests wait for it.
    fn gc(&self, compact_below: Option<f64>) -> Answer {
        let compact_below = compact_below.unwrap_or(crate::gc::DEFAULT_COMPACT_BELOW);
        if !(0.0..=1.0).contains(&compact_below) {
            return Err(bad(format!(
                "compact_below {compact_below} is not a fraction from 0 to 1"
            )));
        }
        let options = crate::gc::GcOptions {
            compact_below,
            ..Default::default()
        };
        let report = self.repo.gc(&options).map_err(repo_err)?;
        Ok(Reply::Collected(report))
    }

    fn stats(&self) -> Answer {
        // The backups that read (`List` names the damaged ones).
        let backups = self.repo.list_backups_all().map_err(repo_err)?.backups;
        let containers = self.repo.store_container_ids().map_err(repo_err)?;
        Ok(Reply::Stats(WireStats {
            segmenting: self.repo.config().segmenting.into(),
            backups: backups.len() as u64,
            containers: containers.len() as u64,
            logical_bytes: backups.iter().map(|b| b.report.bytes_in).sum(),
            damaged_containers: self.repo.damaged_containers().to_vec(),
            running_backups: self.shared.running.load(Ordering::SeqCst),
            connections: self.shared.connections(),
        }))
    }
}

/// Append `item`; `fp` is the fingerprint of its bytes, if it has any.
fn append_one(
    repo: &Repository,
    live: &mut Live<'_>,
    item: ItemRef<'_>,
    fp: Option<Fingerprint>,
) -> Result<(), WireError> {
    match item {
        ItemRef::Known { fingerprint } => {
            let found = match live.found.get(&fingerprint) {
                Some(r) => Some(r),
                None => live
                    .session
                    .lookup_ref(&Fingerprint(fingerprint))
                    .map_err(repo_err)?,
            };
            let r = found.ok_or_else(|| {
                bad(format!(
                    "{} is not in the repository; send its bytes",
                    Fingerprint(fingerprint).to_hex(HASH)
                ))
            })?;
            live.session.push(r, false).map_err(repo_err)?;
        }
        ItemRef::New { fingerprint, data } => {
            // Hashed here, whatever the client said: a wrong claim fails
            // the append, and never stores bytes under a name not theirs.
            let fp = hashed(repo, data, fp)?;
            if fp.0 != fingerprint {
                return Err(bad(format!(
                    "its bytes hash to {}, not to the fingerprint {} sent with them",
                    fp.to_hex(HASH),
                    Fingerprint(fingerprint).to_hex(HASH)
                )));
            }
            // Looked up again, not stored blindly: since the client's
            // lookup (several batches ago, in its pipeline) a concurrent
            // backup may have stored the same segment. 16 concurrent
            // streams stored 1 % more without this.
            live.session.append_sent(data, fp).map_err(repo_err)?;
        }
        ItemRef::Unhashed { data } => {
            let fp = hashed(repo, data, fp)?;
            live.session.append_sent(data, fp).map_err(repo_err)?;
        }
        ItemRef::Parent { offset, len } => {
            let p = live.parent.as_mut().ok_or_else(|| {
                bad("a parent item in a session without a parent (ask ParentTree or ParentImage; it named none)")
            })?;
            let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
                bad(format!(
                    "parent bytes {offset} + {len}: give a length of 1 or more that ends in range"
                ))
            })?;
            if offset < p.next {
                return Err(WireError::new(
                    ErrorKind::ParentUnusable,
                    format!(
                        "parent bytes {offset}..{end} start before the end of the run before them ({}): runs go forward through the parent's stream; back up again without it",
                        p.next
                    ),
                ));
            }
            let taken = match live.parent_asked {
                // Whole blocks, each one segment, confirmed, or none.
                Some(Asked::Image(bs)) => {
                    let bs64 = u64::from(bs);
                    let whole = (offset % bs64 == 0 && len % bs64 == 0)
                        .then(|| {
                            let run = Some(&mut (repo, &mut p.recipe));
                            as_parent_had(&mut live.session, run, offset / bs64, len / bs64, bs)
                        })
                        .transpose()
                        .map_err(repo_err)?
                        .flatten();
                    match whole {
                        Some(refs) => {
                            live.session.push_all(&refs, false).map_err(repo_err)?;
                            len
                        }
                        None => 0,
                    }
                }
                _ => {
                    let file = Unchanged { offset, size: len };
                    (p.recipe.reuse(repo, &mut live.session, file)).map_err(repo_err)?
                }
            };
            p.next = end;
            if taken != len {
                return Err(WireError::new(
                    ErrorKind::ParentUnusable,
                    format!(
                        "bytes {offset}..{end} of the parent backup {}: only the first {taken} could be reused (changed or damaged since it was picked); back up again without it",
                        p.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The fingerprint of a segment's bytes from a client, of a length the
/// server takes: `fp` if the caller hashed them already.
fn hashed(
    repo: &Repository,
    data: &[u8],
    fp: Option<Fingerprint>,
) -> Result<Fingerprint, WireError> {
    if data.is_empty() || data.len() > MAX_SEGMENT {
        return Err(bad(format!(
            "a segment of {} bytes; segments are 1 to {MAX_SEGMENT} bytes",
            data.len()
        )));
    }
    Ok(fp.unwrap_or_else(|| repo.segment_hash().of(data)))
}

fn no_session(id: u64) -> WireError {
    WireError::new(
        ErrorKind::NoSuchSession,
        format!("no backup session {id} on this connection (never begun, ended, or aborted)"),
    )
}
