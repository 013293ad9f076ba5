//! Container ids without a counter: a writing process reserves a range
//! of `RANGE` ids by creating `ids/<start>` (create-only: of two processes
//! that pick the same start, one gets it, and the other tries the next),
//! then hands ids out from it. Reservations are never deleted, so an id is
//! never handed out twice, even after GC deleted its container.

use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::objects::ObjectStore;

pub const IDS_PREFIX: &str = "ids/";

/// Ids per reservation: at the default 16 MiB container target, 4 GiB of
/// new data per request.
pub const RANGE: u64 = 256;

fn name(start: u64) -> String {
    format!("{IDS_PREFIX}{start:016x}")
}

/// The start of each reservation listed from `from` up (as `name` makes
/// them; anything else under the prefix is not ours and is skipped).
fn starts_from(store: &dyn ObjectStore, from: u64) -> RepoResult<Vec<u64>> {
    let names = match from.checked_sub(1) {
        None => store.list(IDS_PREFIX)?,
        Some(before) => store.list_after(IDS_PREFIX, &name(before))?,
    };
    Ok(names
        .iter()
        .filter_map(|n| {
            let hex = n.strip_prefix(IDS_PREFIX)?;
            (hex.len() == 16)
                .then(|| u64::from_str_radix(hex, 16).ok())
                .flatten()
        })
        .collect())
}

/// Reserve a range of `RANGE` ids, none below `floor` (ids a container,
/// checkpoint or earlier reservation may hold); its start. `who` is
/// written into the reservation, for a reader of the bucket.
pub(crate) fn reserve(store: &dyn ObjectStore, floor: u64, who: &[u8]) -> RepoResult<u64> {
    let aligned = floor.div_ceil(RANGE) * RANGE;
    let mut start = starts_from(store, aligned)?
        .into_iter()
        .map(|s| s.saturating_add(RANGE))
        .fold(aligned, u64::max);
    loop {
        if start.saturating_add(RANGE) > crate::index::hooks::MAX_CONTAINER {
            return Err(Error::InvalidArgument(format!(
                "the repository has handed out every container id up to {start}; no more can be reserved"
            ))
            .into());
        }
        match store.put(&name(start), who) {
            Ok(()) => return Ok(start),
            // Another process took it between the listing and the put.
            Err(Error::Exists { .. }) => start += RANGE,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalDir;

    #[test]
    fn reservations_never_overlap_and_stay_above_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDir::open(dir.path()).unwrap();
        let a = reserve(&store, 0, b"a").unwrap();
        let b = reserve(&store, 0, b"b").unwrap();
        assert_eq!((a, b), (0, RANGE));
        let c = reserve(&store, 1000, b"c").unwrap();
        assert_eq!(c, 1024, "aligned up from the floor");
        // A range taken by another process after our listing: the next.
        store.put(&name(1024 + RANGE), b"x").unwrap();
        let d = reserve(&store, 1024 + 1, b"d").unwrap();
        assert_eq!(d, 1024 + 2 * RANGE);
        // Strangers under the prefix are skipped.
        store.put("ids/junk", b"x").unwrap();
        assert_eq!(reserve(&store, 0, b"e").unwrap(), 1024 + 3 * RANGE);
    }
}
