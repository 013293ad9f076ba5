//! Helpers the index tests share (a directory, so Cargo does not build it
//! as a test of its own).

use dedup_common::compress::Compression;
use dedup_common::fingerprint::Fingerprint;
use dedup_store::{Entry, Location};

/// A catalog of `fps` as uncompressed `segment_len`-byte segments laid back
/// to back after the 32-byte header, as a prefetch would load it.
pub fn catalog(fps: &[Fingerprint], segment_len: u32) -> Vec<Entry> {
    fps.iter()
        .enumerate()
        .map(|(i, f)| Entry {
            fingerprint: *f,
            location: Location {
                offset: 32 + u64::from(segment_len) * i as u64,
                stored_len: segment_len,
                raw_len: segment_len,
                compression: Compression::None,
                stored_crc: 0,
                frame_at: 0,
                frame_len: segment_len,
            },
        })
        .collect()
}
