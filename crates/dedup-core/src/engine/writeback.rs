//! Write-back: mutations acknowledged once queued in RAM, applied by
//! background threads.
//!
//! Why: a client such as the kernel's loop device over nbdfuse keeps one
//! request in flight, so every microsecond of fingerprinting, compressing
//! and index work lands on its critical path, while the raw device only
//! copies into the page cache. Queueing lets that work overlap the
//! client's next request. It keeps the NBD contract, which is also the
//! crash contract of DESIGN.md: a write is durable only once a FLUSH (or
//! its FUA) returns, and FLUSH and FUA wait for every mutation queued
//! before them. A crash loses what was queued and not flushed, as a disk
//! cache or the page cache under the raw device would.
//!
//! Rules that keep it a disk:
//! - Mutations that touch a common chunk are applied in the order they
//!   were acknowledged; others run in parallel (one applier per core).
//! - A read, extent query, check, GC or statistics call first waits for
//!   the queued mutations it could see (reads: only those overlapping).
//! - The queue admits a mutation only if every queued one can still get
//!   a new chunk for each chunk it writes (`room`): one that might find
//!   the device full is applied before it is acknowledged, so ENOSPC
//!   reaches the request that caused it.
//! - A write of any size arriving while a FLUSH's commit holds the gate
//!   is queued, against the room the commit saw less what the requests
//!   in flight may take (`Device::commit_room` says why that suffices),
//!   instead of waiting out the commit's syncs.
//! - A queued mutation that fails anyway (an I/O error, the host's disk
//!   full) was acknowledged, so it is never dropped: it stays queued and
//!   the device stalls on it, retrying it with a growing pause (up to
//!   `MAX_RETRY_PAUSE`) until it applies. While it stalls, FLUSH and FUA
//!   fail with its error (what was acknowledged is not durable yet), and
//!   so does every request that would wait for it (a read of its range,
//!   any new mutation: nothing new is acknowledged meanwhile). Once the
//!   cause is fixed (space freed on the host) it applies, everything
//!   queued behind it applies in order, and FLUSH succeeds again: no
//!   restart, no acknowledged write lost. Only a clean stop that finds it
//!   still failing after `CLOSE_PATIENCE` gives it up, loudly, to save
//!   the metadata.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tracing::error;

use super::write_path::Mutation;
use super::Engine;
use crate::error::Error;
use crate::stats::Counters;

/// Mutations queued at most, whatever their size: enough to absorb the
/// bursts of a client's writeback, few enough to keep ordering them cheap.
const MAX_QUEUED: usize = 64;
/// The first pause before retrying a failed queued mutation, doubled at
/// each failure up to `MAX_RETRY_PAUSE`: a full host disk is freed by a
/// person, in seconds to hours; retrying faster only fills the log.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);
/// How long a clean stop keeps retrying a stalled mutation before it gives
/// it up to save the metadata.
pub(crate) const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

/// A queued mutation that failed: retried until it applies.
struct Stall {
    seq: u64,
    /// What failed and why, for the errors of requests that meet it.
    what: String,
    errno: i32,
    retry_at: Instant,
    pause: Duration,
}

struct Queued {
    seq: u64,
    what: Mutation,
    offset: u64,
    len: u64,
    /// A write's bytes (taken by the applier that runs it).
    data: Option<Vec<u8>>,
    /// Chunks it touches.
    chunks: Range<u64>,
    /// New chunks it may need (held against `room` while it is queued).
    room: u64,
    bytes: usize,
    running: bool,
    /// Admitted against a commit's room (counted in `State::from_commit`).
    from_commit: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    next_seq: u64,
    bytes: usize,
    room_held: u64,
    /// New chunks the device can still give beyond `room_held`, at least
    /// (read from the engine only when it seems too small: completions
    /// and frees only ever make the true value larger).
    spare: u64,
    /// A queued mutation that failed and is being retried.
    stalled: Option<Stall>,
    /// Queued mutations admitted against a commit's room (`submit`): a
    /// request that bypassed the queue may still be in flight beside
    /// them, which `spare` does not know of, so until they are applied
    /// `spare` is read again for every mutation.
    from_commit: usize,
    stop: bool,
    /// Buffers of applied writes, kept for the next ones (at most
    /// `limit_bytes` of them): a fresh large allocation is mapped, faulted
    /// in page by page and unmapped again with a TLB shootdown, which cost
    /// more than the copy itself.
    spare_buffers: Vec<Vec<u8>>,
    spare_buffer_bytes: usize,
}

impl State {
    /// The next mutation to run: while stalled, only the stalled one, once
    /// its pause is over (`Err`: when that is).
    fn next(&self) -> Result<Option<usize>, Instant> {
        match &self.stalled {
            None => Ok(self.runnable()),
            Some(st) if Instant::now() < st.retry_at => Err(st.retry_at),
            Some(st) => Ok(self
                .queue
                .iter()
                .position(|q| q.seq == st.seq && !q.running)),
        }
    }

    /// The error a request that meets the stall gets. For a full host
    /// filesystem it says how much to free (`resume_bytes`) and where.
    fn stall_error(&self, host: &str) -> Option<Error> {
        let st = self.stalled.as_ref()?;
        let fix = if st.errno == libc::ENOSPC {
            format!(
                "free at least {} MB on the filesystem holding {host}",
                resume_bytes(self.bytes as u64).div_ceil(1_000_000)
            )
        } else {
            "fix the device".to_string()
        };
        Some(Error::Io {
            context: format!(
                "{}, after it was acknowledged; it is kept and retried until it applies \
                 ({fix}), and until then every flush fails and nothing new is accepted",
                st.what
            ),
            cause: std::io::Error::from_raw_os_error(st.errno),
        })
    }

    /// The first queued mutation no earlier one overlaps.
    fn runnable(&self) -> Option<usize> {
        let mut earlier: Vec<&Range<u64>> = Vec::new();
        for (i, q) in self.queue.iter().enumerate() {
            if !q.running && !earlier.iter().any(|r| overlaps(r, &q.chunks)) {
                return Some(i);
            }
            earlier.push(&q.chunks);
        }
        None
    }

    /// Hold room for a mutation about to be queued or applied directly.
    /// `spare` shrinks with it whichever way it goes: a direct mutation
    /// allocates too, and until it is done nothing may be queued against
    /// the room it takes (nothing marks `spare` stale after it).
    fn hold(&mut self, need: u64) {
        self.room_held += need;
        self.spare = self.spare.saturating_sub(need);
    }

    /// Whether a mutation queued before `seq` still touches `chunks`.
    fn pending(&self, seq: u64, chunks: &Range<u64>) -> bool {
        self.queue
            .iter()
            .any(|q| q.seq < seq && overlaps(&q.chunks, chunks))
    }
}

/// Host bytes the queued mutations need to apply after a full host
/// filesystem stalled them: their data (at worst uncompressed), the table
/// blocks they may write for the first time (LBN entry, count and chunk
/// record: 45 bytes a 4 KiB chunk, about 1.1 %, taken as 2 %) and 1 MiB
/// for the blocks a commit's root, summaries and partly new table blocks
/// may take. The journal needs none: its blocks are reserved at open
/// (`backends/disktable/tables.rs`).
pub(crate) fn resume_bytes(queued: u64) -> u64 {
    queued + queued / 50 + (1 << 20)
}

fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

struct Shared {
    /// Mutations queued or running in an applier, plus submitters
    /// deciding whether to queue: while it is 0, a request that is not
    /// alone may bypass the queue entirely (see `Device::mutate`).
    users: AtomicUsize,
    /// A request bypassed the queue and may have allocated: `spare` must
    /// be read again before anything is queued.
    stale: AtomicBool,
    state: Mutex<State>,
    /// Appliers wait on it for a runnable mutation.
    work: Condvar,
    /// Readers, flushes and direct writers wait on it for mutations to be
    /// applied.
    changed: Condvar,
    limit_bytes: usize,
    chunk_size: u64,
    /// The directory of the data file, for what to free when it is full.
    host: String,
}

/// One count in `Shared::users`, given back when dropped (a panic in
/// `submit` included); a queued mutation's is forgotten and given back
/// by its applier.
struct User<'a>(&'a AtomicUsize);

impl<'a> User<'a> {
    fn new(users: &'a AtomicUsize) -> User<'a> {
        users.fetch_add(1, SeqCst);
        User(users)
    }
}

impl Drop for User<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// A mutation as `submit` takes it: a write's bytes, or none.
#[derive(Clone, Copy)]
pub(crate) struct Request<'a> {
    pub what: Mutation,
    pub offset: u64,
    pub len: u64,
    pub buf: &'a [u8],
}

/// What `submit` asks the device about the moment a request arrives.
pub(crate) trait Admission {
    /// New chunks the device can give now (waits for the engine's mutex).
    fn room(&self) -> u64;
    /// Whether the request may be queued for arriving alone: it must be
    /// false whenever another request is in flight, and is asked once the
    /// submitter counts as a user.
    fn alone(&self) -> bool;
    /// What the other requests in flight may need, given this one's.
    fn others_need(&self, own: u64) -> u64;
    /// While a commit holds the gate, the room it saw (`Engine::commit_room`).
    fn commit_room(&self) -> Option<u64>;
}

/// What `submit` did with a mutation.
pub(crate) enum Admit {
    Queued,
    /// The caller applies it, once `after` is applied; `held` is for
    /// `done_direct`.
    Direct {
        held: u64,
        after: Wait,
    },
}

/// Which queued mutations a direct one waits for.
pub(crate) enum Wait {
    All,
    Overlapping,
}

/// The queue and its appliers; dropping it stops them (what was queued
/// and not applied is lost, like a crash).
pub(crate) struct WriteBack {
    /// Writes smaller than this are never queued
    /// (`OpenOptions::write_back_from_bytes`).
    pub queue_from: u64,
    shared: Arc<Shared>,
    appliers: Vec<JoinHandle<()>>,
}

impl WriteBack {
    pub fn start(engine: &Arc<Engine>, limit_bytes: u64, queue_from: u64) -> WriteBack {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 4));
        let mut wb = WriteBack::unstarted(
            limit_bytes,
            queue_from,
            engine.config().chunk_size as u64,
            engine.host_dir.clone(),
        );
        wb.appliers = (0..threads)
            .map(|i| {
                let (shared, engine) = (wb.shared.clone(), engine.clone());
                std::thread::Builder::new()
                    .name(format!("dedup-writeback-{i}"))
                    .spawn(move || apply_queued(&shared, &engine))
                    .expect("the system can start a thread")
            })
            .collect();
        wb
    }

    /// The queue with no appliers yet (tests drive `submit` on it alone).
    fn unstarted(limit_bytes: u64, queue_from: u64, chunk_size: u64, host: String) -> WriteBack {
        let shared = Arc::new(Shared {
            users: AtomicUsize::new(0),
            stale: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            changed: Condvar::new(),
            limit_bytes: limit_bytes.min(usize::MAX as u64) as usize,
            chunk_size,
            host,
        });
        WriteBack {
            queue_from,
            shared,
            appliers: Vec::new(),
        }
    }

    fn chunks(&self, offset: u64, len: u64) -> Range<u64> {
        let cs = self.shared.chunk_size;
        offset / cs..offset.saturating_add(len).div_ceil(cs)
    }

    /// The new chunks a mutation may need: a write one for every chunk it
    /// covers, a trim only for the partial chunks at its ends.
    pub fn need(&self, what: Mutation, offset: u64, len: u64) -> u64 {
        let chunks = self.chunks(offset, len);
        match what {
            Mutation::Write => chunks.end - chunks.start,
            _ => (chunks.end - chunks.start).min(2),
        }
    }

    /// Whether nothing is queued, running in an applier, or being queued.
    pub fn idle(&self) -> bool {
        self.shared.users.load(SeqCst) == 0
    }

    /// Queue a mutation whose range the caller checked, copying a write's
    /// bytes, or say how the caller must apply it itself (`Direct`), then
    /// call `done_direct`:
    /// - after every queued mutation, if the device may not have room for
    ///   it (ENOSPC must reach this request) or write-back stopped after
    ///   a failure;
    /// - after the queued mutations it overlaps, if the client keeps
    ///   several requests in flight (`alone` is false: it must be false
    ///   whenever another is in flight, and is asked once this submitter
    ///   counts as a user) or the queue is full: such requests are
    ///   applied in parallel in their own threads, as without write-back.
    pub fn submit(&self, req: Request<'_>, ask: &impl Admission) -> Admit {
        let Request {
            what, offset, len, ..
        } = req;
        let chunks = self.chunks(offset, len);
        let need = self.need(what, offset, len);
        let sh = &self.shared;
        // Counted before `alone` and `others_need` are asked: a request
        // that then finds `idle`, and bypasses all this, is seen by them
        // (all SeqCst).
        let user = User::new(&sh.users);
        let alone = ask.alone();
        let mut s = sh.state.lock();
        // A trim that touches nothing queued may go past a stall: it only
        // frees, and its commit (`Device::mutate`) gives space back
        // through the device while writes wait for space.
        if s.stalled.is_some() && what != Mutation::Write && !s.pending(u64::MAX, &chunks) {
            s.hold(need);
            return Admit::Direct {
                held: need,
                after: Wait::Overlapping,
            };
        }
        // What the other requests in flight may take, read before any
        // room: one that allocated since is then counted twice, never not
        // at all.
        let others = ask.others_need(need);
        if let Some(room) = ask.commit_room() {
            let room = room.saturating_sub(others);
            // A commit holds the gate, and the engine's mutex, which
            // `room()` would wait for: a write is queued against the room
            // the commit saw; anything else is applied after everything
            // queued, as the device might be full.
            let full = s.queue.len() >= MAX_QUEUED || s.bytes + req.buf.len() > sh.limit_bytes;
            let fits = s.room_held + need <= room;
            s.hold(need);
            if what == Mutation::Write && s.stalled.is_none() && !s.stop && !full && fits {
                s.from_commit += 1;
                return self.enqueue(s, user, req, chunks, need, true);
            }
            return Admit::Direct {
                held: need,
                after: Wait::All,
            };
        }
        // Beside writes queued during a commit, a request that bypassed
        // the queue may still be in flight and take room they count on:
        // the room is then read again, less what those in flight may take.
        if sh.stale.swap(false, SeqCst) || need > s.spare || s.from_commit > 0 {
            s.spare = ask
                .room()
                .saturating_sub(s.room_held)
                .saturating_sub(others);
        }
        // Held either way: a direct write allocates too, and queued ones
        // admitted meanwhile must not count on its room.
        let fits = need <= s.spare;
        s.hold(need);
        let direct = |after| Admit::Direct { held: need, after };
        if s.stalled.is_some() || s.stop || !fits {
            s.spare = 0;
            return direct(Wait::All);
        }
        let full = s.queue.len() >= MAX_QUEUED || s.bytes + req.buf.len() > sh.limit_bytes;
        if !alone || (full && !s.queue.is_empty()) {
            return direct(Wait::Overlapping);
        }
        self.enqueue(s, user, req, chunks, need, false)
    }

    /// Queue a mutation admitted with the room it needs held.
    fn enqueue(
        &self,
        mut s: parking_lot::MutexGuard<'_, State>,
        user: User<'_>,
        req: Request<'_>,
        chunks: Range<u64>,
        need: u64,
        from_commit: bool,
    ) -> Admit {
        let Request {
            what,
            offset,
            len,
            buf,
        } = req;
        let sh = &self.shared;
        // The queued mutation is a user until its applier is done with it.
        std::mem::forget(user);
        let seq = s.next_seq;
        s.next_seq += 1;
        s.bytes += buf.len();
        let data = (what == Mutation::Write).then(|| {
            let mut copy = s.spare_buffers.pop().unwrap_or_default();
            s.spare_buffer_bytes -= copy.capacity();
            copy.clear();
            copy.extend_from_slice(buf);
            copy
        });
        s.queue.push_back(Queued {
            seq,
            what,
            offset,
            len,
            data,
            chunks,
            room: need,
            bytes: buf.len(),
            running: false,
            from_commit,
        });
        // Woken after the lock is released, so the applier does not wake
        // only to wait for it.
        drop(s);
        sh.work.notify_one();
        Admit::Queued
    }

    /// Whether a queued mutation failed and is being retried.
    pub fn stalled(&self) -> bool {
        self.shared.state.lock().stalled.is_some()
    }

    /// A `Direct` mutation is done: give back the room it held.
    pub fn done_direct(&self, held: u64) {
        self.shared.state.lock().room_held -= held;
    }

    /// Wait until every mutation queued before now that touches the byte
    /// range `offset..offset+len` has been applied; the stall's error if
    /// one of them cannot be yet.
    pub fn wait_range(&self, offset: u64, len: u64) -> Result<(), Error> {
        self.wait_for(self.chunks(offset, len))
    }

    /// Wait until every mutation queued before now has been applied; the
    /// stall's error if one cannot be yet.
    pub fn wait_all(&self) -> Result<(), Error> {
        self.wait_for(0..u64::MAX)
    }

    fn wait_for(&self, chunks: Range<u64>) -> Result<(), Error> {
        if self.idle() {
            return Ok(());
        }
        let sh = &self.shared;
        let mut s = sh.state.lock();
        let before = s.next_seq;
        while s.pending(before, &chunks) && !s.stop {
            // Behind a stall nothing moves until it clears.
            if let Some(e) = s.stall_error(&sh.host) {
                return Err(e);
            }
            sh.changed.wait(&mut s);
        }
        Ok(())
    }

    /// A clean stop: wait for every queued mutation, retrying a stalled
    /// one for up to `patience`; then give up what is still queued (it
    /// was acknowledged and is lost: logged and counted) so the metadata
    /// can be saved. Returns what was given up, if anything: the stop is
    /// then not clean (`Error::WritesLost`).
    pub fn settle_for_close(
        &self,
        counters: &Counters,
        patience: Duration,
    ) -> Option<(u64, String)> {
        let mut given_up: Option<(u64, String)> = None;
        // Patience counts from when a stall is seen, not from the start of
        // the close: draining a long queue first must not use it up. Stalls
        // that keep clearing and coming back are given three patiences in
        // all, so a close still ends.
        let started = Instant::now();
        let mut stalled_since: Option<Instant> = None;
        let sh = &self.shared;
        let mut s = sh.state.lock();
        while !s.queue.is_empty() && !s.stop {
            stalled_since = match (s.stalled.is_some(), stalled_since) {
                (false, _) => None,
                (true, None) => Some(Instant::now()),
                (true, since) => since,
            };
            if stalled_since
                .is_some_and(|t| t.elapsed() >= patience || started.elapsed() >= 3 * patience)
            {
                let lost = s.queue.iter().filter(|q| !q.running).count();
                let why = s
                    .stall_error(&sh.host)
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                error!(
                    "stopping: {lost} acknowledged mutations could not be applied in {} s and are lost: {why}",
                    patience.as_secs()
                );
                Counters::add(&counters.write_back_failures, lost as u64);
                let total = given_up.as_ref().map_or(0, |(n, _)| *n) + lost as u64;
                given_up = Some((total, why.clone()));
                let (mut bytes, mut room, mut from_commit) = (0, 0, 0);
                for q in s.queue.iter().filter(|q| !q.running) {
                    (bytes, room) = (bytes + q.bytes, room + q.room);
                    from_commit += usize::from(q.from_commit);
                }
                s.queue.retain(|q| q.running);
                sh.users.fetch_sub(lost, SeqCst);
                s.bytes -= bytes;
                s.room_held -= room;
                s.from_commit -= from_commit;
                s.stalled = None;
                continue;
            }
            sh.changed.wait_for(&mut s, Duration::from_millis(100));
        }
        given_up
    }

    /// A request bypassed the queue (it may have taken room `spare`
    /// counts on). Called when it is done, before it stops counting as
    /// in flight.
    pub fn bypassed(&self) {
        // Read first: deep clients pass here on every core, and a store
        // to a line another core shares costs a round trip.
        if !self.shared.stale.load(SeqCst) {
            self.shared.stale.store(true, SeqCst);
        }
    }
}

impl Drop for WriteBack {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.work.notify_all();
        self.shared.changed.notify_all();
        for t in self.appliers.drain(..) {
            // An applier finishes the mutation it is running, then stops.
            let _ = t.join();
        }
    }
}

/// An applier: run the first runnable mutation, again and again.
fn apply_queued(sh: &Shared, engine: &Engine) {
    loop {
        let (seq, what, offset, len, data) = {
            let mut s = sh.state.lock();
            let i = loop {
                if s.stop {
                    return;
                }
                match s.next() {
                    Ok(Some(i)) => break i,
                    Ok(None) => sh.work.wait(&mut s),
                    Err(at) => {
                        sh.work.wait_until(&mut s, at);
                    }
                }
            };
            let q = &mut s.queue[i];
            q.running = true;
            (q.seq, q.what, q.offset, q.len, q.data.take())
        };
        let mut data = data.unwrap_or_default();
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.perform(what, offset, len, &data)
        }))
        .unwrap_or_else(|_| {
            Err(Error::Io {
                context: format!("internal error applying a queued {what:?}"),
                cause: std::io::Error::other("panic in a write-back applier"),
            })
        });
        let mut s = sh.state.lock();
        let i = s
            .queue
            .iter()
            .position(|q| q.seq == seq)
            .expect("a running mutation stays queued until done");
        if let Err(e) = done {
            // Acknowledged: kept, with its bytes, and retried after a pause;
            // everything else waits (see the module's notes).
            let q = &mut s.queue[i];
            q.running = false;
            q.data = (what == Mutation::Write).then_some(data);
            let failed =
                format!("a {what:?} of {len} bytes at offset {offset} could not be applied ({e})");
            let pause = match &s.stalled {
                Some(st) if st.seq == seq => (st.pause * 2).min(MAX_RETRY_PAUSE),
                _ => {
                    error!(
                        "{failed}; it was acknowledged, so it is kept and retried until it applies; \
                         until then flushes fail and new requests are refused"
                    );
                    Counters::add(&engine.counters.write_back_failures, 1);
                    FIRST_RETRY_PAUSE
                }
            };
            s.stalled = Some(Stall {
                seq,
                what: failed,
                errno: e.errno(),
                retry_at: Instant::now() + pause,
                pause,
            });
            drop(s);
            // Waiters learn of the stall.
            sh.changed.notify_all();
            continue;
        }
        if s.stalled.as_ref().is_some_and(|st| st.seq == seq) {
            tracing::info!(
                "the queued {what:?} at offset {offset} applied on a retry; the device serves on"
            );
            s.stalled = None;
        }
        if s.spare_buffer_bytes + data.capacity() <= sh.limit_bytes {
            s.spare_buffer_bytes += data.capacity();
            s.spare_buffers.push(std::mem::take(&mut data));
        }
        let q = s.queue.remove(i).expect("index from position");
        sh.users.fetch_sub(1, SeqCst);
        s.bytes -= q.bytes;
        s.room_held -= q.room;
        s.from_commit -= usize::from(q.from_commit);
        // Its end may make a mutation that overlapped it runnable.
        let more = !s.queue.is_empty();
        drop(s);
        if more {
            sh.work.notify_one();
        }
        sh.changed.notify_all();
    }
}

#[cfg(test)]
#[path = "writeback_tests.rs"]
mod tests;
