//! Writeback of the data file started while the writes still arrive, so
//! that a FLUSH after a long stream of new data finds little left to write.
//!
//! Linux writes dirty pages back on its own only past
//! `dirty_background_ratio` (10 % of free memory: gigabytes on a server)
//! or once they are 30 s old (`dirty_expire_centisecs`), so without this a
//! copy of 1 GiB of new data left all of it dirty for the final FLUSH: the
//! server spent the copy on CPU (fingerprints, compression) with the disk
//! idle, then the FLUSH on the disk with the CPU idle. A raw disk pays the
//! same write at its FLUSH, but its copy is short. Starting writeback every
//! `EVERY` bytes overlaps the two: the unique GiB with `--flush` took
//! 1.42-1.51 s before and 1.03-1.31 s after (raw, which gets no such
//! hint, 0.94-1.11 s; 64 GiB sparse device, 3 alternating runs).
//!
//! It is a hint and nothing depends on it: durability is still the FLUSH's
//! `fdatasync`, which writes what is left and waits for all of it. A
//! writeback error it provokes is recorded by the kernel against the file
//! and reported by that `fdatasync`, as for the kernel's own writeback:
//! only `SYNC_FILE_RANGE_WRITE` is asked for, never a wait, because the
//! waiting forms check (and so consume) the file's error, whose cursor the
//! duplicated descriptor shares with the one the syncs use. The call runs
//! on a thread of its own: it may block while the disk's queue is full,
//! and writers hold the commit gate. (On storage that needs pages stable
//! while they are written, a rewrite of a page being written waits for
//! it; the data file is written mostly once, at new addresses.)

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

/// Bytes written between two starts of writeback: enough that each start
/// finds long runs to write, small enough that the disk starts early.
pub const EVERY: u64 = 8 << 20;

pub struct EarlyWriteback {
    every: u64,
    written: AtomicU64,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Writebacks started without error so far (for tests).
    started: AtomicU64,
}

#[derive(Default)]
struct State {
    pending: bool,
    stop: bool,
}

impl EarlyWriteback {
    /// Start writeback of `file` every `every` bytes written through
    /// `wrote`. `None` if no thread or descriptor can be had: the file
    /// then works as before, written back at its syncs.
    pub fn new(file: &File, every: u64) -> Option<EarlyWriteback> {
        let file = file.try_clone().ok()?;
        let shared = Arc::new(Shared::default());
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("dedup-writeback-start".into())
            .spawn(move || worker.run(&file))
            .ok()?;
        Some(EarlyWriteback {
            every: every.max(1),
            written: AtomicU64::new(0),
            shared,
            thread: Some(thread),
        })
    }

    /// `bytes` more were written: start writeback when the total crosses
    /// a multiple of `every` (crossings that come while one is being
    /// started make one more start: each covers the whole file).
    pub fn wrote(&self, bytes: u64) {
        let before = self.written.fetch_add(bytes, Ordering::Relaxed);
        if before / self.every != (before + bytes) / self.every {
            self.shared.state.lock().pending = true;
            self.shared.wake.notify_one();
        }
    }

    /// Writebacks started without error so far.
    #[cfg(test)]
    pub fn started(&self) -> u64 {
        self.shared.started.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn run(&self, file: &File) {
        loop {
            {
                let mut state = self.state.lock();
                while !state.pending && !state.stop {
                    self.wake.wait(&mut state);
                }
                if state.stop {
                    return;
                }
                state.pending = false;
            }
            // SAFETY: `file` is an open descriptor this thread owns; offset
            // 0 and length 0 name the whole file, and the flag only starts
            // writeback of its dirty pages. A failure is the next sync's to
            // report (a bad range cannot happen; EIO is kept by the file).
            let r = unsafe {
                libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
            };
            if r != 0 {
                continue;
            }
            self.started.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for EarlyWriteback {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Starts come when the total crosses a multiple, not before, and
    /// the thread ends with the handle.
    #[test]
    fn writeback_starts_when_the_written_bytes_cross_a_multiple() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("data"))
            .unwrap();
        let early = EarlyWriteback::new(&file, 1 << 20).unwrap();
        let block = vec![7u8; 256 << 10];
        for i in 0..3u64 {
            file.write_all_at(&block, i * block.len() as u64).unwrap();
            early.wrote(block.len() as u64);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(early.started(), 0, "768 KiB written: no multiple crossed");
        for i in 3..9u64 {
            file.write_all_at(&block, i * block.len() as u64).unwrap();
            early.wrote(block.len() as u64);
        }
        // Two multiples crossed (1 MiB, 2 MiB): one start at least, two
        // if the thread took the first before the second came.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while early.started() == 0 {
            assert!(std::time::Instant::now() < deadline, "never started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(early.started() <= 2);
        // Dropping stops and joins the thread (a hang fails the test).
        drop(early);
    }
}
