//! Every object of a repository relies on create-only puts (an object is
//! never overwritten; of two writers creating one name, one wins): the
//! many-writers protocol (`epochs/`) above all. A service that ignores
//! `If-None-Match: *` is refused before anything is written.

use std::sync::Arc;

use crate::error::repo::RepoResult;
use crate::error::Error;
use crate::objects::ObjectStore;
use crate::repo_location::RepoLocation;

/// Two puts of one fresh name under `probes/`, then its delete: the second
/// must be refused.
pub(crate) fn probe_create_only(
    location: &RepoLocation,
    store: &Arc<dyn ObjectStore>,
) -> RepoResult<()> {
    let token: [u8; 16] = crate::crypto::random::random_bytes()?;
    let token: String = token.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("probes/{token}");
    store.put(&name, b"first")?;
    let second = store.put(&name, b"second");
    match store.delete(&name) {
        Ok(()) | Err(Error::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    match second {
        Err(Error::Exists { .. }) => Ok(()),
        Ok(()) => Err(Error::InvalidArgument(format!(
            "{location}: the service overwrote an object that a create-only put (If-None-Match: *) should have left alone; dedup keeps repositories only where objects are never overwritten (S3, SeaweedFS, MinIO and Ceph honour it; check the service's version and AWS_CONDITIONAL_PUT)"
        ))
        .into()),
        Err(e) => Err(e.into()),
    }
}
