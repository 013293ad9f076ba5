//! Group commit: what lets a FLUSH skip a commit of its own.
//!
//! A FLUSH needs a commit that *starts* after it arrives: a commit holds the
//! commit gate exclusively, so it captures every write batch that finished
//! before it (`commit.rs`). Clients with several requests in flight (a
//! filesystem's journal, a database's log writers, fio at depth 4) send
//! FLUSHes back to back; each one committing alone costs a data sync and a
//! journal sync apiece. So FLUSHes take turns, and one whose turn comes
//! after a commit that started after it arrived and succeeded returns at
//! once: that commit covers it. A FLUSH that finds no write batch started
//! since the last successful commit has nothing to make durable either.
//!
//! Only for stores whose commits are crash-safe and taken under the
//! exclusive commit gate (`Engine::commits`); others commit as before.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::MutexGuard;

use super::gate::Turn;

#[derive(Default)]
pub(super) struct GroupCommit {
    /// Commits started (each is numbered by it), and the number of the
    /// latest one that succeeded.
    started: AtomicU64,
    succeeded: AtomicU64,
    /// Write batches started; counted under the shared commit gate, so a
    /// commit (exclusive gate) sees exactly the batches it captures.
    batches: AtomicU64,
    /// `batches` as the latest successful commit saw it.
    batches_committed: AtomicU64,
    /// FLUSHes commit one at a time, so the ones waiting behind a commit
    /// can find it covered them.
    turn: Turn,
}

/// A commit in progress: its number and the batches it captures.
pub(super) struct Begun {
    number: u64,
    batches: u64,
}

impl GroupCommit {
    /// A write batch starts (the caller holds the commit gate shared).
    pub fn batch(&self) {
        self.batches.fetch_add(1, SeqCst);
    }

    /// A commit starts (the caller holds the commit gate exclusively).
    pub fn begin(&self) -> Begun {
        Begun {
            number: self.started.fetch_add(1, SeqCst) + 1,
            batches: self.batches.load(SeqCst),
        }
    }

    /// The commit `begun` is durable.
    pub fn succeeded(&self, begun: Begun) {
        self.succeeded.fetch_max(begun.number, SeqCst);
        self.batches_committed.fetch_max(begun.batches, SeqCst);
    }

    /// A FLUSH arrives: what it must wait for.
    pub fn arrive(&self) -> u64 {
        self.started.load(SeqCst)
    }

    /// The FLUSH's turn to commit, and whether it still needs to: `None`
    /// if a commit started after it arrived (`arrived` from `arrive`) has
    /// succeeded, or no write batch started since the latest successful
    /// commit.
    pub fn turn(&self, arrived: u64) -> Option<MutexGuard<'_, ()>> {
        let turn = self.turn.lock();
        let covered = self.succeeded.load(SeqCst) > arrived
            || self.batches.load(SeqCst) == self.batches_committed.load(SeqCst);
        (!covered).then_some(turn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_is_covered_only_by_a_commit_that_started_after_it() {
        let g = GroupCommit::default();
        g.batch();
        let early = g.begin();
        let arrived = g.arrive();
        g.succeeded(early);
        // The commit began before the flush arrived: it may have missed
        // batches the flush must cover... unless no batch started since.
        g.batch();
        assert!(g.turn(arrived).is_some());
        let later = g.begin();
        g.succeeded(later);
        assert!(g.turn(arrived).is_none());
    }

    #[test]
    fn a_failed_commit_covers_nothing() {
        let g = GroupCommit::default();
        g.batch();
        let arrived = g.arrive();
        // Begun, never reported to have succeeded.
        let _failed = g.begin();
        assert!(g.turn(arrived).is_some());
    }

    #[test]
    fn a_flush_with_no_batch_since_the_last_commit_is_covered() {
        let g = GroupCommit::default();
        assert!(g.turn(g.arrive()).is_none());
        g.batch();
        assert!(g.turn(g.arrive()).is_some());
        let c = g.begin();
        g.succeeded(c);
        assert!(g.turn(g.arrive()).is_none());
    }
}
