//! A device opened only to inspect it (`status`, `check` without
//! `--repair`) must leave its files as they were, yet some engines write
//! while they open (redb records its allocator state, recovery replays a
//! journal). This overlay takes those writes in RAM, by 4 KiB page, and
//! serves them back to later reads; the file underneath is only read.

use std::collections::hash_map::{Entry, HashMap};

use std::ops::Range;

use parking_lot::Mutex;

use super::BlockFile;
use crate::error::Result;

const PAGE: u64 = 4096;

pub struct Overlay<F> {
    inner: F,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pages: HashMap<u64, Box<[u8]>>,
    /// Writes past the end grow the device, as they would the file.
    len: Option<u64>,
}

impl<F: BlockFile> Overlay<F> {
    pub fn new(inner: F) -> Self {
        Overlay {
            inner,
            state: Mutex::new(State::default()),
        }
    }
}

impl<F: BlockFile> BlockFile for Overlay<F> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let s = self.state.lock();
        let inner_len = self.inner.len()?;
        let end = offset + buf.len() as u64;
        if end > s.len.unwrap_or(0).max(inner_len) {
            // Let the file report the out-of-range read in its own words.
            return self.inner.read_at(buf, offset);
        }
        // What the file holds (zeros past its end), then the pages over it.
        if offset < inner_len {
            let n = (inner_len - offset).min(buf.len() as u64) as usize;
            self.inner.read_at(&mut buf[..n], offset)?;
            buf[n..].fill(0);
        } else {
            buf.fill(0);
        }
        let mut at = offset;
        while at < end {
            let page = at / PAGE;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min((end - at) as usize);
            if let Some(p) = s.pages.get(&page) {
                let from = (at - offset) as usize;
                buf[from..from + n].copy_from_slice(&p[in_page..in_page + n]);
            }
            at += n as u64;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let mut s = self.state.lock();
        let inner_len = self.inner.len()?;
        let end = offset + buf.len() as u64;
        let mut at = offset;
        while at < end {
            let page = at / PAGE;
            let in_page = (at % PAGE) as usize;
            let n = (PAGE as usize - in_page).min((end - at) as usize);
            let p = match s.pages.entry(page) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => {
                    let mut p = vec![0u8; PAGE as usize].into_boxed_slice();
                    let start = page * PAGE;
                    if start < inner_len {
                        let have = (inner_len - start).min(PAGE) as usize;
                        self.inner.read_at(&mut p[..have], start)?;
                    }
                    v.insert(p)
                }
            };
            let from = (at - offset) as usize;
            p[in_page..in_page + n].copy_from_slice(&buf[from..from + n]);
            at += n as u64;
        }
        s.len = Some(s.len.unwrap_or(0).max(end));
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.state.lock().len.unwrap_or(0).max(self.inner.len()?))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn capacity(&self) -> Result<Option<u64>> {
        self.inner.capacity()
    }

    fn allocated(&self) -> Result<Option<u64>> {
        self.inner.allocated()
    }

    /// The file's data, and the pages written over it.
    fn data_ranges(&self, range: Range<u64>) -> Result<Option<Vec<Range<u64>>>> {
        let Some(mut out) = self.inner.data_ranges(range.clone())? else {
            return Ok(None);
        };
        let s = self.state.lock();
        out.extend(s.pages.keys().filter_map(|&p| {
            let page = (p * PAGE).max(range.start)..((p + 1) * PAGE).min(range.end);
            (page.start < page.end).then_some(page)
        }));
        out.sort_unstable_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in out {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Ok(Some(merged))
    }

    /// Nothing: the file underneath is only read, and a punch only gives
    /// space back, so dropping it changes no byte the engine relies on
    /// (it punches only blocks nothing reads again).
    fn punch(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }

    fn ordered_io(&self) -> bool {
        self.inner.ordered_io()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blockfile::MemBlockFile;
    use std::sync::Arc;

    #[test]
    fn writes_are_read_back_and_never_reach_the_file() {
        let file = Arc::new(MemBlockFile::from_bytes(
            (0..10_000u32).map(|i| i as u8).collect(),
            "f",
        ));
        let o = Overlay::new(file.clone());
        o.write_at(&[0xaa; 5000], 3000).unwrap();
        o.write_at(&[0xbb; 10], 12_000).unwrap();
        assert_eq!(o.len().unwrap(), 12_010);
        let mut got = vec![0u8; 12_010];
        o.read_at(&mut got, 0).unwrap();
        for (i, &b) in got.iter().enumerate() {
            let want = match i {
                3000..8000 => 0xaa,
                12_000.. => 0xbb,
                10_000.. => 0,
                _ => i as u8,
            };
            assert_eq!(b, want, "byte {i}");
        }
        let mut orig = vec![0u8; 10_000];
        file.read_at(&mut orig, 0).unwrap();
        assert!(orig.iter().enumerate().all(|(i, &b)| b == i as u8));
        assert_eq!(file.len().unwrap(), 10_000);
        assert!(o.read_at(&mut [0u8; 1], 12_010).is_err());
    }
}
