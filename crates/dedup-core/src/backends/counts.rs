//! Reference-count arithmetic and address checks every store shares
//! (Dmdedup §2.4): adding a
//! reference to a free PBN, or dropping one from it, means the metadata is
//! damaged, and a count never wraps. `table` names the store's count table
//! in the error (formatted only then), so `dedup check` and the user know where to look.

use std::fmt::Display;

use crate::config::{Lbn, Pbn};
use crate::error::{Error, Result};

/// `count + 1` for PBN `pbn` whose count is `count`.
pub fn incremented(table: impl Display, pbn: Pbn, count: u32) -> Result<u32> {
    if count == 0 {
        return Err(Error::corrupt(
            table.to_string(),
            format!("reference added to free PBN {pbn}"),
        ));
    }
    count
        .checked_add(1)
        .ok_or_else(|| Error::corrupt(table.to_string(), format!("PBN {pbn} count overflows")))
}

/// `count - 1` for PBN `pbn` whose count is `count`.
pub fn decremented(table: impl Display, pbn: Pbn, count: u32) -> Result<u32> {
    if count == 0 {
        return Err(Error::corrupt(
            table.to_string(),
            format!("reference dropped from free PBN {pbn} (count would underflow)"),
        ));
    }
    Ok(count - 1)
}

/// `lbn` as an index, if it is on a device of `logical_chunks` chunks (the
/// engine checks request ranges, so this only catches its own bugs).
pub fn lbn_index(lbn: Lbn, logical_chunks: u64) -> Result<usize> {
    if lbn < logical_chunks {
        Ok(lbn as usize)
    } else {
        Err(Error::InvalidArgument(format!(
            "LBN {lbn} is beyond the device ({logical_chunks} chunks)"
        )))
    }
}

/// `pbn` as an index, if the store's `table` covers it (`space`
/// addresses): one beyond means damaged metadata named it.
pub fn pbn_index(table: impl Display, pbn: Pbn, space: u64) -> Result<usize> {
    if pbn < space {
        Ok(pbn as usize)
    } else {
        Err(Error::corrupt(
            table.to_string(),
            format!("PBN {pbn} is beyond the data device ({space} chunks)"),
        ))
    }
}
