//! The set of distinct chunks seen, per algorithm: 128 bits of each
//! chunk's fingerprint mapped to the order it was first stored in (for the
//! reconstruction estimate). Sharded so that workers rarely wait.
//!
//! Memory: a 16-byte key and an 8-byte value (32 bytes with u128's
//! alignment) and a control byte in a hash table between 7/16 and 7/8
//! full: measured at about 66 bytes of resident memory per distinct chunk
//! (`BYTES_PER_ENTRY`). The analyzer's memory grows with distinct chunks,
//! not with data size.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const SHARDS: usize = 64;

/// Memory per distinct chunk, for the report (measured: resident memory
/// grown by 34.6 MB for 524,288 distinct chunks).
pub const BYTES_PER_ENTRY: u64 = 66;

/// The keys are cryptographic fingerprints, already uniform: the table
/// hashes a key by its low 64 bits instead of running SipHash over it
/// (which cost as much as a tenth of hashing the chunk).
#[derive(Default)]
struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type Table = HashMap<u128, u64, BuildHasherDefault<FingerprintHasher>>;

pub struct Index {
    shards: Vec<Mutex<Table>>,
    next: AtomicU64,
}

impl Default for Index {
    fn default() -> Self {
        Index {
            shards: (0..SHARDS).map(|_| Mutex::new(Table::default())).collect(),
            next: AtomicU64::new(0),
        }
    }
}

impl Index {
    /// Record a chunk; `(first time seen, where it is stored)`.
    pub fn insert(&self, key: u128) -> (bool, u64) {
        // Shard by high bits; the table uses the low ones.
        let shard = &self.shards[((key >> 64) as usize) % SHARDS];
        let mut m = shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&at) = m.get(&key) {
            return (false, at);
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed);
        m.insert(key, at);
        (true, at)
    }

    pub fn len(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
