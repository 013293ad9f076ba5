//! The sync that makes a commit's home writes durable, run in the
//! background so that no FLUSH waits for it.
//!
//! A journaled commit needs its home writes durable only before the
//! journal is written again (the next commit, a clear): until then the
//! journal itself holds their images and replays them after a crash. So
//! the commit starts the sync and returns; the next journal write waits
//! for it (`wait`), and meanwhile the host may write and sync data, and
//! the client send its next writes. This takes one of the three syncs a
//! commit used to wait for off the FLUSH's path.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use crate::blockfile::BlockFile;
use crate::error::{Error, Result};

pub struct HomeSync {
    start: Sender<()>,
    done: Receiver<Result<()>>,
    /// A sync was started and not yet waited for.
    pending: bool,
    /// A sync failed: every later wait fails too (the file is latched
    /// as well, `blockfile/latch.rs`; this does not rely on it).
    failed: bool,
}

impl HomeSync {
    /// A syncer thread for `file`; it ends when this is dropped.
    pub fn new(file: Arc<dyn BlockFile>) -> Result<HomeSync> {
        let (start, requests) = channel::<()>();
        let (report, done) = channel();
        std::thread::Builder::new()
            .name("dedup-home-sync".into())
            .spawn(move || {
                for () in requests {
                    if report.send(file.sync()).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| Error::io("starting the metadata sync thread", e))?;
        Ok(HomeSync {
            start,
            done,
            pending: false,
            failed: false,
        })
    }

    /// Start syncing the file in the background.
    pub fn start(&mut self) -> Result<()> {
        self.wait()?;
        self.start.send(()).map_err(|_| stopped())?;
        self.pending = true;
        Ok(())
    }

    /// Wait for the sync started last, if any; its error if it failed,
    /// and an error from then on.
    pub fn wait(&mut self) -> Result<()> {
        if self.failed {
            return Err(Error::io(
                "metadata sync",
                std::io::Error::other(
                    "an earlier background sync of the metadata failed, and the kernel may have \
                     dropped metadata it could not write; the device takes no more writes: stop it \
                     and serve it again (its journal replays what is on disk)",
                ),
            ));
        }
        if !std::mem::take(&mut self.pending) {
            return Ok(());
        }
        let synced = self.done.recv().unwrap_or_else(|_| Err(stopped()));
        self.failed = synced.is_err();
        synced
    }
}

/// The sync thread is gone (it panicked): nothing can be synced through it.
fn stopped() -> Error {
    Error::io("metadata sync thread", std::io::Error::other("it stopped"))
}
