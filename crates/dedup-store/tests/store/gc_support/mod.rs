//! What the GC tests share: an object store wrapper that counts reads by
//! prefix and can die after N operations (a crash: every operation after
//! the Nth fails), a checker of every live backup and of what a finished
//! GC must leave, and random streams that share content.

#![allow(dead_code)] // each test file uses a different part

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use dedup_store::error::{Error, Result};
use dedup_store::gc::{GcOptions, GcReport, Marks};
use dedup_store::recipe::parts::{part_name, RecipeObject};
use dedup_store::{ObjectStore, Repository};
use rand::{rngs::StdRng, Rng, RngCore};

pub struct Faulty {
    inner: Arc<dyn ObjectStore>,
    ops: AtomicU64,
    /// Operations allowed before every one fails; u64::MAX: never.
    budget: AtomicU64,
    /// Whole or ranged reads, by object name.
    pub reads: Mutex<Vec<String>>,
    /// Puts of names under this prefix fail.
    fail_puts_under: Mutex<Option<String>>,
    /// Run once before the first put of a name under the prefix (another
    /// process acting between two requests of this one).
    before_put_under: Mutex<Option<(String, Hook)>>,
    /// Run once after the first put of a name under the prefix.
    after_put_under: Mutex<Option<(String, Hook)>>,
    /// The read granule answered (restores read in windows of it), or
    /// u64::MAX for the inner store's.
    granule: AtomicU64,
}

type Hook = Box<dyn FnOnce() + Send>;

/// Run (once) the hook in `slot` if `name` is under its prefix; the lock
/// is let go first, so the hook may use the store.
fn run_hook(slot: &Mutex<Option<(String, Hook)>>, name: &str) {
    let hook = {
        let mut slot = slot.lock().unwrap();
        match slot.as_ref() {
            Some((p, _)) if name.starts_with(p.as_str()) => slot.take().map(|(_, h)| h),
            _ => None,
        }
    };
    if let Some(hook) = hook {
        hook();
    }
}

impl Faulty {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Faulty {
        Faulty {
            inner,
            ops: AtomicU64::new(0),
            budget: AtomicU64::new(u64::MAX),
            reads: Mutex::new(Vec::new()),
            fail_puts_under: Mutex::new(None),
            before_put_under: Mutex::new(None),
            after_put_under: Mutex::new(None),
            granule: AtomicU64::new(u64::MAX),
        }
    }

    /// Answer `granule` as the read granule: restores then read what
    /// they read again in windows of it, as from S3.
    pub fn set_read_granule(&self, granule: u64) {
        self.granule.store(granule, SeqCst);
    }

    /// Run `hook` once, just before the first put of a name under
    /// `prefix`.
    pub fn before_put_under(&self, prefix: &str, hook: impl FnOnce() + Send + 'static) {
        *self.before_put_under.lock().unwrap() = Some((prefix.to_string(), Box::new(hook)));
    }

    /// Run `hook` once, just after the first put of a name under
    /// `prefix` succeeded.
    pub fn after_put_under(&self, prefix: &str, hook: impl FnOnce() + Send + 'static) {
        *self.after_put_under.lock().unwrap() = Some((prefix.to_string(), Box::new(hook)));
    }

    /// Forget a hook that has not run.
    pub fn clear_hook(&self) {
        *self.before_put_under.lock().unwrap() = None;
        *self.after_put_under.lock().unwrap() = None;
    }

    /// Fail every put of a name under `prefix` (e.g. `backups/`: a backup
    /// that dies just before its commit point).
    pub fn fail_puts_under(&self, prefix: &str) {
        *self.fail_puts_under.lock().unwrap() = Some(prefix.to_string());
    }

    /// Let puts under the prefix given to `fail_puts_under` succeed again.
    pub fn allow_puts(&self) {
        *self.fail_puts_under.lock().unwrap() = None;
    }

    /// Let `n` more operations succeed, then fail every one.
    pub fn fail_after(&self, n: u64) {
        self.budget
            .store(self.ops.load(SeqCst).saturating_add(n), SeqCst);
    }

    /// Let every operation succeed again (a fault that passed).
    pub fn recover(&self) {
        self.budget.store(u64::MAX, SeqCst);
    }

    pub fn ops(&self) -> u64 {
        self.ops.load(SeqCst)
    }

    pub fn reads_under(&self, prefix: &str) -> Vec<String> {
        let reads = self.reads.lock().unwrap();
        reads
            .iter()
            .filter(|r| r.starts_with(prefix))
            .cloned()
            .collect()
    }

    pub fn clear_reads(&self) {
        self.reads.lock().unwrap().clear();
    }

    fn step(&self, name: &str) -> Result<()> {
        let n = self.ops.fetch_add(1, SeqCst);
        if n >= self.budget.load(SeqCst) {
            return Err(Error::io(
                format!("simulated crash before an operation on {name}"),
                std::io::Error::other("crashed"),
            ));
        }
        Ok(())
    }

    fn read(&self, name: &str) -> Result<()> {
        self.step(name)?;
        self.reads.lock().unwrap().push(name.to_string());
        Ok(())
    }
}

impl ObjectStore for Faulty {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        self.step(name)?;
        run_hook(&self.before_put_under, name);
        let refused = self.fail_puts_under.lock().unwrap();
        if refused
            .as_ref()
            .is_some_and(|p| name.starts_with(p.as_str()))
        {
            return Err(Error::io(
                format!("simulated crash before putting {name}"),
                std::io::Error::other("crashed"),
            ));
        }
        drop(refused);
        self.inner.put(name, bytes)?;
        run_hook(&self.after_put_under, name);
        Ok(())
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.read(name)?;
        self.inner.get(name)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read(name)?;
        self.inner.get_range(name, offset, len)
    }
    fn get_tail(&self, name: &str, len: u64) -> Result<Vec<u8>> {
        self.read(name)?;
        self.inner.get_tail(name, len)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.step(prefix)?;
        self.inner.list(prefix)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.step(name)?;
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.step(name)?;
        self.inner.delete(name)
    }
    fn segment_hash(&self) -> dedup_store::segment_hash::SegmentHash {
        self.inner.segment_hash()
    }

    fn read_granule(&self) -> u64 {
        match self.granule.load(SeqCst) {
            u64::MAX => self.inner.read_granule(),
            g => g,
        }
    }
}

/// Open `dir` to write through a `Faulty` store.
pub fn open_faulty(dir: &Path) -> (Repository, Arc<Faulty>) {
    let mut slot = None;
    let repo = Repository::open_wrapped(dir, |s| {
        let f = Arc::new(Faulty::new(s));
        slot = Some(f.clone());
        f
    })
    .unwrap();
    (repo, slot.unwrap())
}

/// Every backup in `model` restores byte-exact and no other is listed.
pub fn check_backups(repo: &Repository, model: &BTreeMap<String, Vec<u8>>) {
    let listed: Vec<String> = repo
        .list_backups()
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(listed, model.keys().cloned().collect::<Vec<_>>());
    for (name, data) in model {
        let mut out = Vec::new();
        repo.restore(name, &mut out)
            .unwrap_or_else(|e| panic!("restoring {name}: {e}"));
        assert!(out == *data, "backup {name} restored wrong");
    }
}

/// Objects under `prefix` in the repository directory.
pub fn objects(dir: &Path, prefix: &str) -> BTreeSet<String> {
    let d = dir.join(prefix);
    let Ok(rd) = std::fs::read_dir(&d) else {
        return BTreeSet::new();
    };
    rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .map(|n| format!("{prefix}{n}"))
        .collect()
}

/// Container bytes on disk.
pub fn container_bytes(dir: &Path) -> u64 {
    objects(dir, "containers/")
        .iter()
        .map(|o| std::fs::metadata(dir.join(o)).unwrap().len())
        .sum()
}

/// A collection, then another whose report is dropped: what a writer
/// killed mid-backup left is pinned for one epoch after its last pin, so
/// its garbage goes one collection later (a killed process of this
/// machine is known dead at once, but a handle dropped in a test is not).
pub fn gc_settled(repo: &Repository, options: &GcOptions) -> GcReport {
    let r = repo.gc(options).unwrap();
    repo.gc(options).unwrap();
    r
}

/// What a finished GC with no backup running must leave: exactly the
/// containers the live backups' recipes reference, exactly their recipes
/// and trees, and one marks object per group.
pub fn check_collected(dir: &Path) {
    let repo = Repository::open_read_only(dir).unwrap();
    let backups = repo.list_backups().unwrap();
    let mut containers = BTreeSet::new();
    let mut named = BTreeSet::new();
    for b in &backups {
        let (_, recipe) = repo.recipe(&b.name).unwrap();
        containers.extend(
            recipe
                .segments
                .iter()
                .map(|s| format!("containers/{:016x}", s.container)),
        );
        named.insert(b.recipe.clone());
        named.extend(b.tree.clone());
        let head = std::fs::read(dir.join(&b.recipe)).unwrap();
        if let RecipeObject::Index(i) = RecipeObject::decode(&b.recipe, &head).unwrap() {
            named.extend((0..i.parts.len()).map(|k| part_name(&b.recipe, k)));
        }
    }
    assert_eq!(objects(dir, "containers/"), containers, "containers left");
    let mut found = objects(dir, "recipes/");
    found.extend(objects(dir, "trees/"));
    assert_eq!(found, named, "recipes and trees left");
    let groups: BTreeSet<&str> = backups.iter().map(|b| b.group.as_str()).collect();
    let marks = objects(dir, "gc/marks/");
    assert_eq!(
        marks.len(),
        groups.len(),
        "marks objects {marks:?} for groups {groups:?}"
    );
    // Each group's marks are exactly its backups' references, and their
    // counts (taken out and added as backups went and came) exactly how
    // many of the backups reference each entry.
    for object in &marks {
        let m = Marks::decode(object, &std::fs::read(dir.join(object)).unwrap()).unwrap();
        let mut want = Marks::counted(&m.group);
        for b in backups.iter().filter(|b| b.group == m.group) {
            let mut one = Marks::new(&m.group);
            one.mark(&repo.recipe(&b.name).unwrap().1);
            want.add_backup(&b.name, &b.recipe, &one);
        }
        assert_eq!(m.backups, want.backups, "{object}");
        assert_eq!(m.containers, want.containers, "{object}");
        if m.counts.is_some() {
            assert_eq!(m.counts, want.counts, "{object}");
        }
    }
    assert!(objects(dir, "compacted/").is_empty());
    let candidates: Vec<String> = objects(dir, "gc/")
        .into_iter()
        .filter(|o| o.starts_with("gc/candidates-"))
        .collect();
    // Candidates stay until compacted (those not below the threshold),
    // in one object.
    assert!(candidates.len() <= 1, "{candidates:?} left");
}

/// After a finished GC with the default threshold: every container either
/// stores no dead segment or stores at least half live bytes; and every
/// segment a live backup needs is stored.
pub fn check_compacted(dir: &Path) {
    let repo = Repository::open_read_only(dir).unwrap();
    let store = dedup_store::LocalDir::open(dir).unwrap();
    let mut live: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
    for b in repo.list_backups().unwrap() {
        let (_, recipe) = repo.recipe(&b.name).unwrap();
        for s in recipe.segments {
            live.entry(s.container).or_default().insert(s.entry);
        }
    }
    for (id, entries) in &live {
        let catalog = dedup_store::Catalog::read(&store, *id).unwrap();
        let (mut all, mut kept) = (0u64, 0u64);
        for (i, e) in catalog.entries().iter().enumerate() {
            let stored = u64::from(e.location.stored_len);
            all += stored;
            if entries.contains(&(i as u32)) {
                assert!(
                    !e.is_absent(),
                    "container {id:x} entry {i} is needed but was removed"
                );
                kept += stored;
            }
        }
        assert!(
            kept == all || kept * 2 >= all,
            "container {id:x}: {kept} of {all} bytes live"
        );
    }
}

/// `n` random blocks of 4 KiB: the shared content streams are built from.
pub fn blocks(rng: &mut StdRng, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let mut b = vec![0u8; 4096];
            rng.fill_bytes(&mut b);
            b
        })
        .collect()
}

/// A stream of shared blocks, some of its own, sometimes a tail that is
/// not a whole block.
pub fn stream(rng: &mut StdRng, blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut s = Vec::new();
    if rng.random_ratio(1, 10) {
        return s;
    }
    for _ in 0..rng.random_range(1..30) {
        if rng.random_ratio(1, 4) {
            let mut own = vec![0u8; 4096];
            rng.fill_bytes(&mut own);
            s.extend_from_slice(&own);
        } else {
            s.extend_from_slice(&blocks[rng.random_range(0..blocks.len())]);
        }
    }
    if rng.random_ratio(1, 3) {
        let mut tail = vec![0u8; rng.random_range(1..4096)];
        rng.fill_bytes(&mut tail);
        s.extend_from_slice(&tail);
    }
    s
}
