//! Many writers, no lock, no clock (issue 38): several writing handles
//! on one repository (each its own process as far as the protocol goes:
//! its own protection map, epochs and pins), backups interleaved step by
//! step with deletes, single collections (one epoch each, as a collector
//! beside them runs) and crashes of any handle at any request. After
//! every step, every committed backup restores byte-exact.
//!
//! The same run with the protocol broken on purpose (no pins written)
//! must lose a committed backup's data: the model sees it.

use crate::gc_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use dedup_store::epochs::EPOCH_PREFIX;
use dedup_store::session::BackupSession;
use dedup_store::{GcOptions, RepoError, RepoOptions, Repository, Segmenting};
use gc_support::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WRITERS: usize = 3;

struct Writer {
    repo: &'static Repository,
    store: Arc<Faulty>,
    /// The running backup: its session, name and the bytes appended.
    running: Option<(BackupSession<'static>, String, Vec<u8>)>,
    /// Requests of the running backup failed (a fault that passed): a
    /// put in the background may have failed, and its commit may then
    /// fail with that error (never commit over it).
    faulted: bool,
}

/// A handle that lives for the rest of the test run (leaked: sessions
/// borrow it, and a crash drops the session, never the memory).
fn open(dir: &Path, skip_pins: bool) -> (&'static Repository, Arc<Faulty>) {
    let (repo, store) = open_faulty(dir);
    let repo: &'static Repository = Box::leak(Box::new(repo));
    if skip_pins {
        repo.break_protocol_skip_pins();
    }
    (repo, store)
}

/// A writer; on odd seeds it looks at the epochs at every seal and
/// recipe part, on even ones only as often as a real one does (at most
/// every second: here, almost only around pins and commits).
fn writer(dir: &Path, skip_pins: bool, seed: u64) -> Writer {
    let (repo, store) = open(dir, skip_pins);
    if seed % 2 == 1 {
        repo.set_look_interval(std::time::Duration::ZERO);
    }
    repo.set_recipe_part_segments(4);
    Writer {
        repo,
        store,
        running: None,
        faulted: false,
    }
}

/// A repository of small containers (16 KiB): many seals, many looks at
/// the epochs.
fn init_small(dir: &Path) {
    let options = RepoOptions {
        segmenting: Segmenting::DEFAULT,
        container_target: 16 << 10,
        ..RepoOptions::default()
    };
    drop(Repository::init_with(dir, options).unwrap());
}

/// The first committed backup that does not restore byte-exact, if any.
fn first_broken(dir: &Path, model: &BTreeMap<String, Vec<u8>>) -> Option<String> {
    let reader = Repository::open_read_only(dir).unwrap();
    for (name, data) in model {
        let mut out = Vec::new();
        match reader.restore(name, &mut out) {
            Err(e) => return Some(format!("{name}: {e}")),
            Ok(_) if out != *data => return Some(format!("{name}: other bytes")),
            Ok(_) => {}
        }
    }
    None
}

/// A running backup handed to a step that runs inside a collection, and
/// what became of it.
struct Between {
    running: Option<(BackupSession<'static>, String, Vec<u8>)>,
    /// Its writer's requests failed earlier (see `Writer::faulted`).
    faulted: bool,
    outcome: Option<Outcome>,
}

enum Outcome {
    Committed(String, Vec<u8>),
    /// Not committed: must not be listed.
    Stopped(String),
    /// Committed if listed (unconfirmed).
    Maybe(String, Vec<u8>),
    Failed(String, String),
}

impl Between {
    fn step(&mut self, chunk: &[u8], commit: bool) {
        let Some((mut s, name, mut data)) = self.running.take() else {
            return;
        };
        for piece in chunk.chunks(4096) {
            match s.append(piece) {
                Ok(()) => data.extend_from_slice(piece),
                Err(RepoError::Overtaken { .. }) => {
                    self.outcome = Some(Outcome::Stopped(name));
                    return;
                }
                // A put in the background failed during a fault that
                // passed: the backup ends, nothing committed.
                Err(_) if self.faulted => {
                    self.outcome = Some(Outcome::Stopped(name));
                    return;
                }
                Err(e) => {
                    self.outcome = Some(Outcome::Failed(name, format!("append: {e}")));
                    return;
                }
            }
        }
        if !commit {
            self.running = Some((s, name, data));
            return;
        }
        self.outcome = Some(match s.commit() {
            Ok(_) => Outcome::Committed(name, data),
            Err(RepoError::Overtaken { .. }) => Outcome::Stopped(name),
            Err(RepoError::Unconfirmed { .. }) if self.faulted => Outcome::Maybe(name, data),
            Err(_) if self.faulted => Outcome::Stopped(name),
            Err(e) => Outcome::Failed(name, format!("commit: {e}")),
        });
    }
}

/// One run of `steps` random steps; the first broken backup, if any.
fn run(seed: u64, steps: usize, skip_pins: bool) -> Option<String> {
    let tmp = Box::leak(Box::new(tempfile::tempdir().unwrap()));
    let dir = tmp.path().to_path_buf();
    init_small(&dir);
    let mut rng = StdRng::seed_from_u64(seed);
    let shared = blocks(&mut rng, 12);
    let mut writers: Vec<Writer> = (0..WRITERS)
        .map(|_| writer(&dir, skip_pins, seed))
        .collect();
    let (collector, collector_store) = open(&dir, skip_pins);
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut next_name = 0;
    let trace = std::env::var("TRACE").is_ok();
    for step in 0..steps {
        let w = rng.random_range(0..WRITERS);
        let op = rng.random_range(0..20);
        if trace {
            eprintln!(
                "step {step}: writer {w} op {op} running {:?}",
                writers
                    .iter()
                    .map(|w| w.running.as_ref().map(|r| r.1.clone()))
                    .collect::<Vec<_>>()
            );
        }
        match op {
            // Start a backup, or go on with the running one.
            0..=7 => {
                let wr = &mut writers[w];
                if wr.running.is_none() {
                    let name = format!("b{next_name}");
                    next_name += 1;
                    let group = format!("g{}", rng.random_range(0..2));
                    wr.faulted = false;
                    match wr.repo.begin_backup(&name, &group) {
                        Ok(s) => wr.running = Some((s, name, Vec::new())),
                        Err(e) => panic!("seed {seed} step {step}: begin: {e}"),
                    }
                }
                let (s, _, data) = wr.running.as_mut().unwrap();
                let chunk = stream(&mut rng, &shared);
                let chunk = &chunk[..chunk.len().min(24 << 10)];
                let mut failed = false;
                for piece in chunk.chunks(4096) {
                    match s.append(piece) {
                        Ok(()) => data.extend_from_slice(piece),
                        Err(RepoError::Overtaken { .. }) => {
                            failed = true;
                            break;
                        }
                        // A container put in the background during a
                        // fault that passed failed: the backup ends
                        // there, nothing committed.
                        Err(_) if wr.faulted => {
                            failed = true;
                            break;
                        }
                        Err(e) => panic!("seed {seed} step {step}: append: {e}"),
                    }
                }
                if failed {
                    wr.running = None;
                }
            }
            // Commit the running backup; sometimes with a collection or
            // two begun between its last look and its backup object's put.
            8..=10 => {
                if let Some((s, name, data)) = writers[w].running.take() {
                    if rng.random_bool(0.3) {
                        let n = rng.random_range(1..=2);
                        writers[w].store.before_put_under("backups/", move || {
                            for _ in 0..n {
                                let _ = collector.gc_one_epoch(&GcOptions::default());
                            }
                        });
                    }
                    let committed = s.commit();
                    writers[w].store.clear_hook();
                    match committed {
                        Ok(_) => {
                            model.insert(name, data);
                        }
                        Err(RepoError::Overtaken { .. }) => {
                            let listed = collector.backup(&name).is_ok();
                            assert!(
                                !listed,
                                "seed {seed} step {step}: {name} overtaken but listed"
                            );
                        }
                        Err(RepoError::Unconfirmed { .. }) if writers[w].faulted => {
                            if collector.backup(&name).is_ok() {
                                model.insert(name, data);
                            }
                        }
                        Err(e) if writers[w].faulted => {
                            let listed = collector.backup(&name).is_ok();
                            assert!(
                                !listed,
                                "seed {seed} step {step}: {name} failed ({e}) but listed"
                            );
                        }
                        Err(e) => panic!("seed {seed} step {step}: commit: {e}"),
                    }
                }
            }
            // Delete a committed backup, from any handle.
            11 | 12 => {
                let names: Vec<String> = model.keys().cloned().collect();
                if !names.is_empty() {
                    let name = &names[rng.random_range(0..names.len())];
                    writers[w].repo.delete_backup(name).unwrap();
                    model.remove(name);
                }
            }
            // A collection by the collector, with a writer's step between
            // its first look and the creation of its epoch: the look
            // missed what the writer did then (went on, maybe committed).
            13..=15 if writers[w].running.is_some() && rng.random_bool(0.3) => {
                let chunk = stream(&mut rng, &shared);
                let chunk = chunk[..chunk.len().min(24 << 10)].to_vec();
                let commit = rng.random_bool(0.5);
                let slot = Arc::new(Mutex::new(Between {
                    running: writers[w].running.take(),
                    faulted: writers[w].faulted,
                    outcome: None,
                }));
                let inside = slot.clone();
                collector_store.before_put_under(EPOCH_PREFIX, move || {
                    inside.lock().unwrap().step(&chunk, commit);
                });
                let r = collector.gc_one_epoch(&GcOptions::default());
                collector_store.clear_hook();
                match r {
                    Ok(_) | Err(RepoError::GcRunning) => {}
                    Err(e) => panic!("seed {seed} step {step}: gc: {e}"),
                }
                let mut between = slot.lock().unwrap();
                writers[w].running = between.running.take();
                match between.outcome.take() {
                    None => {}
                    Some(Outcome::Committed(name, data)) => {
                        model.insert(name, data);
                    }
                    Some(Outcome::Maybe(name, data)) if collector.backup(&name).is_ok() => {
                        model.insert(name, data);
                    }
                    Some(Outcome::Maybe(..)) => {}
                    Some(Outcome::Stopped(name)) => {
                        let listed = collector.backup(&name).is_ok();
                        assert!(
                            !listed,
                            "seed {seed} step {step}: {name} stopped but listed"
                        );
                    }
                    Some(Outcome::Failed(name, e)) => {
                        panic!("seed {seed} step {step}: {name} beside a collection: {e}")
                    }
                }
            }
            // One collection (one epoch), by the collector or a writer.
            13..=15 => {
                let by = if rng.random_bool(0.5) {
                    collector
                } else {
                    writers[w].repo
                };
                match by.gc_one_epoch(&GcOptions::default()) {
                    Ok(_) | Err(RepoError::GcRunning) => {}
                    Err(e) => panic!("seed {seed} step {step}: gc: {e}"),
                }
            }
            // A whole gc (two epochs).
            16 => {
                collector.gc(&GcOptions::default()).unwrap();
            }
            // A fault that passes: a few of a writer's requests fail (a
            // pin, a listing, a put), and it goes on.
            17 => {
                let wr = &mut writers[w];
                wr.store.fail_after(rng.random_range(0..4));
                if let Some((s, name, data)) = wr.running.take() {
                    let chunk = stream(&mut rng, &shared);
                    let mut s = s;
                    let mut data = data;
                    let mut ok = true;
                    for piece in chunk[..chunk.len().min(24 << 10)].chunks(4096) {
                        if s.append(piece).is_err() {
                            ok = false;
                            break;
                        }
                        data.extend_from_slice(piece);
                    }
                    wr.store.recover();
                    if ok {
                        wr.faulted = true;
                        wr.running = Some((s, name, data));
                    } else {
                        match s.commit() {
                            Ok(_) => {
                                model.insert(name, data);
                            }
                            Err(RepoError::Unconfirmed { .. })
                                if collector.backup(&name).is_ok() =>
                            {
                                model.insert(name, data);
                            }
                            Err(e) => {
                                let listed = collector.backup(&name).is_ok();
                                assert!(
                                    !listed,
                                    "seed {seed} step {step}: {name} failed ({e}) but listed"
                                );
                            }
                        }
                    }
                } else {
                    let _ = wr.repo.gc_one_epoch(&GcOptions::default());
                    wr.store.recover();
                }
            }
            // A writer dies at some later request (maybe mid-backup): its
            // handle is abandoned as a killed process's would be.
            _ => {
                let wr = &mut writers[w];
                wr.store.fail_after(rng.random_range(0..8));
                if let Some((s, name, data)) = wr.running.take() {
                    match s.commit() {
                        Ok(_) => {
                            model.insert(name, data);
                        }
                        Err(RepoError::Unconfirmed { .. }) if collector.backup(&name).is_ok() => {
                            model.insert(name, data);
                        }
                        Err(_) => {}
                    }
                }
                *wr = writer(&dir, skip_pins, seed);
            }
        }
        if let Some(broken) = first_broken(&dir, &model) {
            return Some(format!("seed {seed} step {step}: backup {broken}"));
        }
    }
    // Everything committed still restores after the running backups end
    // and two whole collections.
    for wr in &mut writers {
        if let Some((s, name, data)) = wr.running.take() {
            if s.commit().is_ok() {
                model.insert(name, data);
            }
        }
    }
    collector.gc(&GcOptions::default()).unwrap();
    collector.gc(&GcOptions::default()).unwrap();
    first_broken(&dir, &model).map(|b| format!("seed {seed} at the end: backup {b}"))
}

#[test]
fn writers_deletes_collections_and_crashes_interleaved_lose_nothing() {
    // SEED=n runs one seed (with TRACE=1, step by step); SEEDS=n runs
    // that many.
    let seeds = match (std::env::var("SEED"), std::env::var("SEEDS")) {
        (Ok(s), _) => s.parse().unwrap()..s.parse::<u64>().unwrap() + 1,
        (_, Ok(n)) => 0..n.parse().unwrap(),
        _ => 0..24,
    };
    for seed in seeds {
        if let Some(broken) = run(seed, 160, false) {
            panic!("{broken}");
        }
    }
}

#[test]
fn without_pins_the_model_catches_lost_data() {
    let caught = (0..24).find_map(|seed| run(seed, 160, true));
    assert!(
        caught.is_some(),
        "no seed lost data with the protocol broken: the model cannot see a broken protocol"
    );
    eprintln!("caught: {}", caught.unwrap());
}

/// A writer whose pin put fails goes on: what its backup holds that a
/// collection condemned stays at risk (not forgotten with the failed
/// pin), so when the next collection began before any pin held it, the
/// backup stops instead of committing references to what that collection
/// deleted.
#[test]
fn a_failed_pin_leaves_what_it_held_at_risk() {
    // "new" reuses every container of "old", which then goes.
    let mut r = reusing_a_deleted_backup(5);
    // The first collection honours the pin the writer put as it first
    // held the containers; the second, looking after the writer last
    // did, reads no pin of the first's epoch and condemns them, which the
    // running backup holds.
    r.collector.gc_one_epoch(&GcOptions::default()).unwrap();
    r.collector.gc_one_epoch(&GcOptions::default()).unwrap();
    // The writer sees the epoch as it seals, but its pin put fails.
    r.store.fail_puts_under("pins/");
    // Data of its own (another seed than "old"'s): it seals, and looks.
    let mut rng = StdRng::seed_from_u64(1005);
    let fresh_blocks = blocks(&mut rng, 8);
    let fresh = stream(&mut rng, &fresh_blocks);
    let failed = fresh
        .chunks(4096)
        .any(|piece| r.session.append(piece).is_err());
    assert!(failed, "the pin put never failed");
    r.store.allow_puts();
    // The next collection deletes what no pin held.
    r.collector.gc_one_epoch(&GcOptions::default()).unwrap();
    r.commit_is_stopped();
}

/// A pin that does not read holds what cannot be known: collections
/// delete nothing while it counts, but still begin their epochs, so it
/// expires and is deleted, and collecting goes on after.
#[test]
fn a_damaged_pin_withholds_deletion_only_until_it_expires() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let repo = Repository::init(dir).unwrap();
    repo.backup_stream("gone", "g", &vec![3u8; 200_000][..])
        .unwrap();
    repo.delete_backup("gone").unwrap();
    let store = dedup_store::LocalDir::open(dir).unwrap();
    let pin = dedup_store::epochs::PinRecord::object_name(0, "elsewhere", 0);
    use dedup_store::ObjectStore;
    store.put(&pin, b"not a pin").unwrap();
    let r = repo.gc(&GcOptions::default()).unwrap();
    assert!(r.sweep_withheld && r.containers_swept == 0, "{r:?}");
    assert!(store.get(&pin).is_ok(), "expired too early");
    let mut swept = 0;
    for _ in 0..3 {
        swept += repo.gc(&GcOptions::default()).unwrap().containers_swept;
    }
    assert!(store.get(&pin).is_err(), "the damaged pin never expired");
    assert!(swept > 0, "nothing collected after it expired");
}

/// A backup goes on after one of its container puts failed (a fault that
/// passed, as a writer beside others sees them): it must not commit, as
/// its recipe already names segments of the container that never landed.
#[test]
fn a_backup_whose_container_put_failed_does_not_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    init_small(dir);
    let mut rng = StdRng::seed_from_u64(9);
    let pool = blocks(&mut rng, 64);
    let data: Vec<u8> = pool.concat();
    let (writer, store) = open_faulty(dir);
    let mut s = writer.begin_backup("b", "g").unwrap();
    store.fail_puts_under("containers/");
    let failed = data.chunks(4096).any(|piece| s.append(piece).is_err());
    assert!(failed, "no container put failed");
    store.allow_puts();
    match s.commit() {
        Err(RepoError::Incomplete { .. }) => {}
        other => panic!("committed over a container that never landed: {other:?}"),
    }
    assert!(writer.backup("b").is_err());
}

/// A backup that reuses what a deleted backup left is not stopped by a
/// whole `gc` (two collections) run between its looks: it pinned each
/// container as it first held it, so the first collection leaves them,
/// and it sees the second's condemnation while that epoch is the newest.
/// (Pinned only at its next look, the first collection would condemn
/// them and the second begin before that look: the backup stopped.)
#[test]
fn a_backup_reusing_a_deleted_backups_containers_outlives_a_gc_between_its_looks() {
    let Reusing {
        _tmp,
        dir,
        collector,
        session: mut s,
        old,
        ..
    } = reusing_a_deleted_backup(11);
    collector.gc(&GcOptions::default()).unwrap();
    // Data of its own (another seed than "old"'s): it seals, and looks.
    let mut rng = StdRng::seed_from_u64(1011);
    let fresh_blocks = blocks(&mut rng, 8);
    let fresh = stream(&mut rng, &fresh_blocks);
    for piece in fresh.chunks(4096) {
        s.append(piece).unwrap();
    }
    s.commit().expect("stopped by a gc between its looks");
    collector.gc(&GcOptions::default()).unwrap();
    collector.gc(&GcOptions::default()).unwrap();
    let mut out = Vec::new();
    Repository::open_read_only(&dir)
        .unwrap()
        .restore("new", &mut out)
        .unwrap();
    assert_eq!(out, [old, fresh].concat());
}

/// A collection waits for a writer in another process that is still
/// pinned at the epoch before the newest: a writer that looks (here a
/// thread that pins at each new epoch, as a backup does when it looks)
/// is waited for only until it has, and one that never looks costs one
/// wait of the bound, and is reported.
#[test]
fn a_collection_waits_for_writers_behind_only_until_they_look() {
    use dedup_store::epochs::{EpochRecord, PinRecord, EPOCH_PREFIX};
    use dedup_store::ObjectStore;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let repo = Repository::init(&dir).unwrap();
    repo.backup_stream("x", "g", &vec![5u8; 100_000][..])
        .unwrap();
    repo.gc(&GcOptions::default()).unwrap(); // epochs 1 and 2
    let store = dedup_store::LocalDir::open(&dir).unwrap();
    let newest = |s: &dedup_store::LocalDir| {
        s.list(EPOCH_PREFIX)
            .unwrap()
            .iter()
            .filter_map(|n| EpochRecord::epoch_of(n))
            .max()
            .unwrap_or(0)
    };
    assert_eq!(newest(&store), 2);
    // Another machine's process (never known dead here), pinned at 1.
    let pin = |epoch: u64, k: u64| {
        let record = PinRecord {
            epoch,
            process: "elsewhere-1-1".into(),
            containers: vec![1 << 40],
            ranges: Vec::new(),
            objects: Vec::new(),
        };
        (
            PinRecord::object_name(epoch, "00000000000000aa", k),
            record.encode(),
        )
    };
    let (name, bytes) = pin(1, 0);
    store.put(&name, &bytes).unwrap();
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|scope| {
        scope.spawn(|| {
            let store = dedup_store::LocalDir::open(&dir).unwrap();
            let (mut seen, mut k) = (1, 1);
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                let now = newest(&store);
                if now > seen {
                    let (name, bytes) = pin(now, k);
                    store.put(&name, &bytes).unwrap();
                    (seen, k) = (now, k + 1);
                }
            }
        });
        let r = repo.gc(&GcOptions {
            writer_wait: Duration::from_secs(20),
            ..Default::default()
        });
        stop.store(true, Ordering::SeqCst);
        r.unwrap()
    });
    assert_eq!(report.writers_not_caught_up, 0, "{report:?}");
    assert!(
        report.seconds_waiting_for_writers > 0.05 && report.seconds_waiting_for_writers < 10.0,
        "{report:?}"
    );
    // The writer stops looking: one wait of the bound, reported.
    let r = repo
        .gc(&GcOptions {
            writer_wait: Duration::from_millis(300),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.writers_not_caught_up, 1, "{r:?}");
    assert!(r.seconds_waiting_for_writers >= 0.3, "{r:?}");
    let r = repo
        .gc(&GcOptions {
            writer_wait: Duration::from_millis(300),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.writers_not_caught_up, 0, "its pins expired: {r:?}");
}

/// A backup "new" running in a faulty handle that reuses every container
/// of backup "old", which a collector (another handle) then deleted; and
/// an epoch-1 record condemning those containers, as a collection that
/// looked before the writer's pin would have made it.
struct Reusing {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    collector: &'static Repository,
    writer: &'static Repository,
    store: Arc<Faulty>,
    session: BackupSession<'static>,
    condemning: Vec<u8>,
    /// The bytes of "old", which "new" reused.
    old: Vec<u8>,
}

fn reusing_a_deleted_backup(seed: u64) -> Reusing {
    use dedup_store::epochs::EpochRecord;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    init_small(&dir);
    let mut rng = StdRng::seed_from_u64(seed);
    let old_blocks = blocks(&mut rng, 8);
    let old = stream(&mut rng, &old_blocks);
    let collector: &'static Repository = Box::leak(Box::new(Repository::open(&dir).unwrap()));
    collector.backup_stream("old", "g", &old[..]).unwrap();
    let condemned: Vec<u64> = objects(&dir, "containers/")
        .iter()
        .filter_map(|n| u64::from_str_radix(n.strip_prefix("containers/")?, 16).ok())
        .collect();
    assert!(!condemned.is_empty());
    let (writer, store) = open_faulty(&dir);
    let writer: &'static Repository = Box::leak(Box::new(writer));
    let mut session = writer.begin_backup("new", "g").unwrap();
    for piece in old.chunks(4096) {
        session.append(piece).unwrap();
    }
    assert_eq!(session.report().segments_new, 0, "the data was not reused");
    collector.delete_backup("old").unwrap();
    let condemning = EpochRecord {
        epoch: 1,
        condemned,
        compact: Vec::new(),
        objects: Vec::new(),
    }
    .encode();
    Reusing {
        _tmp: tmp,
        dir,
        collector,
        writer,
        store,
        session,
        condemning,
        old,
    }
}

impl Reusing {
    /// Commit "new": it must be stopped, and not listed.
    fn commit_is_stopped(self) {
        match self.session.commit() {
            Err(RepoError::Overtaken { .. }) => {}
            Ok(_) => {
                let mut out = Vec::new();
                let restored = Repository::open_read_only(&self.dir)
                    .unwrap()
                    .restore("new", &mut out);
                panic!("committed over deleted containers: restore gives {restored:?}");
            }
            Err(e) => panic!("{e}"),
        }
        assert!(
            self.writer.backup("new").is_err(),
            "a lost backup is listed"
        );
    }
}

/// A collection whose first look came before a backup's pin of what it
/// reuses was visible may condemn it (its epoch begun after the pin was
/// listed); the next collection, looking before the backup object is
/// visible and reading only pins of that epoch or later, deletes it. A
/// commit that checked only how many epochs began since its pin (two)
/// committed over the deleted container; the look after the put applies
/// the epochs and finds the condemnation was not the newest.
#[test]
fn a_commit_after_a_collection_that_condemned_what_it_reuses_and_another_that_deleted_it_is_lost() {
    use dedup_store::epochs::EpochRecord;
    use dedup_store::ObjectStore;
    let r = reusing_a_deleted_backup(13);
    // Between the writer's last look and its backup object's put: epoch
    // 1 condemns the old containers; collection 2 deletes them.
    let (dir, condemning, collector) = (r.dir.clone(), r.condemning.clone(), r.collector);
    r.store.before_put_under("backups/", move || {
        dedup_store::LocalDir::open(&dir)
            .unwrap()
            .put(&EpochRecord::object_name(1), &condemning)
            .unwrap();
        collector.gc_one_epoch(&GcOptions::default()).unwrap();
    });
    r.commit_is_stopped();
}

/// Another backup of the same process applies an epoch that condemned
/// what this one reuses, and its pin put fails; the next collection
/// deletes it, all while this one puts its backup object. The commit's
/// look after the put finds the condemnation still at risk and a newer
/// epoch: lost. (Counting epochs from the newest applied, which had moved
/// on without its pin landing, committed over the deleted container.)
#[test]
fn a_commit_does_not_trust_an_epoch_whose_pin_failed_in_another_backup() {
    use dedup_store::epochs::EpochRecord;
    use dedup_store::ObjectStore;
    let r = reusing_a_deleted_backup(17);
    let (dir, condemning, collector) = (r.dir.clone(), r.condemning.clone(), r.collector);
    let (writer, store) = (r.writer, r.store.clone());
    // The other backup looks as it begins (not only after a second).
    writer.set_look_interval(std::time::Duration::ZERO);
    r.store.before_put_under("backups/", move || {
        dedup_store::LocalDir::open(&dir)
            .unwrap()
            .put(&EpochRecord::object_name(1), &condemning)
            .unwrap();
        // Another backup here applies it; its pin put fails.
        store.fail_puts_under("pins/");
        assert!(
            writer.begin_backup("other", "g").is_err(),
            "the pin put did not fail"
        );
        store.allow_puts();
        // Collection 2 reads no pin of epoch 1 and deletes them.
        collector.gc_one_epoch(&GcOptions::default()).unwrap();
    });
    r.commit_is_stopped();
}

/// A container an epoch condemned while a backup of this process held it
/// stays held by that backup (pinned), but is never handed out again to
/// another: once its holder gives up, the process's next pin no longer
/// lists it, and a collection that honoured the old pin at its first
/// look deletes it after reading the new one at its second. Handed out
/// again (the catalog still cached), a later backup committed over the
/// deleted container.
#[test]
fn a_container_condemned_while_held_is_never_reused_by_another_backup_of_the_process() {
    use dedup_store::epochs::EpochRecord;
    use dedup_store::ObjectStore;
    let Reusing {
        _tmp,
        dir,
        writer,
        session: mut s1,
        condemning,
        old,
        ..
    } = reusing_a_deleted_backup(19);
    // Epoch 1 (a collection that looked before the pin) condemns the old
    // containers; "new" looks as it seals fresh data, and pins them at 1.
    dedup_store::LocalDir::open(&dir)
        .unwrap()
        .put(&EpochRecord::object_name(1), &condemning)
        .unwrap();
    let mut rng = StdRng::seed_from_u64(23);
    let fresh_blocks = blocks(&mut rng, 8);
    for piece in stream(&mut rng, &fresh_blocks).chunks(4096) {
        s1.append(piece).unwrap();
    }
    drop(s1); // gives up
              // Collection 2 honours that pin at its first look; just after its
              // epoch is put, a backup of the writer begins (its pin replaces the
              // old, no longer holding them), and the second look deletes them.
    let (collector, store) = open_faulty(&dir);
    store.after_put_under("gc/epoch-", move || {
        drop(writer.begin_backup("s2", "g").unwrap());
    });
    collector.gc_one_epoch(&GcOptions::default()).unwrap();
    let mut s3 = writer.begin_backup("s3", "g").unwrap();
    for piece in old.chunks(4096) {
        s3.append(piece).unwrap();
    }
    s3.commit().unwrap();
    let mut out = Vec::new();
    Repository::open_read_only(&dir)
        .unwrap()
        .restore("s3", &mut out)
        .expect("committed over a deleted container");
    assert_eq!(out, old);
}

/// A lookup whose pin applies an epoch that found the hinted entry dead
/// (its container to compact) must not hand it out: asked only before the
/// pin, it was, and a backup could reference an entry a collection had
/// found dead without knowing (the model lost a segment to compaction so,
/// seed 240, once looks came at most every second).
#[test]
fn an_entry_found_dead_by_the_epoch_a_lookup_applies_is_not_handed_out() {
    use dedup_store::epochs::EpochRecord;
    use dedup_store::ObjectStore;
    let tmp = tempfile::tempdir().unwrap();
    init_small(tmp.path());
    let mut rng = StdRng::seed_from_u64(5);
    let (a, b): (Vec<u8>, Vec<u8>) = (
        (0..4096).map(|_| rng.random()).collect(),
        (0..4096).map(|_| rng.random()).collect(),
    );
    let collector = Repository::open(tmp.path()).unwrap();
    collector
        .backup_stream("old", "g", &[a.clone(), b.clone()].concat()[..])
        .unwrap();
    let x = u64::from_str_radix(
        objects(tmp.path(), "containers/")
            .first()
            .unwrap()
            .strip_prefix("containers/")
            .unwrap(),
        16,
    )
    .unwrap();
    let writer = Repository::open(tmp.path()).unwrap();
    let mut session = writer.begin_backup("new", "g").unwrap();
    // Epoch 1 begins: x to compact, only entry 0 (a) live at its look.
    let record = EpochRecord {
        epoch: 1,
        condemned: Vec::new(),
        compact: vec![(x, vec![0b01])],
        objects: Vec::new(),
    };
    dedup_store::LocalDir::open(tmp.path())
        .unwrap()
        .put(&EpochRecord::object_name(1), &record.encode())
        .unwrap();
    let fp = writer.segment_hash().of(&b);
    assert_ne!(
        session.lookup(&fp).unwrap(),
        Some((x, 1)),
        "entry 1, dead at epoch 1's look, handed out after the lookup applied epoch 1"
    );
    let a_fp = writer.segment_hash().of(&a);
    assert_eq!(
        session.lookup(&a_fp).unwrap(),
        Some((x, 0)),
        "a live entry refused"
    );
}
