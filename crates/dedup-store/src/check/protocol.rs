//! The many-writers protocol's objects (`epochs/`): epoch records, pins
//! and id reservations. None is needed to restore a backup, so a damaged
//! one costs no backup; it is reported so that it can be removed. A
//! damaged epoch record means nothing it condemned is ever deleted, a
//! damaged pin withholds every deletion until it expires, and a damaged
//! reservation (read only to check it) means nothing at all.

use crate::check::CheckReport;
use crate::epochs::ids::IDS_PREFIX;
use crate::epochs::{EpochRecord, PinRecord, EPOCH_PREFIX, PINS_PREFIX};
use crate::error::repo::{RepoError, RepoResult};
use crate::objects::ObjectStore;

/// Checks one object's bytes, named.
type Decode<'a> = &'a dyn Fn(&str, &[u8]) -> RepoResult<()>;

pub(super) fn check_protocol(store: &dyn ObjectStore, report: &mut CheckReport) -> RepoResult<()> {
    let epoch = |o: &str, b: &[u8]| EpochRecord::decode(o, b).map(drop);
    let pin = |o: &str, b: &[u8]| PinRecord::decode(o, b).map(drop);
    let any = |_: &str, _: &[u8]| Ok(());
    let kinds: [(&str, Decode); 3] = [
        (EPOCH_PREFIX, &epoch),
        (PINS_PREFIX, &pin),
        (IDS_PREFIX, &any),
    ];
    for (prefix, decode) in kinds {
        for object in store.list(prefix)? {
            let result = store
                .get(&object)
                .map_err(RepoError::from)
                .and_then(|b| decode(&object, &b));
            if let Err(e) = result {
                report.problem(&object, super::detail(&e));
            }
        }
    }
    Ok(())
}
