//! The index checkpoint (§3.2.3: the index is checkpointed so a restart
//! does not begin with an empty, useless index): the hooks and R, so a
//! restart need not read every catalog. FORMATS.md gives the bytes;
//! `checkpoint_objects.rs` keeps them in the repository.
//!
//! The loader checks everything and names what is wrong; a checkpoint it
//! refuses is not a disaster, since `Index::rebuild` gets the same hooks
//! from the catalogs.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::format::crc;

use super::hooks::{Hook, HookTable, MAX_CONTAINER};
use super::sampling::SamplingRate;
use super::{Index, IndexConfig};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"DDUPHOOK";
/// Version 2 keeps a hook's 64-bit fingerprint prefix, grouped by
/// container (version 1 kept 41 bytes a hook; it is refused, and the
/// index is rebuilt from the catalogs as for any checkpoint refused).
pub const CHECKPOINT_VERSION: u32 = 2;
pub const CHECKPOINT_HEADER_LEN: usize = 32;
/// A group's container id and hook count.
pub const GROUP_HEADER_LEN: usize = 12;
pub const PREFIX_LEN: usize = 8;

/// What errors call a checkpoint.
const WHAT: &str = "index checkpoint";

impl Index {
    /// The hooks and R as bytes: header (magic, version, log2 of the
    /// sampling period, fingerprints stored, hook count), then a group per
    /// container in id order (id, hook count, the pinned hook's prefix,
    /// the other prefixes ascending), then crc32c of everything before it.
    pub fn checkpoint(&self) -> Vec<u8> {
        let hooks = self.hooks();
        let mut groups: BTreeMap<u64, (Option<u64>, Vec<u64>)> = BTreeMap::new();
        for (prefix, hook) in hooks.iter() {
            let g = groups.entry(hook.container).or_default();
            if hook.pinned {
                g.0 = Some(prefix);
            } else {
                g.1.push(prefix);
            }
        }
        let mut b = Vec::with_capacity(
            CHECKPOINT_HEADER_LEN + groups.len() * GROUP_HEADER_LEN + hooks.len() * PREFIX_LEN + 4,
        );
        b.extend_from_slice(&CHECKPOINT_MAGIC);
        b.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        b.extend_from_slice(&hooks.rate().log2_period().to_le_bytes());
        b.extend_from_slice(&hooks.fingerprints().to_le_bytes());
        let count_at = b.len();
        b.extend_from_slice(&0u64.to_le_bytes());
        let mut count = 0u64;
        for (container, (pinned, mut others)) in groups {
            // The table pins one hook of every container it hooks; a group
            // without one would be refused, so it is left out (the index
            // is advice: its hooks cost dedup, never data).
            let Some(pinned) = pinned else { continue };
            others.sort_unstable();
            let n = 1 + others.len();
            b.extend_from_slice(&container.to_le_bytes());
            b.extend_from_slice(&(n as u32).to_le_bytes());
            b.extend_from_slice(&pinned.to_le_bytes());
            for p in others {
                b.extend_from_slice(&p.to_le_bytes());
            }
            count += n as u64;
        }
        b[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
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
        if count > fingerprints {
            return Err(corrupt(format!(
                "{count} hooks for only {fingerprints} fingerprints stored"
            )));
        }
        let mut hooks = HookTable::with_rate(config.max_hooks(), rate);
        hooks.set_fingerprints(fingerprints);
        let mut rest = &body[CHECKPOINT_HEADER_LEN..];
        let mut read = 0u64;
        let mut previous: Option<u64> = None;
        while !rest.is_empty() {
            if rest.len() < GROUP_HEADER_LEN {
                return Err(corrupt(format!(
                    "{} bytes after hook {read}, too few for a container's group",
                    rest.len()
                )));
            }
            let container = u64_at(rest, 0);
            let n = u32_at(rest, 8) as usize;
            rest = &rest[GROUP_HEADER_LEN..];
            if container > MAX_CONTAINER {
                return Err(corrupt(format!(
                    "container {container:#x} is over the highest id {MAX_CONTAINER:#x}"
                )));
            }
            if previous.is_some_and(|p| p >= container) {
                return Err(corrupt(format!(
                    "container {container:#x} is out of order or repeated (groups are sorted by container)"
                )));
            }
            if n == 0 {
                return Err(corrupt(format!(
                    "container {container:#x} has no pinned hook"
                )));
            }
            if n.checked_mul(PREFIX_LEN).is_none_or(|len| len > rest.len()) {
                return Err(corrupt(format!(
                    "container {container:#x} has {n} hooks, more than the {} bytes left hold",
                    rest.len()
                )));
            }
            let mut last: Option<u64> = None;
            for (i, p) in rest[..n * PREFIX_LEN].chunks_exact(PREFIX_LEN).enumerate() {
                let prefix = u64_at(p, 0);
                let pinned = i == 0;
                if !pinned {
                    if last.is_some_and(|l| l >= prefix) {
                        return Err(corrupt(format!(
                            "hook {i} of container {container:#x} is out of order or repeated"
                        )));
                    }
                    if !rate.samples_prefix(prefix) {
                        return Err(corrupt(format!(
                            "hook {i} of container {container:#x} is neither pinned nor sampled at R = 1/{}",
                            rate.period()
                        )));
                    }
                    last = Some(prefix);
                }
                if !hooks.restore(prefix, Hook { container, pinned }) {
                    return Err(corrupt(format!(
                        "hook {i} of container {container:#x} repeats a prefix hooked before"
                    )));
                }
            }
            rest = &rest[n * PREFIX_LEN..];
            read += n as u64;
            previous = Some(container);
        }
        if read != count {
            return Err(corrupt(format!(
                "the header counts {count} hooks, the groups hold {read}"
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
