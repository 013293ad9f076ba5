//! The protection map (§3.3): what running backups reference, so garbage
//! collection never deletes a container a backup is about to commit a
//! reference to.
//!
//! A container is unsafe to delete while a backup session holds it: one
//! it wrote (no committed recipe references it yet) or one whose segment
//! it reused after a lookup (the backup that referenced it may have been
//! deleted since GC marked). The race that cost Duplicacy and rustic
//! data is between GC deciding "unreferenced" and a backup reusing the
//! segment; here both happen under this map's one lock:
//!
//! - a lookup hit on a container is kept only if the container is not
//!   condemned, and then the container is protected until the session ends;
//! - GC condemns only containers no session protects, and once condemned a
//!   container is never handed out again.
//!
//! A session that commits while a GC runs keeps its containers protected
//! until that GC ends: the GC listed the committed backups before the
//! commit, so it did not mark them.
//!
//! Compaction uses the same lock: it condemns a container before
//! rewriting it (so it never rewrites one a session holds, which may
//! reference an entry the marks call dead, and no lookup hands it out
//! meanwhile) and releases it once the new version is in place, unless
//! it was condemned already (by an epoch of another collection, which
//! keeps it out of reach for good).
//!
//! The same holds for the recipe and tree a session puts before its backup
//! object, and for the recipe's parts, which it puts as it goes:
//! announced here first (`will_write`, the recipe's name standing for its
//! parts), they are not orphans to a GC that lists recipes, then takes
//! `pending_objects`, then lists backups. A recipe or part listed was put,
//! so announced before the list; if no longer pending when the GC looks,
//! its session either committed (and its backup object is in the later
//! listing) or gave up (and the recipe and its parts are orphans).

use std::collections::{HashMap, HashSet};

#[derive(Default)]
pub(crate) struct Protection {
    next_session: u64,
    /// Containers each running session holds.
    active: HashMap<u64, HashSet<u64>>,
    /// Recipe and tree objects each running session is writing or about to
    /// write, which its backup object will name (a recipe's name covers
    /// its parts): they look orphaned to a GC until the commit point.
    pending: HashMap<u64, Vec<String>>,
    /// Containers of sessions that committed while a GC was running.
    committed_during_gc: HashSet<u64>,
    gc_running: bool,
    /// Containers a GC decided to delete: never reused, even if the
    /// deletion fails part-way.
    condemned: HashSet<u64>,
    /// Of those, the ones another process's collection condemned (or may
    /// have deleted): a compaction here never releases them.
    for_good: HashSet<u64>,
    /// Sessions that held what a collection in another process may have
    /// deleted since (`pinning.rs`): they must not commit.
    lost: HashSet<u64>,
    /// Containers a collection in another process means to compact, with
    /// the entries it found live: the others are never handed out.
    restricted: HashMap<u64, Vec<u8>>,
}

impl Protection {
    pub(crate) fn begin_session(&mut self) -> u64 {
        let id = self.next_session;
        self.next_session += 1;
        self.active.insert(id, HashSet::new());
        id
    }

    /// Protect `container` for `session`; false if GC condemned it (the
    /// caller must then not reference it).
    pub(crate) fn hold(&mut self, session: u64, container: u64) -> bool {
        if self.condemned.contains(&container) {
            return false;
        }
        self.active.entry(session).or_default().insert(container);
        true
    }

    /// Whether `session` holds `container`.
    pub(crate) fn holds(&self, session: u64, container: u64) -> bool {
        self.active
            .get(&session)
            .is_some_and(|held| held.contains(&container))
    }

    /// `session` is about to put `object` (its recipe, the first of the
    /// recipe's parts, or its tree), which its backup object will name: GC
    /// must not take it, or the recipe's parts, for an orphan.
    pub(crate) fn will_write(&mut self, session: u64, object: &str) {
        self.pending
            .entry(session)
            .or_default()
            .push(object.to_string());
    }

    /// The objects running sessions are about to commit, for a GC that
    /// lists the recipes first, then takes this, then lists the backups.
    pub(crate) fn pending_objects(&self) -> HashSet<String> {
        self.pending.values().flatten().cloned().collect()
    }

    /// The session committed: its containers are referenced by a backup
    /// object now, which a GC starting later will mark.
    pub(crate) fn commit_session(&mut self, session: u64) {
        self.pending.remove(&session);
        self.lost.remove(&session);
        if let Some(held) = self.active.remove(&session) {
            if self.gc_running {
                self.committed_during_gc.extend(held);
            }
        }
    }

    /// The session ended without committing: what it wrote is garbage.
    pub(crate) fn abort_session(&mut self, session: u64) {
        self.active.remove(&session);
        self.pending.remove(&session);
        self.lost.remove(&session);
    }

    /// Every session holding one of `containers` or about to commit one
    /// of `objects` is lost: a collection may have deleted it.
    pub(crate) fn lose_holding(&mut self, containers: &[u64], objects: &[String]) {
        for (&session, held) in &self.active {
            let pending = self.pending.get(&session);
            if containers.iter().any(|c| held.contains(c))
                || pending.is_some_and(|p| p.iter().any(|o| objects.contains(o)))
            {
                self.lost.insert(session);
            }
        }
    }

    /// Hand out only the entries set in `live` of `container` from now on
    /// (it is to be compacted down to them).
    pub(crate) fn restrict(&mut self, container: u64, live: Vec<u8>) {
        self.restricted.insert(container, live);
    }

    /// Whether entry `entry` of `container` may be handed out.
    pub(crate) fn allows(&self, container: u64, entry: u32) -> bool {
        // Asked for every reference a backup takes from its parent;
        // nothing is restricted but while a collection's result waits.
        if self.restricted.is_empty() {
            return true;
        }
        self.restricted.get(&container).is_none_or(|live| {
            let i = entry as usize;
            live.get(i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
        })
    }

    /// Condemn `containers` for good, even where sessions hold them (an
    /// epoch condemned them, or a collection elsewhere may have deleted
    /// them): never handed out again, even when a compaction here that
    /// condemned one first releases it.
    pub(crate) fn condemn_even_held(&mut self, containers: &[u64]) {
        self.condemned.extend(containers.iter().copied());
        self.for_good.extend(containers.iter().copied());
    }

    /// Every running session is lost, and what they hold is never handed
    /// out again (a collection elsewhere may have deleted any of it).
    pub(crate) fn lose_all(&mut self) {
        self.lost.extend(self.active.keys().copied());
        let held: Vec<u64> = self.active.values().flatten().copied().collect();
        self.condemn_even_held(&held);
    }

    /// Whether `session` may no longer commit (see `lose_holding`).
    pub(crate) fn is_lost(&self, session: u64) -> bool {
        self.lost.contains(&session)
    }

    /// A GC starts; it must list the committed backups only after this.
    /// False if another GC is running.
    pub(crate) fn begin_gc(&mut self) -> bool {
        if self.gc_running {
            return false;
        }
        self.gc_running = true;
        self.committed_during_gc.clear();
        true
    }

    /// Of `candidates` (containers the GC found unreferenced), condemn and
    /// return those no session protects. One condemned by an earlier GC
    /// whose deletion failed is returned again once no session holds it
    /// (none took it since: a condemned container is never held anew), so
    /// the next GC of this process finishes the job.
    pub(crate) fn condemn(&mut self, candidates: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut out = Vec::new();
        for c in candidates {
            let held = self.committed_during_gc.contains(&c)
                || self.active.values().any(|held| held.contains(&c));
            if !held {
                self.condemned.insert(c);
                out.push(c);
            }
        }
        out
    }

    /// A compaction condemned `container` to keep sessions off it while
    /// it replaced it; the new version may be handed out again, unless an
    /// epoch condemned it meanwhile.
    pub(crate) fn release(&mut self, container: u64) {
        if !self.for_good.contains(&container) {
            self.condemned.remove(&container);
        }
    }

    pub(crate) fn is_condemned(&self, container: u64) -> bool {
        self.condemned.contains(&container)
    }

    pub(crate) fn end_gc(&mut self) {
        self.gc_running = false;
        self.committed_during_gc.clear();
    }

    /// How many sessions are running.
    pub(crate) fn sessions(&self) -> usize {
        self.active.len()
    }

    /// Containers the running sessions hold, for reports and tests.
    pub(crate) fn held(&self) -> HashSet<u64> {
        self.active.values().flatten().copied().collect()
    }

    /// Whether a collection in another process must already leave
    /// `container` to this one: a running session holds it (and so a pin
    /// does), or this process's GC keeps it.
    pub(crate) fn kept_here(&self, container: u64) -> bool {
        self.committed_during_gc.contains(&container)
            || self.active.values().any(|held| held.contains(&container))
    }

    /// What no collection may take from this process: the containers
    /// running sessions hold and those of sessions that committed while
    /// this process's GC ran. What its pins hold.
    pub(crate) fn kept(&self) -> HashSet<u64> {
        let mut out = self.held();
        out.extend(self.committed_during_gc.iter().copied());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_container_is_never_condemned_and_a_condemned_one_never_held() {
        let mut p = Protection::default();
        let s = p.begin_session();
        assert!(p.hold(s, 1));
        assert!(p.begin_gc());
        assert_eq!(p.condemn([1, 2]), vec![2]);
        assert!(!p.hold(s, 2), "a condemned container is refused");
        assert!(p.is_condemned(2));
        p.end_gc();
        p.abort_session(s);
        assert!(p.held().is_empty());
    }

    /// An epoch applied while this process compacted a container
    /// condemns it for good: the compaction's release does not hand it
    /// out again (a collection elsewhere may delete it).
    #[test]
    fn a_release_never_hands_out_what_an_epoch_condemned() {
        let mut p = Protection::default();
        assert_eq!(p.condemn([5]), vec![5], "the compaction's own condemning");
        p.condemn_even_held(&[5]);
        p.release(5);
        let s = p.begin_session();
        assert!(!p.hold(s, 5), "handed out again after the release");
        assert_eq!(p.condemn([6]), vec![6]);
        p.release(6);
        assert!(p.hold(s, 6), "a compaction's own condemning is released");
    }

    #[test]
    fn a_commit_during_gc_keeps_its_containers_until_the_gc_ends() {
        let mut p = Protection::default();
        assert!(p.begin_gc());
        assert!(!p.begin_gc(), "one GC at a time");
        let s = p.begin_session();
        assert!(p.hold(s, 7));
        p.commit_session(s);
        assert!(p.condemn([7]).is_empty());
        p.end_gc();
        // A later GC lists the backup that references 7 and marks it; were
        // it unreferenced by then (deleted), 7 may go.
        assert!(p.begin_gc());
        assert_eq!(p.condemn([7]), vec![7]);
    }
}
