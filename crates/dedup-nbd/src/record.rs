//! `record=FILE`: every completed request of the live device, in dedup's
//! trace format (`dedup_trace::native`), for `dedup replay` later. The
//! trace is written through a buffer that is flushed at each client FLUSH
//! and at shutdown, so a recording is complete up to the last flush.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use dedup_trace::native::{write_request, Writer};
use dedup_trace::reader::INCOMPLETE;
use dedup_trace::{Content, Op, Request};

/// Requests are recorded as they complete. Overlapping requests that were
/// in flight together complete in an order NBD leaves undefined; a replay
/// reproduces the recorded one.
pub struct Recorder {
    start: Instant,
    out: Mutex<Writer<BufWriter<File>>>,
    /// Set at the first failed write: the rest is not recorded.
    failed: AtomicBool,
}

impl Recorder {
    /// A new file only, owner-only (its fingerprints tell which blocks
    /// hold equal data, and where): a trace never replaces anything, least
    /// of all the device's own files (`--record DIR/meta` used to truncate
    /// the metadata).
    pub fn create(path: &Path) -> std::io::Result<Recorder> {
        let file = dedup_core::perms::file_options()
            .write(true)
            .create_new(true)
            .open(path)?;
        dedup_core::perms::set_file_mode(&file)?;
        Ok(Recorder {
            start: Instant::now(),
            out: Mutex::new(Writer::new(BufWriter::with_capacity(1 << 20, file))?),
            failed: AtomicBool::new(false),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn put(&self, r: &Request, flush: bool) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let mut w = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let res = w
            .write(r)
            .and_then(|_| if flush { w.flush() } else { Ok(()) });
        if let Err(e) = res {
            // Recording is a side job: a full disk under the trace must not
            // fail the client's I/O. Stop, and mark the trace so that no
            // replay takes it for the whole workload.
            self.failed.store(true, Ordering::Relaxed);
            tracing::error!("recording the trace failed, recording stops: {e}");
            let inner = w.get_mut();
            let _ = inner.write_all(format!("\n{INCOMPLETE}: {e}\n").as_bytes());
            let _ = inner.flush();
        }
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) {
        self.put(&write_request(self.now(), offset, data, fua), false);
    }

    pub fn other(&self, op: Op, offset: u64, len: u64, fua: bool) {
        let r = Request {
            time_ns: self.now(),
            op,
            fua,
            offset,
            len,
            content: Content::None,
        };
        self.put(&r, op == Op::Flush);
    }

    pub fn finish(&self) {
        let mut w = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = w.flush() {
            tracing::error!("saving the recorded trace failed: {e}");
        }
    }
}
