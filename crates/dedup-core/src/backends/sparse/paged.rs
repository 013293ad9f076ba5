//! The summaries' counts in RAM, paged: a `u16` per table block (PBNs in
//! use, records, mapped LBNs), held only for pages of `PAGE` entries where
//! some count is not zero. A device of 15 TiB with lz4 has 63 million
//! refcount blocks (a packed device counts 16 addresses a block); dense
//! arrays cost 250 MiB of RAM and 1.8 s of reading at open whatever was
//! stored. Paged, both follow the data written: a page exists only once a
//! block it counts holds something, and scans jump from page to page.

use std::collections::BTreeMap;

/// Entries per page: 2 KiB of counts.
const PAGE: u64 = 1024;

struct Page {
    counts: Box<[u16]>,
    /// Entries of this page that are not zero (0: the page is dropped).
    nonzero: u16,
}

#[derive(Default)]
pub struct PagedCounts {
    pages: BTreeMap<u64, Page>,
}

impl PagedCounts {
    pub fn get(&self, i: u64) -> u16 {
        self.pages
            .get(&(i / PAGE))
            .map_or(0, |p| p.counts[(i % PAGE) as usize])
    }

    pub fn set(&mut self, i: u64, n: u16) {
        let (page, at) = (i / PAGE, (i % PAGE) as usize);
        if n == 0 {
            let Some(p) = self.pages.get_mut(&page) else {
                return;
            };
            if p.counts[at] != 0 {
                p.counts[at] = 0;
                p.nonzero -= 1;
                if p.nonzero == 0 {
                    self.pages.remove(&page);
                }
            }
            return;
        }
        let p = self.pages.entry(page).or_insert_with(|| Page {
            counts: vec![0; PAGE as usize].into_boxed_slice(),
            nonzero: 0,
        });
        if p.counts[at] == 0 {
            p.nonzero += 1;
        }
        p.counts[at] = n;
    }

    /// The first entry at or after `from` whose count is not zero.
    pub fn next_nonzero(&self, from: u64) -> Option<u64> {
        for (&page, p) in self.pages.range(from / PAGE..) {
            let start = if page == from / PAGE { from % PAGE } else { 0 };
            if let Some(at) = (start..PAGE).find(|&at| p.counts[at as usize] != 0) {
                return Some(page * PAGE + at);
            }
        }
        None
    }

    /// Every entry whose count is not zero, in order.
    pub fn nonzero(&self) -> impl Iterator<Item = (u64, u16)> + '_ {
        self.pages.iter().flat_map(|(&page, p)| {
            (p.counts.iter().enumerate())
                .filter(|(_, &n)| n != 0)
                .map(move |(at, &n)| (page * PAGE + at as u64, n))
        })
    }

    pub fn sum(&self) -> u64 {
        self.nonzero().map(|(_, n)| u64::from(n)).sum()
    }

    #[cfg(test)]
    fn pages(&self) -> u64 {
        self.pages.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Paged counts read, skip and sum exactly as a dense array does,
        /// and keep no page whose counts are all zero.
        #[test]
        fn paged_counts_are_a_dense_array(ops in prop::collection::vec((0u64..5000, 0u16..4), 1..400)) {
            let mut dense = vec![0u16; 5000];
            let mut paged = PagedCounts::default();
            for (i, n) in ops {
                dense[i as usize] = n;
                paged.set(i, n);
            }
            for i in 0..5000u64 {
                prop_assert_eq!(paged.get(i), dense[i as usize]);
                let next = (i..5000).find(|&j| dense[j as usize] != 0);
                prop_assert_eq!(paged.next_nonzero(i), next);
            }
            let want: Vec<(u64, u16)> = (0..5000u64)
                .filter(|&i| dense[i as usize] != 0)
                .map(|i| (i, dense[i as usize]))
                .collect();
            prop_assert_eq!(paged.nonzero().collect::<Vec<_>>(), want);
            prop_assert_eq!(paged.sum(), dense.iter().map(|&n| u64::from(n)).sum::<u64>());
            let pages_needed = (0..5000u64 / PAGE + 1)
                .filter(|&p| (p * PAGE..((p + 1) * PAGE).min(5000)).any(|i| dense[i as usize] != 0))
                .count() as u64;
            prop_assert_eq!(paged.pages(), pages_needed);
        }
    }
}
