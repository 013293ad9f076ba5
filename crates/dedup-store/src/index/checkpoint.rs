//! The index checkpoint (§3.2.3: the index is checkpointed so a restart
//! does not begin with an empty, useless index): the hooks and R, so a
//! restart need not read every catalog. FORMATS.md gives the bytes.
//!
//! The loader checks everything and names what is wrong; a checkpoint it
//! refuses is not a disaster, since `Index::rebuild` gets the same hooks
//! from the catalogs.

use std::collections::HashSet;

use dedup_core::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

use crate::error::{Error, Result};
use crate::format::crc;

use super::hooks::{Hook, HookTable};
use super::sampling::SamplingRate;
use super::{Index, IndexConfig};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"DDUPHOOK";
pub const CHECKPOINT_VERSION: u32 = 1;
pub const CHECKPOINT_HEADER_LEN: usize = 32;
pub const HOOK_RECORD_LEN: usize = 41;
const PINNED: u8 = 1;

/// What errors call a checkpoint.
const WHAT: &str = "index checkpoint";

impl Index {
    /// The hooks and R as bytes: header (magic, version, log2 of the
    /// sampling period, fingerprints stored, hook count), the hooks sorted
    /// by fingerprint, then crc32c of everything before it.
    pub fn checkpoint(&self) -> Vec<u8> {
        let hooks = self.hooks();
        let mut sorted: Vec<_> = hooks.iter().collect();
        sorted.sort_unstable_by_key(|(fp, _)| **fp);
        let mut b = Vec::with_capacity(CHECKPOINT_HEADER_LEN + sorted.len() * HOOK_RECORD_LEN + 4);
        b.extend_from_slice(&CHECKPOINT_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&hooks.rate().log2_period().to_le_bytes());
        b.extend_from_slice(&hooks.fingerprints().to_le_bytes());
        b.extend_from_slice(&(sorted.len() as u64).to_le_bytes());
        for (fp, hook) in sorted {
            b.extend_from_slice(&fp.0);
            b.extend_from_slice(&hook.container.to_le_bytes());
            b.push(if hook.pinned { PINNED } else { 0 });
        }
        let sum = crc(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    /// An index from a checkpoint, with an empty cache. If `config` has a
    /// smaller budget than the checkpointed index, R is halved to fit.
    pub fn from_checkpoint(bytes: &[u8], config: IndexConfig) -> Result<Index> {
        let corrupt = |detail: String| Error::corrupt(WHAT, detail);
        let min = CHECKPOINT_HEADER_LEN + 4;
        if bytes.len() < min {
            return Err(corrupt(format!(
                "it is {} bytes, shorter than a header and checksum ({min})",
                bytes.len()
            )));
        }
        if bytes[..8] != CHECKPOINT_MAGIC {
            return Err(corrupt(format!("bad magic {:02x?}", &bytes[..8])));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(sum.try_into().expect("4 bytes"));
        let computed = crc(body);
        if stored != computed {
            return Err(corrupt(format!(
                "checksum {stored:#010x} does not match its bytes ({computed:#010x})"
            )));
        }
        let version = u32_at(body, 8);
        if version != CHECKPOINT_VERSION {
            return Err(corrupt(format!(
                "version {version}; this build reads version {CHECKPOINT_VERSION}"
            )));
        }
        let log2 = u32_at(body, 12);
        let rate = SamplingRate::from_log2_period(log2)
            .ok_or_else(|| corrupt(format!("sampling period 2^{log2} is over 2^63")))?;
        let fingerprints = u64_at(body, 16);
        let count = u64_at(body, 24);
        let records = &body[CHECKPOINT_HEADER_LEN..];
        if count.checked_mul(HOOK_RECORD_LEN as u64) != Some(records.len() as u64) {
            return Err(corrupt(format!(
                "{count} hooks need {HOOK_RECORD_LEN} bytes each, but {} bytes follow the header",
                records.len()
            )));
        }
        if count > fingerprints {
            return Err(corrupt(format!(
                "{count} hooks for only {fingerprints} fingerprints stored"
            )));
        }
        let mut hooks = HookTable::with_rate(config.max_hooks(), rate);
        hooks.set_fingerprints(fingerprints);
        let mut containers = HashSet::new();
        let mut pinned_containers = HashSet::new();
        let mut previous: Option<Fingerprint> = None;
        for (i, r) in records.chunks_exact(HOOK_RECORD_LEN).enumerate() {
            let mut fp = [0u8; FINGERPRINT_BYTES];
            fp.copy_from_slice(&r[..FINGERPRINT_BYTES]);
            let fp = Fingerprint(fp);
            let container = u64_at(r, 32);
            let pinned = match r[40] {
                0 => false,
                PINNED => true,
                f => return Err(corrupt(format!("hook {i} has unknown flags {f:#04x}"))),
            };
            if previous.is_some_and(|p| p >= fp) {
                return Err(corrupt(format!(
                    "hook {i} is out of order or repeated (hooks are sorted by fingerprint)"
                )));
            }
            if !pinned && !rate.samples(&fp) {
                return Err(corrupt(format!(
                    "hook {i} is neither pinned nor sampled at R = 1/{}",
                    rate.period()
                )));
            }
            if pinned && !pinned_containers.insert(container) {
                return Err(corrupt(format!(
                    "hook {i} is a second pinned hook of container {container:#x}"
                )));
            }
            containers.insert(container);
            previous = Some(fp);
            hooks.restore(fp, Hook { container, pinned });
        }
        if let Some(c) = containers.difference(&pinned_containers).next() {
            return Err(corrupt(format!(
                "container {c:#x} has hooks but no pinned hook"
            )));
        }
        hooks.lower_to(config.max_rate);
        hooks.fit_budget();
        Ok(Index::with_hooks(config, hooks))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
