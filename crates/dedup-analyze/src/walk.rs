//! Expanding the inputs to the files to read: directories walked by
//! several threads (a directory tree of many small files is bound by
//! metadata look-ups, which overlap), symbolic links inside directories not
//! followed (the data they point at is counted where it lives), links named
//! on the command line followed (as `find -H` does), block devices read
//! whole when named on the command line. What cannot be read is reported.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// The files found, sorted, and the links left alone.
#[derive(Debug, Default)]
pub struct Walked {
    pub files: Vec<PathBuf>,
    pub symlinks: u64,
}

struct Shared {
    stack: Vec<PathBuf>,
    /// Directories being listed right now: the walk ends when the stack is
    /// empty and nobody can add to it.
    busy: usize,
    out: Walked,
    skipped: Vec<(PathBuf, String)>,
}

/// Walk `inputs` with `threads` threads.
pub fn walk_parallel(inputs: &[PathBuf], threads: usize) -> (Walked, Vec<(PathBuf, String)>) {
    let mut shared = Shared {
        stack: Vec::new(),
        busy: 0,
        out: Walked::default(),
        skipped: Vec::new(),
    };
    for p in inputs {
        match std::fs::metadata(p) {
            Ok(m) if m.file_type().is_block_device() => shared.out.files.push(p.clone()),
            Ok(m) if m.is_dir() => shared.stack.push(p.clone()),
            Ok(m) if m.is_file() => shared.out.files.push(p.clone()),
            Ok(_) => shared.skipped.push((p.clone(), not_regular())),
            Err(e) => shared.skipped.push((p.clone(), e.to_string())),
        }
    }
    let state = Mutex::new(shared);
    let wake = Condvar::new();
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| worker(&state, &wake));
        }
    });
    let mut shared = state.into_inner().unwrap_or_else(|e| e.into_inner());
    shared.out.files.sort();
    shared.skipped.sort();
    (shared.out, shared.skipped)
}

fn not_regular() -> String {
    "not a regular file (device, socket or pipe); name a block device on the command line to read it whole".into()
}

fn worker(state: &Mutex<Shared>, wake: &Condvar) {
    let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let Some(dir) = g.stack.pop() else {
            if g.busy == 0 {
                wake.notify_all();
                return;
            }
            g = wake.wait(g).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        g.busy += 1;
        drop(g);
        let (mut files, mut dirs, mut skipped, mut links) = (Vec::new(), Vec::new(), Vec::new(), 0);
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                for e in entries {
                    let e = match e {
                        Ok(e) => e,
                        Err(err) => {
                            skipped.push((dir.clone(), err.to_string()));
                            continue;
                        }
                    };
                    let path = e.path();
                    match e.file_type() {
                        Ok(t) if t.is_symlink() => links += 1,
                        Ok(t) if t.is_dir() => dirs.push(path),
                        Ok(t) if t.is_file() => files.push(path),
                        Ok(_) => skipped.push((path, not_regular())),
                        Err(err) => skipped.push((path, err.to_string())),
                    }
                }
            }
            Err(e) => skipped.push((dir.clone(), e.to_string())),
        }
        g = state.lock().unwrap_or_else(|e| e.into_inner());
        g.busy -= 1;
        g.out.files.extend(files);
        g.out.symlinks += links;
        g.skipped.extend(skipped);
        if !dirs.is_empty() {
            g.stack.extend(dirs);
            wake.notify_all();
        }
    }
}

/// `walk_parallel` with one thread per CPU, reporting what it skipped to
/// `skipped` (the library's simple form).
pub fn walk(inputs: &[PathBuf], skipped: &mut dyn FnMut(&Path, String)) -> Vec<PathBuf> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (w, skips) = walk_parallel(inputs, threads);
    for (p, why) in skips {
        skipped(&p, why);
    }
    w.files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_found_whole_links_inside_are_counted_and_a_link_named_is_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for i in 0..30 {
            let sub = root.join(format!("d{}", i % 7)).join(format!("e{}", i % 3));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(format!("f{i}")), b"x").unwrap();
        }
        std::os::unix::fs::symlink(root.join("d0"), root.join("link-in-tree")).unwrap();
        let (w, skipped) = walk_parallel(&[root.to_path_buf()], 4);
        assert_eq!(w.files.len(), 30);
        assert_eq!(w.symlinks, 1);
        assert!(skipped.is_empty());
        let mut sorted = w.files.clone();
        sorted.sort();
        assert_eq!(w.files, sorted);
        // Named on the command line, a link is followed.
        let (w, _) = walk_parallel(&[root.join("link-in-tree")], 2);
        assert!(!w.files.is_empty());
        // A missing input is reported.
        let (w, skipped) = walk_parallel(&[root.join("nope")], 2);
        assert!(w.files.is_empty() && skipped.len() == 1);
    }
}
