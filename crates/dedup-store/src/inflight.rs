//! Containers not yet durable, shared by the backups running on one
//! repository handle (the paper's one server, many streams, §3.4).
//!
//! Each backup session fills a container of its own, so streams never
//! wait for each other's writes and keep their locality. The index learns
//! of a container only once it is durable, and a container holds some
//! 45 MiB of stream (16 MiB at zstd's ratio on an ext4 image): sixteen
//! concurrent streams of 64 MiB each were each about one open container,
//! and none could reuse another's segments (the repository came out 2 %
//! larger than restic's). So every session's open and sealing containers
//! are listed here, fingerprint by fingerprint, and another session may
//! reference a segment in one.
//!
//! Such a reference must not be committed before the container is
//! durable, and the session that fills it may be idle for an hour (its
//! client paused): so a session that commits with a reference to a
//! container still open takes the container's writer and seals and puts
//! it itself, and its owner starts a new one at its next segment. Exactly
//! one session seals a container: it `claim`s it first, under this
//! table's lock. A session that ends without committing drops its open
//! container unless another session references it; then it writes it
//! first, as garbage its own backup no longer needs but the other's does.
//!
//! Entries leave the table once their container is in the index (or
//! dropped), so the table holds at most the open and sealing containers
//! of the running sessions.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use dedup_common::fingerprint::Fingerprint;

use crate::fp_map::FpMap;
use crate::writer::ContainerWriter;

/// Where a segment is: container, catalog entry, raw length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) container: u64,
    pub(crate) entry: u32,
    pub(crate) len: u32,
}

/// Where a container not yet in the index stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Being filled; its writer is in [`Pending::writer`].
    Open,
    /// Sealed by the session that claimed it, which is putting it.
    Sealing,
    /// Put and synced, this many bytes.
    Durable(u64),
    /// Its put failed, for this reason: every backup referencing it fails.
    Lost(String),
    /// Given up open, referenced by nobody: never written.
    Dropped,
}

impl State {
    /// Open or sealing: its outcome is still to come.
    fn unsettled(&self) -> bool {
        matches!(self, State::Open | State::Sealing)
    }
}

/// A container not yet durable.
pub(crate) struct Pending {
    pub(crate) id: u64,
    state: Mutex<State>,
    settled: Condvar,
    /// The writer while the container is open: its session adds to it, and
    /// the session that claims it takes it to seal it.
    pub(crate) writer: Mutex<Option<ContainerWriter>>,
}

impl Pending {
    /// Record the outcome of the container's put (or its drop) and wake
    /// whoever waits for it.
    pub(crate) fn settle(&self, to: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = to;
        self.settled.notify_all();
    }

    /// Wait until the container is durable, lost or dropped.
    pub(crate) fn wait_settled(&self) -> State {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.unsettled() {
            s = self.settled.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.clone()
    }

    /// The writer, locked (`None` once a session took it to seal).
    pub(crate) fn writer(&self) -> MutexGuard<'_, Option<ContainerWriter>> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Settles its container as lost if dropped while the container is still
/// open or sealing: a put that panics must not leave the backups that
/// reuse its segments waiting for ever.
pub(crate) struct SettleGuard<'a>(pub(crate) &'a Pending);

impl Drop for SettleGuard<'_> {
    fn drop(&mut self) {
        let p = self.0;
        let mut s = p.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.unsettled() {
            *s = State::Lost("its put did not finish (the thread panicked)".into());
            p.settled.notify_all();
        }
    }
}

struct Listed {
    pending: Arc<Pending>,
    fingerprints: Vec<Fingerprint>,
    /// The sessions other than its owner that reference its segments and
    /// have not given up.
    wanted_by: HashSet<u64>,
}

#[derive(Default)]
pub(crate) struct InFlight {
    by_fp: FpMap<Place>,
    containers: HashMap<u64, Listed>,
}

impl InFlight {
    /// List a new open container, `writer` filling it.
    pub(crate) fn open(&mut self, writer: ContainerWriter) -> Arc<Pending> {
        let id = writer.id();
        let pending = Arc::new(Pending {
            id,
            state: Mutex::new(State::Open),
            settled: Condvar::new(),
            writer: Mutex::new(Some(writer)),
        });
        self.containers.insert(
            id,
            Listed {
                pending: pending.clone(),
                fingerprints: Vec::new(),
                wanted_by: HashSet::new(),
            },
        );
        pending
    }

    /// Segment `fp` was added at `at` (ignored if its container is no
    /// longer listed: it is in the index by now, or dropped).
    pub(crate) fn add(&mut self, fp: Fingerprint, at: Place) {
        if let Some(listed) = self.containers.get_mut(&at.container) {
            listed.fingerprints.push(fp);
            self.by_fp.insert(fp, at);
        }
    }

    /// Where `fp` is in a listed container. The container is marked
    /// wanted by session `asker` (sessions ask only after their own
    /// containers, so the asker is another session), so that its owner
    /// will not drop it.
    pub(crate) fn find(&mut self, fp: &Fingerprint, asker: u64) -> Option<(Place, Arc<Pending>)> {
        let at = *self.by_fp.get(fp)?;
        let listed = self.containers.get_mut(&at.container)?;
        // One whose put failed is no place for a segment (until its owner
        // unlists it).
        if matches!(
            *listed
                .pending
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            State::Lost(_) | State::Dropped
        ) {
            return None;
        }
        listed.wanted_by.insert(asker);
        Some((at, listed.pending.clone()))
    }

    /// Claim `p` for sealing: true if it was open (the caller must now
    /// take its writer, seal and put it, and `settle` it); false if
    /// another session claimed it first or it is no longer open.
    pub(crate) fn claim(&mut self, p: &Pending) -> bool {
        let mut s = p.state.lock().unwrap_or_else(|p| p.into_inner());
        if *s != State::Open {
            return false;
        }
        *s = State::Sealing;
        true
    }

    /// The owner of open container `p` ends without committing: claim it
    /// if another session references it (true: the caller must write it),
    /// else drop it, unlisted, so nobody finds it from now on.
    pub(crate) fn abandon(&mut self, p: &Pending) -> bool {
        let wanted = self
            .containers
            .get(&p.id)
            .is_some_and(|l| !l.wanted_by.is_empty());
        if wanted {
            return self.claim(p);
        }
        if self.claim(p) {
            p.settle(State::Dropped);
        }
        self.forget(p.id);
        false
    }

    /// Session `asker` gives up without committing: it no longer needs
    /// container `id`, which its owner may then drop if nobody else does.
    pub(crate) fn unwant(&mut self, asker: u64, id: u64) {
        if let Some(listed) = self.containers.get_mut(&id) {
            listed.wanted_by.remove(&asker);
        }
    }

    /// Unlist container `id` (in the index now, dropped, or lost).
    pub(crate) fn forget(&mut self, id: u64) {
        if let Some(listed) = self.containers.remove(&id) {
            for fp in listed.fingerprints {
                if self.by_fp.get(&fp).is_some_and(|at| at.container == id) {
                    self.by_fp.remove(&fp);
                }
            }
        }
    }
}
