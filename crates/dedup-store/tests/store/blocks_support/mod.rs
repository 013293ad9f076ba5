//! Shared by the tests of backups and restores of block devices by
//! fingerprint (`backup_blocks.rs`, `restore_blocks.rs`): the block size,
//! the repositories they use, and block contents that repeat.

use dedup_store::crypto::KdfParams;
use dedup_store::{RepoOptions, Segmenting};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

pub const BS: usize = 4096;

/// A repository of `segmenting`, with small containers (many of them).
pub fn options(segmenting: Segmenting) -> RepoOptions {
    RepoOptions {
        segmenting,
        container_target: 256 << 10,
        ..RepoOptions::default()
    }
}

/// `options` of an encrypted repository (as every `s3://` one is by
/// default), its fingerprints keyed over the plain digest; the caller
/// gives the passphrase (`for_this_thread`).
#[allow(dead_code)] // not every test file makes one
pub fn encrypted(segmenting: Segmenting) -> RepoOptions {
    RepoOptions {
        encryption: Some(KdfParams::FOR_TESTS),
        ..options(segmenting)
    }
}

/// Random contents from a pool (so blocks repeat), never all zeros.
pub fn content(rng: &mut StdRng, pool: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    StdRng::seed_from_u64(rng.random_range(0..pool)).fill_bytes(&mut b);
    b[0] |= 1;
    b
}
