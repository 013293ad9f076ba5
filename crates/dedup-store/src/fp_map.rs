//! [`FpMap`]: the hash map keyed by fingerprint that a backup session and
//! the table of containers not yet durable (`inflight.rs`) both keep.

use std::collections::HashMap;

use dedup_common::fingerprint::Fingerprint;

/// Maps keyed by fingerprint: already uniform bytes, so a fast hash is
/// as good as SipHash here, and these are asked once a segment.
pub(crate) type FpMap<V> = HashMap<Fingerprint, V, foldhash::fast::FixedState>;
