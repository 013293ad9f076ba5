//! Large zero-filled tables, allocated fallibly and lazily: the OS hands out
//! zero pages on first touch, so a big, mostly empty LBN map costs nothing
//! up front, and a size the machine cannot back is an error, not an abort.

use std::alloc::{alloc_zeroed, Layout};

use crate::error::{Error, Result};

/// Types for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for plain data whose every field is valid when zeroed.
pub unsafe trait ZeroIsValid: Copy {}

// SAFETY: integers are valid for every bit pattern, zero included.
unsafe impl ZeroIsValid for u64 {}
// SAFETY: as above.
unsafe impl ZeroIsValid for u32 {}

/// Tables from this size on ask for transparent huge pages.
const HUGE_PAGE_TABLE: usize = 8 << 20;

/// A vector of `n` zeroed `T`s, or `Error::OutOfMemory` naming `what`.
pub fn zeroed_vec<T: ZeroIsValid>(n: usize, what: &str) -> Result<Vec<T>> {
    let bytes = (n as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    let too_big = || Error::OutOfMemory {
        what: what.to_string(),
        bytes,
    };
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Ok(Vec::new());
    }
    let layout = Layout::array::<T>(n).map_err(|_| too_big())?;
    // SAFETY: the layout has a non-zero size; the memory comes from the global
    // allocator with exactly the layout `Vec<T>` uses for capacity `n`, and
    // zeroed bytes are valid `T`s (`ZeroIsValid`), so all `n` are initialised.
    unsafe {
        let ptr = alloc_zeroed(layout) as *mut T;
        if ptr.is_null() {
            return Err(too_big());
        }
        if layout.size() >= HUGE_PAGE_TABLE {
            // Hash index probes land on random pages: with 4 KiB pages each
            // new chunk costs a page fault (two, after a read of the zero
            // page) and a TLB miss. Huge pages cut both; a hint only.
            // madvise wants page-aligned ranges; the allocator's block
            // starts past a header.
            let page = libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize;
            let start = (ptr as usize).next_multiple_of(page);
            let end = (ptr as usize + layout.size()) / page * page;
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
        Ok(Vec::from_raw_parts(ptr, n, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_zeroed_memory_and_refuses_impossible_sizes() {
        let v: Vec<u64> = zeroed_vec(1000, "test").unwrap();
        assert!(v.iter().all(|&x| x == 0));
        assert_eq!(v.len(), 1000);
        let err = zeroed_vec::<u64>(usize::MAX / 4, "a huge table").unwrap_err();
        assert!(err.to_string().contains("a huge table"), "{err}");
    }
}
