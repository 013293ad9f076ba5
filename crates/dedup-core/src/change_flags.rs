//! The flags of changed-block tracking (`changes.rs`): a bit per region,
//! in pages of 4,096 regions (64 words, 512 bytes) made when a region on
//! them is first flagged, so that their RAM follows the regions written
//! since the mark (plus 8 bytes a page slot), not the device's size; and
//! the pages as bytes, each its index then its words, for the tracking
//! file and the snapshot socket.

use crate::codec::Encoder;

/// log2 of the chunks in a region.
pub const REGION_SHIFT: u32 = 6;
/// log2 of the regions on a page.
const PAGE_SHIFT: u32 = 12;
const PAGE_WORDS: usize = 1 << (PAGE_SHIFT - 6);
/// A page as it is saved or sent: its index, then its words.
pub(crate) const PAGE_BYTES: usize = 8 + PAGE_WORDS * 8;

type Page = Box<[u64; PAGE_WORDS]>;

/// The flags, a bit per region, in pages made as regions are flagged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    pages: Vec<Option<Page>>,
    /// Regions flagged: `stats` asks under the metadata mutex, where a
    /// count of every page would take as long as the pages are many.
    flagged: u64,
}

/// The page slots of a device of `logical_chunks`.
pub(crate) fn pages_for(logical_chunks: u64) -> u64 {
    logical_chunks.div_ceil(1 << (REGION_SHIFT + PAGE_SHIFT))
}

impl Flags {
    pub(crate) fn for_chunks(logical_chunks: u64) -> Flags {
        Flags {
            pages: vec![None; pages_for(logical_chunks) as usize],
            flagged: 0,
        }
    }

    pub(crate) fn set(&mut self, region: u64) {
        let Some(page) = self.pages.get_mut((region >> PAGE_SHIFT) as usize) else {
            return;
        };
        let page = page.get_or_insert_with(|| Box::new([0; PAGE_WORDS]));
        let i = region & ((1 << PAGE_SHIFT) - 1);
        let (word, bit) = (&mut page[(i / 64) as usize], 1 << (i % 64));
        self.flagged += u64::from(*word & bit == 0);
        *word |= bit;
    }

    /// Whether any region of `first..=last` is flagged; a region past
    /// the pages counts as flagged.
    pub(crate) fn any(&self, first: u64, last: u64) -> bool {
        let mut r = first;
        while r <= last {
            let Some(page) = self.pages.get((r >> PAGE_SHIFT) as usize) else {
                return true;
            };
            let page_end = (r | ((1 << PAGE_SHIFT) - 1)).min(last);
            if let Some(page) = page {
                let (mut i, end) = (
                    r & ((1 << PAGE_SHIFT) - 1),
                    page_end & ((1 << PAGE_SHIFT) - 1),
                );
                while i <= end {
                    // The bits of word i/64 from i to the word's end or `end`.
                    let hi = (i | 63).min(end);
                    let width = hi - i + 1;
                    let mask = if width == 64 {
                        u64::MAX
                    } else {
                        ((1u64 << width) - 1) << (i % 64)
                    };
                    if page[(i / 64) as usize] & mask != 0 {
                        return true;
                    }
                    i = hi + 1;
                }
            }
            match page_end.checked_add(1) {
                Some(next) => r = next,
                None => break,
            }
        }
        false
    }

    pub(crate) fn count(&self) -> u64 {
        self.flagged
    }

    /// The pages made, each as its index and words (`PAGE_BYTES`).
    pub(crate) fn page_bytes(&self, e: &mut Encoder) {
        for (k, page) in self.pages.iter().enumerate() {
            if let Some(page) = page {
                e.u64(k as u64);
                for w in page.iter() {
                    e.u64(*w);
                }
            }
        }
    }

    pub(crate) fn pages_made(&self) -> u64 {
        self.pages.iter().flatten().count() as u64
    }

    /// `page_bytes` back, for a device of `logical_chunks`: pages in
    /// ascending order, each inside the device, once.
    pub(crate) fn from_page_bytes(
        bytes: &[u8],
        logical_chunks: u64,
    ) -> std::result::Result<Flags, String> {
        if bytes.len() % PAGE_BYTES != 0 {
            return Err(format!(
                "{} bytes are not whole pages of {PAGE_BYTES}",
                bytes.len()
            ));
        }
        let mut flags = Flags::for_chunks(logical_chunks);
        let mut last = None;
        for chunk in bytes.chunks_exact(PAGE_BYTES) {
            let k = u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes"));
            if last.is_some_and(|l| l >= k) {
                return Err(format!("page {k} is out of order or repeated"));
            }
            let slot = flags.pages.get_mut(k as usize).ok_or_else(|| {
                format!(
                    "page {k} is past the device's {} pages",
                    pages_for(logical_chunks)
                )
            })?;
            let mut page = Box::new([0; PAGE_WORDS]);
            for (w, b) in page.iter_mut().zip(chunk[8..].chunks_exact(8)) {
                *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            flags.flagged += page.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
            *slot = Some(page);
            last = Some(k);
        }
        Ok(flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    const REGIONS_PER_PAGE: u64 = 1 << PAGE_SHIFT;

    /// Chunks of a device of `regions` regions.
    fn chunks(regions: u64) -> u64 {
        regions << REGION_SHIFT
    }

    #[test]
    fn any_agrees_with_a_plain_bit_per_region_across_pages() {
        let mut rng = StdRng::seed_from_u64(7);
        // Three pages and a part: ranges cross page and word boundaries.
        let regions = 3 * REGIONS_PER_PAGE + 100;
        for _ in 0..20 {
            let mut flags = Flags::for_chunks(chunks(regions));
            let mut plain = vec![false; regions as usize];
            for _ in 0..rng.random_range(0..40) {
                let r = rng.random_range(0..regions);
                flags.set(r);
                plain[r as usize] = true;
            }
            for _ in 0..2_000 {
                let first = rng.random_range(0..regions);
                let last = rng.random_range(first..regions.min(first + 2 * REGIONS_PER_PAGE));
                let want = plain[first as usize..=last as usize].iter().any(|&b| b);
                assert_eq!(flags.any(first, last), want, "{first}..={last}");
            }
            assert_eq!(flags.count(), plain.iter().filter(|&&b| b).count() as u64);
        }
    }

    #[test]
    fn a_region_past_the_pages_counts_as_flagged_and_setting_it_is_ignored() {
        let mut flags = Flags::for_chunks(chunks(10));
        assert!(!flags.any(0, REGIONS_PER_PAGE - 1));
        assert!(flags.any(REGIONS_PER_PAGE - 1, REGIONS_PER_PAGE));
        assert!(flags.any(u64::MAX, u64::MAX));
        flags.set(5 * REGIONS_PER_PAGE);
        assert_eq!((flags.count(), flags.pages_made()), (0, 0));
    }

    #[test]
    fn pages_are_made_only_where_regions_are_flagged() {
        // 64 TiB of 4 KiB chunks: 65,536 page slots, 512 KiB of them.
        let mut flags = Flags::for_chunks(1 << 34);
        assert_eq!(flags.pages.len(), 65_536);
        assert_eq!(flags.pages_made(), 0);
        for r in [0, 1, 63, 64, REGIONS_PER_PAGE * 9 + 5] {
            flags.set(r);
        }
        assert_eq!((flags.pages_made(), flags.count()), (2, 5));
    }

    fn bytes_of(flags: &Flags) -> Vec<u8> {
        let mut e = Encoder::with_capacity(0);
        flags.page_bytes(&mut e);
        e.buf
    }

    #[test]
    fn page_bytes_round_trip_and_bad_ones_are_refused_by_name() {
        let c = chunks(4 * REGIONS_PER_PAGE);
        let mut flags = Flags::for_chunks(c);
        for r in [3, REGIONS_PER_PAGE * 2 + 70, REGIONS_PER_PAGE * 3] {
            flags.set(r);
        }
        let bytes = bytes_of(&flags);
        assert_eq!(bytes.len(), 3 * PAGE_BYTES);
        assert_eq!(Flags::from_page_bytes(&bytes, c).unwrap(), flags);
        assert_eq!(
            Flags::from_page_bytes(&[], c).unwrap(),
            Flags::for_chunks(c)
        );
        // Cut short; a page past the device; pages out of order; repeated.
        let err = |b: &[u8], c| Flags::from_page_bytes(b, c).unwrap_err();
        assert!(err(&bytes[..bytes.len() - 1], c).contains("whole pages"));
        assert!(err(&bytes, chunks(3 * REGIONS_PER_PAGE)).contains("past the device"));
        let (first, rest) = bytes.split_at(PAGE_BYTES);
        let swapped = [rest, first].concat();
        assert!(err(&swapped, c).contains("out of order"));
        let twice = [first, first].concat();
        assert!(err(&twice, c).contains("repeated"));
    }
}
