//! A restore's reads of containers in windows, where each request is dear.
//!
//! A restore reads each run of a recipe (consecutive entries of one
//! container) with one ranged read of exactly its frames. From a
//! directory that costs a `pread`. From an object store each read is a
//! request, and a recipe with duplicates between its runs breaks a
//! container's stream into many small reads, and comes back to the
//! containers its duplicates live in again and again: a 2 GiB ext4 image
//! took 2,132 ranged GETs (1.28 GB) from SeaweedFS, which spent 7.5
//! CPU-seconds serving them (restic, reading packs whole, sent 51 and cost
//! it 1 s). So where the store asks for it (`ObjectStore::read_granule`),
//! an object read before in this restore is read in aligned windows of the
//! granule, the last few kept for the runs that follow. An object's first
//! read stays exact, so a duplicate whose container is needed once costs
//! no more than before. The same image: 582 requests, 2.9 CPU-seconds of
//! SeaweedFS, and a peak RSS of 175 MB instead of 91 (16 windows of 4 MiB
//! kept, and the runs in flight).
//!
//! A window is fetched once however many threads want it (the first
//! fetches, the others wait for it), and a window that could not be
//! fetched sends its readers to the exact read, which knows the
//! fallbacks (a compacted container's other name) and the errors.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::objects::ObjectStore;

/// A window's bytes once fetched, or `None` if the fetch failed.
type Slot = Arc<OnceLock<Option<Arc<Vec<u8>>>>>;

/// Objects remembered as read before (forgotten all at once past this).
const OBJECTS_KEPT: usize = 1024;

pub(crate) struct Windows {
    /// Window size in bytes; 0 reads everything exactly.
    granule: u64,
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// (object, window index, its bytes), oldest first.
    windows: VecDeque<(String, u64, Slot)>,
    /// The objects read before.
    seen: HashSet<String>,
}

impl Windows {
    /// Windows of `granule` bytes, at most `capacity` of them kept
    /// (`granule` 0 or `capacity` 0: every read exact).
    pub(crate) fn new(granule: u64, capacity: usize) -> Windows {
        Windows {
            granule: if capacity == 0 { 0 } else { granule },
            capacity,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `len` bytes of object `name` from `offset`: from windows if the
    /// object was read before, else by `exact`.
    pub(crate) fn read(
        &self,
        store: &dyn ObjectStore,
        name: &str,
        offset: u64,
        len: u64,
        exact: impl Fn() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let g = self.granule;
        if g == 0 || len == 0 || !self.read_before(name) {
            return exact();
        }
        let end = offset + len;
        let mut out = Vec::with_capacity(len as usize);
        for w in offset / g..end.div_ceil(g) {
            let slot = self.slot(name, w);
            let fetched = slot.get_or_init(|| {
                store
                    .get_upto(name, w * g, g)
                    .ok()
                    .map(|(b, _)| Arc::new(b))
            });
            let from = (offset.max(w * g) - w * g) as usize;
            let to = (end.min((w + 1) * g) - w * g) as usize;
            match fetched.as_ref().and_then(|b| b.get(from..to)) {
                Some(piece) => out.extend_from_slice(piece),
                // Not fetched, or the object ends sooner than asked: the
                // exact read says what is wrong.
                None => return exact(),
            }
        }
        Ok(out)
    }

    /// Whether `name` was read before in this restore; remembers it.
    fn read_before(&self, name: &str) -> bool {
        let mut state = self.state();
        if state.seen.contains(name) {
            return true;
        }
        if state.seen.len() >= OBJECTS_KEPT {
            state.seen.clear();
        }
        state.seen.insert(name.to_owned());
        false
    }

    /// The slot of window `w` of `name`, made (and the oldest dropped) if
    /// none is kept.
    fn slot(&self, name: &str, w: u64) -> Slot {
        let mut state = self.state();
        if let Some((_, _, slot)) = state.windows.iter().find(|(n, i, _)| *i == w && n == name) {
            return Arc::clone(slot);
        }
        if state.windows.len() >= self.capacity {
            state.windows.pop_front();
        }
        let slot = Slot::default();
        state
            .windows
            .push_back((name.to_owned(), w, Arc::clone(&slot)));
        slot
    }

    /// Drop every window: a container may have been compacted under the
    /// restore (same name, other bytes), and a read is being tried again.
    pub(crate) fn forget(&self) {
        let mut state = self.state();
        state.windows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An object store of one object that counts its reads.
    struct One {
        bytes: Vec<u8>,
        reads: AtomicUsize,
    }

    impl One {
        fn new(len: usize) -> One {
            One {
                bytes: (0..len).map(|i| (i * 7 % 251) as u8).collect(),
                reads: AtomicUsize::new(0),
            }
        }
        fn exact(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.get_range("o", offset, len)
        }
    }

    impl ObjectStore for One {
        fn put(&self, _: &str, _: &[u8]) -> Result<()> {
            unreachable!()
        }
        fn get(&self, _: &str) -> Result<Vec<u8>> {
            Ok(self.bytes.clone())
        }
        fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
            let size = self.bytes.len() as u64;
            if offset + len > size {
                return Err(Error::out_of_range(name, offset, len, size));
            }
            Ok(self.bytes[offset as usize..(offset + len) as usize].to_vec())
        }
        fn get_upto(&self, name: &str, offset: u64, len: u64) -> Result<(Vec<u8>, u64)> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let size = self.bytes.len() as u64;
            let len = len.min(size.saturating_sub(offset));
            Ok((self.get_range(name, offset, len)?, size))
        }
        fn get_tail(&self, _: &str, _: u64) -> Result<Vec<u8>> {
            unreachable!()
        }
        fn list(&self, _: &str) -> Result<Vec<String>> {
            Ok(vec![])
        }
        fn size(&self, _: &str) -> Result<u64> {
            Ok(self.bytes.len() as u64)
        }
        fn segment_hash(&self) -> crate::segment_hash::SegmentHash {
            crate::segment_hash::SegmentHash::PLAIN
        }
        fn delete(&self, _: &str) -> Result<()> {
            unreachable!()
        }
    }

    fn read(w: &Windows, s: &One, offset: u64, len: u64) -> Vec<u8> {
        w.read(s, "o", offset, len, || s.exact(offset, len))
            .unwrap()
    }

    #[test]
    fn a_sequence_of_small_reads_costs_a_request_a_window() {
        let s = One::new(10_000);
        let w = Windows::new(1000, 4);
        let mut at = 0;
        while at < 10_000 {
            let len = 90.min(10_000 - at);
            assert_eq!(
                read(&w, &s, at, len),
                s.bytes[at as usize..(at + len) as usize]
            );
            at += len;
        }
        // The first read exact, then the ten windows.
        assert_eq!(s.reads.load(Ordering::Relaxed), 11);
    }

    #[test]
    fn an_objects_first_read_is_exact() {
        let s = One::new(100_000);
        let w = Windows::new(1000, 4);
        assert_eq!(read(&w, &s, 50_000, 100), s.bytes[50_000..50_100]);
        assert_eq!(s.reads.load(Ordering::Relaxed), 1);
        assert!(w.state().windows.is_empty());
        // The second, anywhere in it, reads its window; the third, in
        // the same window, reads nothing.
        assert_eq!(read(&w, &s, 3_100, 100), s.bytes[3_100..3_200]);
        assert_eq!(read(&w, &s, 3_500, 100), s.bytes[3_500..3_600]);
        assert_eq!(s.reads.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn windows_past_the_capacity_are_read_again() {
        let s = One::new(10_000);
        let w = Windows::new(1000, 2);
        read(&w, &s, 0, 10);
        for at in [0, 1000, 2000, 0] {
            assert_eq!(read(&w, &s, at, 10), s.bytes[at as usize..at as usize + 10]);
        }
        // The exact read, windows 0, 1, 2, then 0 again (dropped for 2).
        assert_eq!(s.reads.load(Ordering::Relaxed), 5);
        w.forget();
        read(&w, &s, 2000, 10);
        assert_eq!(
            s.reads.load(Ordering::Relaxed),
            6,
            "forget drops what was read"
        );
    }

    #[test]
    fn a_read_across_windows_and_past_the_end() {
        let s = One::new(2_500);
        let w = Windows::new(1000, 4);
        read(&w, &s, 0, 10);
        assert_eq!(read(&w, &s, 900, 1_200), s.bytes[900..2_100]);
        assert_eq!(read(&w, &s, 2_100, 400), s.bytes[2_100..2_500]);
        // Past the end: the exact read's error, not a short answer.
        assert!(w.read(&s, "o", 2_400, 200, || s.exact(2_400, 200)).is_err());
    }

    #[test]
    fn off_reads_exactly() {
        let s = One::new(5_000);
        let w = Windows::new(0, 4);
        for at in (0..5_000).step_by(100) {
            read(&w, &s, at, 100);
        }
        assert_eq!(s.reads.load(Ordering::Relaxed), 50);
    }

    #[test]
    fn threads_wanting_one_window_fetch_it_once() {
        let s = One::new(100_000);
        let w = Windows::new(50_000, 4);
        read(&w, &s, 0, 10);
        std::thread::scope(|scope| {
            for k in 0..8u64 {
                let (w, s) = (&w, &s);
                scope.spawn(move || {
                    let at = 10 + k * 1000;
                    assert_eq!(read(w, s, at, 500), s.bytes[at as usize..at as usize + 500]);
                });
            }
        });
        // The first exact read, then one fetch of window 0.
        assert_eq!(s.reads.load(Ordering::Relaxed), 2);
    }
}
