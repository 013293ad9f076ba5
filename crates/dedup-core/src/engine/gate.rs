//! Locks held across synchronous I/O: the commit gate (a commit holds it
//! exclusively through its data and journal syncs) and the FLUSH turn
//! (held by the FLUSH whose commit runs).
//!
//! parking_lot's locks spin before they sleep, yielding the CPU up to ten
//! times per attempt. Waiting out a sync of a millisecond that way only
//! burns the CPU the committing thread and the write-back appliers need:
//! with fio's random writes and a FLUSH every 8 (two cores), write-back
//! appliers waiting for the gate and FLUSHes waiting for their turn made
//! 26,285 `sched_yield` calls in five seconds (2,702 after). std's locks
//! wait on a futex after a short spin without yielding. What they guard
//! is `()`, so a panic while one was held (poison) leaves nothing
//! inconsistent to refuse.

use std::sync::{
    Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError,
};

/// A reader/writer lock whose waiters sleep.
#[derive(Default)]
pub(crate) struct Gate(RwLock<()>);

impl Gate {
    pub fn read(&self) -> RwLockReadGuard<'_, ()> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shared now, or `None` if it is held or waited for exclusively:
    /// std's futex RwLock on Linux prefers a waiting writer, so a new
    /// reader is refused while any commit holds the gate or waits for it,
    /// but for a moment as the last reader leaves, before the waiting
    /// commit wakes (the reader then goes first; nothing depends on it).
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, ()>> {
        match self.0.try_read() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, ()> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A mutex whose waiters sleep.
#[derive(Default)]
pub(crate) struct Turn(Mutex<()>);

impl Turn {
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
