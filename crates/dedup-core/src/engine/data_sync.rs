//! The thread that syncs the data device beside a commit's journal write
//! (`commit.rs`, `commit_beside_data`).
//!
//! One long-lived thread per device, started at the first commit that
//! wants it: a thread spawned for every commit cost a clone, a stack
//! mapping and an exit per FLUSH (1,400 of them in five seconds of fio's
//! random writes with a FLUSH every 8), on the path every synchronous
//! write waits on. Commits run one at a time (the metadata mutex), so the
//! thread serves one request at a time.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::placement::Placement;

pub(super) struct DataSync {
    placement: Arc<dyn Placement>,
    worker: Mutex<Option<Worker>>,
}

struct Worker {
    ask: Sender<()>,
    answer: Receiver<Result<()>>,
    thread: JoinHandle<()>,
}

/// A sync started by `DataSync::start`: `wait` for its result. Dropped
/// without a wait, it is waited for anyway, so a sync never outlives the
/// commit that started it.
pub(super) struct Started<'a> {
    worker: Option<MutexGuard<'a, Option<Worker>>>,
}

impl DataSync {
    pub fn new(placement: Arc<dyn Placement>) -> DataSync {
        DataSync {
            placement,
            worker: Mutex::new(None),
        }
    }

    /// Start `sync_written` on the thread (started now if there is none,
    /// or if the last one died). `None` if no thread can be had: the caller
    /// syncs inline.
    pub fn start(&self) -> Option<Started<'_>> {
        let mut worker = self.worker.lock();
        if let Some(w) = worker.as_ref() {
            if w.ask.send(()).is_ok() {
                return Some(Started {
                    worker: Some(worker),
                });
            }
            // The thread is gone (a panic in a sync): start another.
            if let Some(w) = worker.take() {
                let _ = w.thread.join();
            }
        }
        let (ask, asked) = channel::<()>();
        let (answer_tx, answer) = channel();
        let placement = self.placement.clone();
        let thread = std::thread::Builder::new()
            .name("dedup-data-sync".into())
            .spawn(move || {
                while asked.recv().is_ok() {
                    if answer_tx.send(placement.sync_written()).is_err() {
                        return;
                    }
                }
            })
            .ok()?;
        // The thread just started waits on `asked`, so this send fails
        // only if it already died; then the caller syncs inline.
        ask.send(()).ok()?;
        *worker = Some(Worker {
            ask,
            answer,
            thread,
        });
        Some(Started {
            worker: Some(worker),
        })
    }
}

impl Started<'_> {
    /// The sync's result.
    pub fn wait(mut self) -> Result<()> {
        self.take()
    }

    fn take(&mut self) -> Result<()> {
        let Some(mut worker) = self.worker.take() else {
            return Ok(());
        };
        let answered = worker.as_ref().map(|w| w.answer.recv());
        match answered {
            Some(Ok(result)) => result,
            _ => {
                // The thread panicked mid-sync: the next commit starts
                // another; this one's sync is not known to have happened.
                let why = match worker.take().map(|w| w.thread.join()) {
                    Some(Err(payload)) => crate::error::panic_message(payload.as_ref()),
                    _ => "it stopped without answering".to_string(),
                };
                Err(Error::Io {
                    context: "syncing the data device: the thread doing it panicked".into(),
                    cause: std::io::Error::other(format!("data sync thread panicked: {why}")),
                })
            }
        }
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        let _ = self.take();
    }
}

impl Drop for DataSync {
    /// Stop the thread: it holds the placement, which must be gone when
    /// the device is.
    fn drop(&mut self) {
        if let Some(w) = self.worker.get_mut().take() {
            drop(w.ask);
            let _ = w.thread.join();
        }
    }
}
