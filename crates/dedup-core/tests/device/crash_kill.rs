//! Process crashes at random instants, for every crash-safe backend on real
//! files. lsm in particular: fjall does its own file I/O, so the simulated
//! power cuts of `crash.rs` cannot reach it; here a child process runs a
//! seeded workload (writes, FUA writes, trims, flushes, GC) against a device
//! in a scratch directory and is killed with SIGKILL after a random delay.
//! The parent reopens the device and checks the crash contract against the
//! child's progress log (each op is logged once it returned): every chunk
//! holds its content as of the last completed flush or a content written
//! since (including by the op in flight), and `check --data` is clean.
//!
//! `DEDUP_KILLS` scales the run (default 200 kills per backend).

use crate::common;

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::{ModelDisk, Patterns};
use dedup_core::backends::OpenOptions;
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use rand::{Rng, SeedableRng};

const CS: usize = 4096;
const CHUNKS: u64 = 64;
const OPS: usize = 400;

#[derive(Clone, Debug)]
enum Op {
    Write {
        lbn: u64,
        chunks: u64,
        pattern: usize,
        fua: bool,
    },
    Trim {
        lbn: u64,
    },
    Flush,
    Gc,
}

fn workload(seed: u64) -> Vec<Op> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..OPS)
        .map(|_| match rng.random_range(0..20) {
            0..=13 => {
                let lbn = rng.random_range(0..CHUNKS);
                Op::Write {
                    lbn,
                    chunks: rng.random_range(1..=8).min(CHUNKS - lbn),
                    pattern: rng.random_range(0..8),
                    fua: rng.random_bool(0.05),
                }
            }
            14..=15 => Op::Trim {
                lbn: rng.random_range(0..CHUNKS),
            },
            16..=18 => Op::Flush,
            _ => Op::Gc,
        })
        .collect()
}

fn open_rw(dir: &Path) -> dedup_core::Result<dedup_core::Device> {
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    layout::open(&DevicePaths::from_dir(dir).unwrap(), &opts)
}

/// Child: run the workload, logging each op index once it returned.
fn child(dir: &Path, seed: u64) {
    let dev = open_rw(dir).unwrap();
    let patterns = Patterns::new(8, CS);
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("progress"))
        .unwrap();
    for (i, op) in workload(seed).iter().enumerate() {
        match *op {
            Op::Write {
                lbn,
                chunks,
                pattern,
                fua,
            } => {
                let data = patterns.bytes(pattern, 0, (chunks as usize) * CS);
                dev.write(lbn * CS as u64, &data, fua).unwrap();
            }
            Op::Trim { lbn } => dev.discard(lbn * CS as u64, CS as u64, false).unwrap(),
            Op::Flush => dev.flush().unwrap(),
            Op::Gc => {
                dev.gc().unwrap();
            }
        }
        writeln!(log, "{i}").unwrap();
    }
    // Finished before the kill: hang around so the kill still lands.
    std::thread::sleep(Duration::from_secs(30));
}

/// Parent: what each chunk may hold, given that ops `0..=done` completed
/// (`done` None: none did) and the next one may have been in flight.
fn possible(seed: u64, done: Option<usize>) -> Vec<HashSet<Vec<u8>>> {
    let patterns = Patterns::new(8, CS);
    let mut model = ModelDisk::new(CHUNKS as usize * CS, CS);
    let mut sets: Vec<HashSet<Vec<u8>>> = vec![HashSet::from([vec![0u8; CS]]); CHUNKS as usize];
    let ops = workload(seed);
    let last = done.map_or(1, |d| d + 2).min(ops.len());
    for (i, op) in ops[..last].iter().enumerate() {
        let completed = done.is_some_and(|d| i <= d);
        let mut durable = false;
        match *op {
            Op::Write {
                lbn,
                chunks,
                pattern,
                fua,
            } => {
                model.write(
                    lbn * CS as u64,
                    &patterns.bytes(pattern, 0, (chunks as usize) * CS),
                );
                for l in lbn..lbn + chunks {
                    sets[l as usize].insert(model.chunk(l as usize).to_vec());
                }
                durable = fua;
            }
            Op::Trim { lbn } => {
                model.zero(lbn * CS as u64, CS as u64);
                sets[lbn as usize].insert(vec![0u8; CS]);
            }
            Op::Flush => durable = true,
            Op::Gc => {}
        }
        if durable && completed {
            for (l, set) in sets.iter_mut().enumerate() {
                set.clear();
                set.insert(model.chunk(l).to_vec());
            }
        }
    }
    sets
}

fn kill_suite(backend: &str, test_name: &str) {
    if let Ok(spec) = std::env::var("DEDUP_KILL_CHILD") {
        let (dir, seed) = spec.rsplit_once(':').unwrap();
        child(Path::new(dir), seed.parse().unwrap());
        return;
    }
    let kills: u64 = std::env::var("DEDUP_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    // The harness names a test by its path below the crate root.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test_path = format!("{module}::{test_name}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    // A suite whose children all died before their first op (a child that
    // fails to start, say) would check nothing but empty devices.
    let mut kills_after_an_op = 0;
    for seed in 0..kills {
        let scratch = common::scratch_dir();
        let dir = scratch.path().join("dev");
        let mut opts = CreateOptions::new(CHUNKS * CS as u64);
        opts.backend = backend.to_string();
        opts.params.txn_writes = seed % 3 * 7; // 0, 7, 14
        layout::create(&dir, &opts).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test_path, "--nocapture", "--test-threads=1"])
            .env("DEDUP_KILL_CHILD", format!("{}:{seed}", dir.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Kill once the child is past a random op, a random moment later.
        let target = rng.random_range(0..OPS);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(dir.join("progress")).map_or(0, |p| p.lines().count())
            < target
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
        child.kill().unwrap();
        child.wait().unwrap();
        let progress = std::fs::read_to_string(dir.join("progress")).unwrap_or_default();
        let done: Option<usize> = progress.lines().filter_map(|l| l.parse().ok()).max();
        kills_after_an_op += usize::from(done.is_some());
        let at = format!("{backend}, seed {seed}, killed after op {done:?}");
        let dev = open_rw(&dir).unwrap_or_else(|e| panic!("{at}: reopen failed: {e}"));
        let got = common::read_all(&dev);
        let sets = possible(seed, done);
        for lbn in 0..CHUNKS as usize {
            assert!(
                sets[lbn].contains(&got[lbn * CS..(lbn + 1) * CS]),
                "{at}: chunk {lbn} holds neither its content at the last flush nor one written since"
            );
        }
        let report = dev.check(true).unwrap();
        assert!(report.is_clean(), "{at}: {:#?}", report.problems);
        dev.close().unwrap();
    }
    assert!(
        kills_after_an_op > 0 || kills == 0,
        "{backend}: no child got past its first op before being killed"
    );
}

#[test]
fn sparse_survives_sigkill_at_random_points() {
    kill_suite("sparse", "sparse_survives_sigkill_at_random_points");
}

#[test]
fn lsm_survives_sigkill_at_random_points() {
    kill_suite("lsm", "lsm_survives_sigkill_at_random_points");
}

#[test]
fn cowbtree_survives_sigkill_at_random_points() {
    kill_suite("cowbtree", "cowbtree_survives_sigkill_at_random_points");
}

#[test]
fn disktable_survives_sigkill_at_random_points() {
    kill_suite("disktable", "disktable_survives_sigkill_at_random_points");
}
