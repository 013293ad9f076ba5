//! The one source of random bytes in the store: repository uuids, recipe
//! and session nonces, writer-lock tokens, key ids, salts, and challenge
//! nonces of the server's key proofs. The kernel's generator (getrandom),
//! never a seeded one, since several of these must not repeat across
//! machines and restarts.

use crate::error::repo::{RepoError, RepoResult};

/// `N` random bytes from the kernel.
pub(crate) fn random_bytes<const N: usize>() -> RepoResult<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| RepoError::Io {
        context: "drawing random bytes from the kernel".into(),
        cause: e.into(),
    })?;
    Ok(b)
}
