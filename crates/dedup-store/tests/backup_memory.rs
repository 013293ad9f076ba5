//! What a backup of files holds in RAM that grows with its tree: only the
//! tree objects, compressed (its own as the walk writes it, its parent's
//! as stored), never the trees decoded. Measured with a counting
//! allocator, as the growth of the peak heap between two trees of
//! different sizes, for a first backup and for one with a parent; alone
//! in its test binary, so no other test's allocations count.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use dedup_store::Repository;

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = NOW.fetch_add(by, Relaxed) + by;
    PEAK.fetch_max(now, Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        NOW.fetch_sub(l.size(), Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            NOW.fetch_sub(l.size(), Relaxed);
            grew(new);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The peak heap while `f` runs, above what was held when it started.
fn peak_of<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let base = NOW.load(Relaxed);
    PEAK.store(base, Relaxed);
    let out = f();
    (PEAK.load(Relaxed) - base, out)
}

/// `files` files of the same few bytes (one segment, stored once: what
/// grows is the tree, not the store) with long-ish names, 200 a directory.
fn make_tree(root: &Path, files: usize) {
    for i in 0..files {
        let dir = root.join(format!("directory-{:04}", i / 200));
        if i % 200 == 0 {
            fs::create_dir_all(&dir).unwrap();
        }
        fs::write(dir.join(format!("a-file-with-a-name-{i:07}.txt")), b"same").unwrap();
    }
}

/// The peak heap of a first backup of a tree of `files` files, and of a
/// second one with the first as its parent.
fn peaks(tmp: &Path, files: usize) -> (usize, usize) {
    let data = tmp.join(format!("data-{files}"));
    let repo = Repository::init(tmp.join(format!("repo-{files}"))).unwrap();
    // Recipe parts of 256 references: the recipe's RAM stays put.
    repo.set_recipe_part_segments(256);
    let (first, r) = peak_of(|| repo.backup_paths("one", "g", &[&data], |_| {}).unwrap());
    assert_eq!(r.counts.files, files as u64);
    let (second, r) = peak_of(|| repo.backup_paths("two", "g", &[&data], |_| {}).unwrap());
    assert_eq!(r.files_unchanged, files as u64, "the parent is used");
    (first, second)
}

#[test]
fn a_backup_of_files_holds_its_trees_compressed_not_decoded() {
    let tmp = tempfile::tempdir().unwrap();
    let (small, large) = (4_000, 16_000);
    for files in [small, large] {
        make_tree(&tmp.path().join(format!("data-{files}")), files);
    }
    // A file changed within a second of being read is read again next
    // time, not reused: let the new files age first.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (first_s, second_s) = peaks(tmp.path(), small);
    let (first_l, second_l) = peaks(tmp.path(), large);
    let per_file = |s: usize, l: usize| l.saturating_sub(s) / (large - small);
    let (first, second) = (per_file(first_s, first_l), per_file(second_s, second_l));
    eprintln!("peak heap a file: first backup {first} bytes, with a parent {second}");
    // A tree entry here is about 180 bytes encoded, 300 decoded; they
    // compress to well under 40.
    assert!(
        first <= 64 && second <= 64,
        "peak heap grows {first} bytes a file on a first backup, {second} with a parent \
         (first {first_s} -> {first_l}, second {second_s} -> {second_l})"
    );
}
