//! Entry points for fuzzers (the cargo-fuzz targets in `fuzz/`, and the
//! seeded mutation test that runs them in CI). Each takes arbitrary bytes
//! and must never panic, whatever the bytes are.

use std::path::Path;
use std::sync::Arc;

use crate::backends::OpenOptions;
use crate::blockfile::sim::SimDisk;
use crate::blockfile::{BlockFile, MemBlockFile};
use crate::engine::Device;
use crate::superblock::{encode_data_header, Superblock};

/// Largest data device a fuzz input may ask for.
const MAX_DATA: u64 = 64 << 20;

/// Open `bytes` as a metadata device (with a data device made to match its
/// superblock, when it has a readable one), then check it and read from it.
pub fn open_metadata(bytes: &[u8]) {
    let meta = Arc::new(SimDisk::from_image(
        bytes.to_vec(),
        "fuzz-meta",
        Arc::default(),
    ));
    let Ok(sb) = Superblock::read(meta.as_ref(), Path::new("fuzz-meta")) else {
        return;
    };
    let cfg = sb.config;
    if cfg.data_device_len() > MAX_DATA || cfg.logical_size > MAX_DATA * 16 {
        return;
    }
    let data = Arc::new(MemBlockFile::new(cfg.data_device_len(), "fuzz-data"));
    if data.write_at(&encode_data_header(&cfg), 0).is_err() {
        return;
    }
    let aux = std::env::temp_dir().join(format!("dedup-fuzz-{}.lsm", std::process::id()));
    let opts = OpenOptions {
        writable: true,
        accept_unclean: true,
        aux_dir: Some(aux),
        ..Default::default()
    };
    let Ok(dev) = Device::open(
        Box::new(data) as Box<dyn BlockFile>,
        Box::new(meta),
        &opts,
        None,
    ) else {
        return;
    };
    let _ = dev.check(true);
    let mut buf = vec![0u8; 3 * cfg.chunk_size as usize];
    let _ = dev.read(0, &mut buf);
    let _ = dev.write(0, &buf, false);
    let _ = dev.gc();
    let _ = dev.close();
}

/// Open `bytes` as each of the thin backend's on-disk blocks (a C-block, a
/// metadata block, a zone record): refused or decoded, never a panic; a
/// decoded C-block gives a whole chunk, and the entries fit in the block.
/// The bytes are tried as they are and with their checksum made right, so
/// the decoder's bounds checks are reached too (a fuzzer rarely forges a
/// crc32c).
/// Open arbitrary bytes as a packed block (issue 7's format): every slot
/// read either fails or returns bytes inside the block's fragment area
/// that match their checksum; never a panic.
pub fn packed_block(bytes: &[u8]) {
    let check = |b: &[u8]| {
        if let Ok(slots) = crate::pack::slots(b) {
            for (i, &(off, len, _)) in slots.iter().enumerate() {
                assert!(off + len <= b.len());
                if let Ok(f) = crate::pack::fragment(b, i) {
                    assert_eq!(f.len(), len);
                }
            }
        }
    };
    check(bytes);
    if bytes.len() >= 16 {
        // A valid table checksum over damaged contents.
        let mut b = bytes.to_vec();
        let n = (b[5] as usize).min(crate::pack::MAX_SLOTS);
        let table = (8 + 8 * n).min(b.len() - 4);
        let t = b.len() - 4;
        let crc = crc32c::crc32c(&b[..table]);
        b[t..].copy_from_slice(&crc.to_le_bytes());
        check(&b);
    }
}

pub fn thin_blocks(bytes: &[u8]) {
    use crate::placement::thin::{cblock, window, zones};
    let check = |b: &[u8]| {
        if let Ok((chunk, entries)) = cblock::open(b) {
            assert_eq!(chunk.len(), b.len());
            assert!(entries.len() * cblock::ENTRY_BYTES < b.len());
        }
        if let Ok(entries) = window::open_mblock(b) {
            assert!(entries.len() * cblock::ENTRY_BYTES < b.len());
        }
        // A record of a 1024-block zone, the last one of a device that
        // ends 100 blocks into it.
        let mut z = zones::Zones::new(1024 + 100, 1024);
        let _ = z.decode(1, b);
    };
    check(bytes);
    if bytes.len() >= 16 {
        let mut resealed = bytes.to_vec();
        crate::codec::seal(&mut resealed);
        check(&resealed);
    }
}

/// Parse arbitrary bytes as a snapshot session's `map` reply (the control
/// socket's wire data, `control::snapshot`): an error, or exactly the
/// blocks asked for, each a state the encoding names; never a panic.
pub fn snapshot_reply(bytes: &[u8]) {
    let count = bytes.first().map_or(0, |&b| u64::from(b));
    let body = bytes.get(1..).unwrap_or_default();
    if let Ok(states) = crate::control::snapshot::decode_states(body, count) {
        assert_eq!(states.len() as u64, count);
    }
}

/// Parse arbitrary bytes as the pages of changed-block flags that a
/// snapshot session sends and the tracking file keeps (`change_flags`),
/// for a device whose size the first two bytes give: an error, or flags
/// that give back exactly these bytes and answer any range; never a panic.
pub fn change_pages(bytes: &[u8]) {
    let Some((size, body)) = bytes.split_first_chunk::<2>() else {
        return;
    };
    let chunks = u64::from(u16::from_le_bytes(*size)) << 16;
    if let Ok(c) = crate::changes::Changes::from_page_bytes(0, body, chunks) {
        assert_eq!(c.page_bytes(), body);
        for (i, w) in body.chunks(8).take(16).enumerate() {
            let first = w.iter().fold(0u64, |a, &b| a << 8 | u64::from(b)) % (chunks + 2);
            let _ = c.changed(first, 1 + (i as u64) * 997);
        }
        let _ = c.regions_changed();
    }
}
