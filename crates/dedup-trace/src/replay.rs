//! Replaying a trace against a target with many requests in flight.
//!
//! Unlimited acceleration (Dmdedup §4.2.2) by default: a request is issued
//! as soon as a worker is free, except that a request overlapping one
//! still in flight waits for it, and a FLUSH waits for everything before
//! it, so the device ends with exactly the content the trace implies. With
//! `timing`, requests are also held back until their trace timestamp.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::content;
use crate::reader::ParseError;
use crate::request::{Op, Request, BLOCK};

/// What a trace is replayed against: a dedup device, a raw file, ...
pub trait Target: Send + Sync {
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), String>;
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), String>;
    fn zero(&self, offset: u64, len: u64, fua: bool) -> Result<(), String>;
    fn flush(&self) -> Result<(), String>;
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Requests in flight at most.
    pub depth: usize,
    /// Hold each request until its trace timestamp.
    pub timing: bool,
    /// Fold offsets beyond the target back into it instead of refusing.
    pub wrap: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub other: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub elapsed_s: f64,
    /// (read + written bytes) / elapsed.
    pub mb_per_s: f64,
    pub iops: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    /// Requests whose offset `wrap` folded back into the target.
    pub wrapped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error(
        "request {index} ({op:?} at byte {offset}, {len} bytes) reaches beyond the target ({size} bytes): \
         replay on a device at least as large as the trace's span (`dedup trace stats` prints it), or pass --wrap"
    )]
    Beyond {
        index: u64,
        op: Op,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("request {index} ({op:?} at byte {offset}, {len} bytes) failed: {message}")]
    Failed {
        index: u64,
        op: Op,
        offset: u64,
        len: u64,
        message: String,
    },
}

/// Place `r` inside a target of `size` bytes, or say why not.
fn fit(r: &mut Request, index: u64, size: u64, wrap: bool) -> Result<bool, ReplayError> {
    if r.op == Op::Flush || r.end() <= size {
        return Ok(false);
    }
    let beyond = ReplayError::Beyond {
        index,
        op: r.op,
        offset: r.offset,
        len: r.len,
        size,
    };
    // Wrapping keeps the offset within its 4 KiB block, so the request
    // must fit behind that offset.
    if !wrap || r.offset % BLOCK + r.len > size - size % BLOCK {
        return Err(beyond);
    }
    r.offset = wrap_offset(r.offset, r.len, size);
    Ok(true)
}

/// Where `--wrap` puts a request of `len` bytes at `offset` on a target
/// of `size` bytes (`len` fits in it): folded back in, at the same place
/// within its 4 KiB block so the block seeds stay aligned.
pub fn wrap_offset(offset: u64, len: u64, size: u64) -> u64 {
    let usable = size - size % BLOCK;
    let mut off = offset % usable;
    if off + len > usable {
        off -= (off + len - usable).div_ceil(BLOCK) * BLOCK;
    }
    off
}

/// The bytes a write puts down.
pub fn write_buffer(r: &Request) -> Vec<u8> {
    let mut buf = vec![0u8; r.len as usize];
    let mut at = 0usize;
    for seed in r.block_seeds() {
        let pos = r.offset + at as u64;
        let room = (BLOCK - pos % BLOCK) as usize;
        let end = (at + room).min(buf.len());
        if let Some(s) = seed {
            content::fill(&s, &mut buf[at..end]);
        }
        at = end;
    }
    buf
}

struct Job {
    index: u64,
    r: Request,
}

struct Done {
    index: u64,
    r: Request,
    latency: Duration,
    error: Option<String>,
}

fn execute(target: &dyn Target, r: &Request) -> (Duration, Option<String>) {
    let mut buf = match r.op {
        Op::Write => write_buffer(r),
        Op::Read => vec![0u8; r.len as usize],
        _ => Vec::new(),
    };
    let t0 = Instant::now();
    let res = match r.op {
        Op::Read => target.read(r.offset, &mut buf),
        Op::Write => target.write(r.offset, &buf, r.fua),
        Op::Trim => target.trim(r.offset, r.len, r.fua),
        Op::Zero => target.zero(r.offset, r.len, r.fua),
        Op::Flush => target.flush(),
    };
    (t0.elapsed(), res.err())
}

/// Blocks in flight, with how many requests hold each.
#[derive(Default)]
struct InFlight {
    blocks: HashMap<u64, u32>,
    requests: usize,
}

impl InFlight {
    fn overlaps(&self, r: &Request) -> bool {
        r.blocks().any(|b| self.blocks.contains_key(&b))
    }
    fn add(&mut self, r: &Request) {
        self.requests += 1;
        for b in r.blocks() {
            *self.blocks.entry(b).or_default() += 1;
        }
    }
    fn remove(&mut self, r: &Request) {
        self.requests -= 1;
        for b in r.blocks() {
            if let Some(n) = self.blocks.get_mut(&b) {
                *n -= 1;
                if *n == 0 {
                    self.blocks.remove(&b);
                }
            }
        }
    }
}

struct Tally {
    report: Report,
    latencies: Vec<u64>,
    first_error: Option<ReplayError>,
}

impl Tally {
    fn record(&mut self, d: Done) {
        let rep = &mut self.report;
        rep.requests += 1;
        match d.r.op {
            Op::Read => {
                rep.reads += 1;
                rep.bytes_read += d.r.len;
            }
            Op::Write => {
                rep.writes += 1;
                rep.bytes_written += d.r.len;
            }
            Op::Flush => rep.flushes += 1,
            _ => rep.other += 1,
        }
        self.latencies.push(d.latency.as_nanos() as u64);
        if let (Some(message), None) = (d.error, &self.first_error) {
            self.first_error = Some(ReplayError::Failed {
                index: d.index,
                op: d.r.op,
                offset: d.r.offset,
                len: d.r.len,
                message,
            });
        }
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Replay `requests` against `target`. `progress` is called with the
/// number of requests completed so far, now and then.
pub fn replay(
    requests: impl Iterator<Item = Result<Request, ParseError>>,
    target: Arc<dyn Target>,
    opts: &Options,
    progress: &dyn Fn(u64),
) -> Result<Report, ReplayError> {
    let depth = opts.depth.max(1);
    let (job_tx, job_rx) = mpsc::sync_channel::<Job>(depth);
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (done_tx, done_rx) = mpsc::channel::<Done>();
    let workers: Vec<_> = (0..depth)
        .map(|_| {
            let rx = job_rx.clone();
            let tx = done_tx.clone();
            let target = target.clone();
            std::thread::spawn(move || loop {
                let job = match rx.lock().expect("job queue").recv() {
                    Ok(j) => j,
                    Err(_) => return,
                };
                // A panicking target fails its request instead of leaving
                // the dispatcher waiting for it forever.
                let (latency, error) =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        execute(target.as_ref(), &job.r)
                    }))
                    .unwrap_or_else(|_| (Duration::ZERO, Some("the target panicked".into())));
                let done = Done {
                    index: job.index,
                    r: job.r,
                    latency,
                    error,
                };
                if tx.send(done).is_err() {
                    return;
                }
            })
        })
        .collect();
    drop(done_tx);

    let size = target.size();
    let mut flight = InFlight::default();
    let mut tally = Tally {
        report: Report::default(),
        latencies: Vec::new(),
        first_error: None,
    };
    let start = Instant::now();
    let wait_one = |flight: &mut InFlight, tally: &mut Tally| {
        let d = done_rx
            .recv()
            .expect("a worker holds each request in flight");
        flight.remove(&d.r);
        tally.record(d);
        if tally.report.requests % 1024 == 0 {
            progress(tally.report.requests);
        }
    };
    let mut outcome: Result<(), ReplayError> = Ok(());
    for (index, item) in requests.enumerate() {
        let index = index as u64;
        let mut r = match item {
            Ok(r) => r,
            Err(e) => {
                outcome = Err(e.into());
                break;
            }
        };
        match fit(&mut r, index, size, opts.wrap) {
            Ok(w) => tally.report.wrapped += w as u64,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
        if tally.first_error.is_some() {
            break;
        }
        if opts.timing {
            let due = start + Duration::from_nanos(r.time_ns);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        // A flush orders everything before it; other requests only what
        // they overlap.
        while flight.requests >= depth
            || (r.op == Op::Flush && flight.requests > 0)
            || flight.overlaps(&r)
        {
            wait_one(&mut flight, &mut tally);
        }
        flight.add(&r);
        job_tx
            .send(Job { index, r })
            .expect("workers run until the queue closes");
    }
    while flight.requests > 0 {
        wait_one(&mut flight, &mut tally);
    }
    drop(job_tx);
    for w in workers {
        let _ = w.join();
    }
    let elapsed = start.elapsed().as_secs_f64();
    progress(tally.report.requests);
    outcome?;
    if let Some(e) = tally.first_error {
        return Err(e);
    }
    let mut rep = tally.report;
    tally.latencies.sort_unstable();
    rep.elapsed_s = elapsed;
    rep.mb_per_s = (rep.bytes_read + rep.bytes_written) as f64 / 1e6 / elapsed.max(1e-9);
    rep.iops = rep.requests as f64 / elapsed.max(1e-9);
    rep.lat_p50_us = percentile(&tally.latencies, 0.50);
    rep.lat_p99_us = percentile(&tally.latencies, 0.99);
    rep.lat_p999_us = percentile(&tally.latencies, 0.999);
    Ok(rep)
}

/// The device content a trace implies, for checking a replay: a plain
/// in-memory disk the requests are applied to in order.
pub struct Model {
    pub bytes: Vec<u8>,
}

impl Model {
    pub fn new(size: u64) -> Model {
        Model {
            bytes: vec![0; size as usize],
        }
    }

    pub fn apply(&mut self, r: &Request) {
        let range = r.offset as usize..r.end() as usize;
        match r.op {
            Op::Write => self.bytes[range].copy_from_slice(&write_buffer(r)),
            Op::Trim | Op::Zero => self.bytes[range].fill(0),
            Op::Read | Op::Flush => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{GenParams, Generator};
    use crate::native::write_request;

    /// A memory disk that sleeps a little per request, so requests overlap.
    struct Mem(Mutex<Vec<u8>>);

    impl Target for Mem {
        fn size(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), String> {
            let d = self.0.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8], _: bool) -> Result<(), String> {
            std::thread::sleep(Duration::from_micros(
                (offset / 4096 % 7) * 20, // later writes can finish first
            ));
            let mut d = self.0.lock().unwrap();
            d[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn trim(&self, offset: u64, len: u64, _: bool) -> Result<(), String> {
            self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
            Ok(())
        }
        fn zero(&self, offset: u64, len: u64, fua: bool) -> Result<(), String> {
            self.trim(offset, len, fua)
        }
        fn flush(&self) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_parallel_replay_leaves_what_the_trace_implies() {
        let size = 1u64 << 20;
        let p = GenParams {
            seed: 11,
            write_bytes: 8 << 20,
            dedup_ratio: 3.0,
            read_share: 0.2,
            request_sizes: vec![4096, 8192, 65536],
            locality: 0.5,
            working_set: size,
            flush_every: 50,
            rate: 1e6,
        };
        let mut reqs: Vec<Request> = Generator::new(p).unwrap().collect();
        // Unaligned writes and trims too.
        reqs.push(write_request(0, 4096 * 3 + 100, &[9u8; 10_000], false));
        reqs.push(Request {
            time_ns: 0,
            op: Op::Trim,
            fua: false,
            offset: 5000,
            len: 3000,
            content: crate::request::Content::None,
        });
        let mut model = Model::new(size);
        for r in &reqs {
            model.apply(r);
        }
        let target = Arc::new(Mem(Mutex::new(vec![0; size as usize])));
        let opts = Options {
            depth: 16,
            timing: false,
            wrap: false,
        };
        let rep = replay(reqs.iter().cloned().map(Ok), target.clone(), &opts, &|_| {}).unwrap();
        assert_eq!(rep.requests, reqs.len() as u64);
        assert!(
            *target.0.lock().unwrap() == model.bytes,
            "replayed content differs"
        );
    }

    #[test]
    fn requests_beyond_the_target_are_refused_or_wrapped() {
        let target = Arc::new(Mem(Mutex::new(vec![0; 1 << 16])));
        let far = write_request(0, (1 << 20) + 4096 + 17, &[1u8; 5000], false);
        let opts = Options {
            depth: 2,
            timing: false,
            wrap: false,
        };
        let e = replay(
            [Ok(far.clone())].into_iter(),
            target.clone(),
            &opts,
            &|_| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("--wrap"), "{e}");
        let opts = Options { wrap: true, ..opts };
        let rep = replay(
            [Ok(far.clone())].into_iter(),
            target.clone(),
            &opts,
            &|_| {},
        )
        .unwrap();
        assert_eq!(rep.wrapped, 1);
        // The content landed at the same offset within its block.
        let d = target.0.lock().unwrap();
        let at = d.iter().position(|&b| b != 0).unwrap();
        assert_eq!(at as u64 % 4096, 17);
    }

    #[test]
    fn a_failing_request_is_named() {
        struct Full;
        impl Target for Full {
            fn size(&self) -> u64 {
                1 << 20
            }
            fn read(&self, _: u64, _: &mut [u8]) -> Result<(), String> {
                Ok(())
            }
            fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), String> {
                Err("no space left".into())
            }
            fn trim(&self, _: u64, _: u64, _: bool) -> Result<(), String> {
                Ok(())
            }
            fn zero(&self, _: u64, _: u64, _: bool) -> Result<(), String> {
                Ok(())
            }
            fn flush(&self) -> Result<(), String> {
                Ok(())
            }
        }
        let opts = Options {
            depth: 4,
            timing: false,
            wrap: false,
        };
        let w = write_request(0, 8192, &[1u8; 4096], false);
        let e = replay([Ok(w)].into_iter(), Arc::new(Full), &opts, &|_| {}).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("request 0") && msg.contains("no space"),
            "{msg}"
        );
    }
}
