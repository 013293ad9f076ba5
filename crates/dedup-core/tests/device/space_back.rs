//! Freed space goes back to the host: on a device over a regular file,
//! blocks freed by overwrites, trims and GC are punched out of the data
//! file once their freeing is committed, so the file's allocated bytes
//! follow the data in use; and GC repacks only what gives back at least
//! as much as it rewrites. Every surviving chunk still reads back.

use crate::common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{assert_consistent, read_all, ModelDisk};
use dedup_core::backends::OpenOptions;
use dedup_core::compress::Compression;
use dedup_core::layout::{self, CreateOptions, DevicePaths};
use dedup_core::testdata::noise;
use dedup_core::Device;

const CS: usize = 4096;
const MIB: u64 = 1 << 20;

fn rw() -> OpenOptions {
    OpenOptions {
        writable: true,
        ..Default::default()
    }
}

fn create(dir: &Path, size: u64, backend: &str, compression: Compression) -> DevicePaths {
    let mut opts = CreateOptions::new(size);
    opts.backend = backend.to_string();
    opts.compression = compression;
    layout::create(dir, &opts).unwrap();
    DevicePaths::from_dir(dir).unwrap()
}

/// Bytes the data file takes on the filesystem.
fn allocated(paths: &DevicePaths) -> u64 {
    std::fs::metadata(&paths.data).unwrap().blocks() * 512
}

/// A unique chunk whose first `noisy` bytes are random and the rest zeros
/// (so it compresses to a bit more than `noisy` bytes).
fn chunk(id: u64, noisy: usize) -> Vec<u8> {
    let mut c = noise(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xdead, noisy);
    c.resize(CS, 0);
    c[CS - 8..].copy_from_slice(&id.to_le_bytes());
    c
}

/// Write `lbns` chunks from `first`, 64 to a request.
fn write_run(dev: &Device, model: &mut ModelDisk, first: u64, lbns: u64, id0: u64, noisy: usize) {
    for start in (first..first + lbns).step_by(64) {
        let n = 64.min(first + lbns - start);
        let buf: Vec<u8> = (start..start + n)
            .flat_map(|l| chunk(id0 + l, noisy))
            .collect();
        dev.write(start * CS as u64, &buf, false).unwrap();
        model.write(start * CS as u64, &buf);
    }
}

#[test]
fn freed_space_goes_back_to_the_host() {
    // lz4: ~1.1 KiB fragments, three to a packed block; none: one chunk a
    // block; thin: one C-block (or plain block) a chunk, punched once the
    // commit of its tables that frees it is durable.
    let default = dedup_core::registry::DEFAULT;
    for (backend, compression, noisy) in [
        (default, Compression::Lz4, 1100),
        (default, Compression::None, CS - 8),
        ("thin", Compression::Lz4, 1100),
        ("thin", Compression::None, CS - 8),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let paths = create(&tmp.path().join("dev"), 64 * MIB, backend, compression);
        let dev = layout::open(&paths, &rw()).unwrap();
        let mut model = ModelDisk::new(64 * MIB as usize, CS);
        const LBNS: u64 = 32 * MIB / CS as u64;
        write_run(&dev, &mut model, 0, LBNS, 0, noisy);
        dev.flush().unwrap();
        let s = dev.stats();
        let high = allocated(&paths);
        eprintln!(
            "{backend}/{compression}: after writing 32 MiB: used {} allocated {high}",
            s.physical_bytes_used
        );
        assert!(high >= s.physical_bytes_used, "the data is on the file");

        // Trim three chunks of four in the first 24 MiB, overwrite the
        // last 8 MiB with new data: most of what was written dies.
        for lbn in (0..LBNS * 3 / 4).filter(|l| l % 4 != 0) {
            dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
            model.zero(lbn * CS as u64, CS as u64);
        }
        write_run(&dev, &mut model, LBNS * 3 / 4, LBNS / 4, 1 << 40, noisy);
        dev.flush().unwrap();
        let r = dev.gc().unwrap();
        dev.flush().unwrap();
        let s = dev.stats();
        let now = allocated(&paths);
        eprintln!(
            "{backend}/{compression}: after trim/overwrite/gc: used {} allocated {now} (gc {r:?})",
            s.physical_bytes_used
        );
        assert_eq!(s.data_allocated_bytes, Some(now), "status reports it");
        // The header block, and at most a few blocks the filesystem keeps
        // around holes (metadata of the extent tree is not in st_blocks).
        let margin = 64 * 1024;
        assert!(
            now <= s.physical_bytes_used + margin,
            "{backend}/{compression}: {now} bytes allocated for {} used",
            s.physical_bytes_used
        );
        assert!(
            now * 2 < high,
            "{backend}/{compression}: space came back ({high} -> {now})"
        );
        assert_eq!(read_all(&dev), model.read(0, 64 * MIB as usize));
        assert_consistent(&dev);
        dev.close().unwrap();
        drop(dev); // releases the device lock

        // And after a reopen: nothing the metadata names was punched.
        let dev = layout::open(&paths, &rw()).unwrap();
        assert_eq!(read_all(&dev), model.read(0, 64 * MIB as usize));
        assert_consistent(&dev);
        dev.close().unwrap();
    }
}

/// Blocks of fragments of mixed sizes, a random third of them killed: the
/// old rule (under 75 % live, any gain) rewrote most blocks to free a few;
/// the rule now never rewrites more than it frees.
#[test]
fn gc_rewrites_no_more_than_it_gives_back() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = create(
        &tmp.path().join("dev"),
        64 * MIB,
        dedup_core::registry::DEFAULT,
        Compression::Lz4,
    );
    let dev = layout::open(&paths, &rw()).unwrap();
    let mut model = ModelDisk::new(64 * MIB as usize, CS);
    const LBNS: u64 = 8192;
    let mut x = 0x1234_5678u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for lbn in 0..LBNS {
        let c = chunk(lbn, 700 + (rand() % 1400) as usize);
        dev.write(lbn * CS as u64, &c, false).unwrap();
        model.write(lbn * CS as u64, &c);
    }
    dev.flush().unwrap();
    for lbn in 0..LBNS {
        if rand() % 3 == 0 {
            dev.discard(lbn * CS as u64, CS as u64, false).unwrap();
            model.zero(lbn * CS as u64, CS as u64);
        }
    }
    dev.flush().unwrap();
    let before = dev.stats().data_blocks_used;
    let alloc_before = allocated(&paths);
    let r = dev.gc().unwrap();
    let after = dev.stats().data_blocks_used;
    let rewritten = r.repack_blocks_written * CS as u64;
    let freed_by_repack = (r.blocks_repacked - r.repack_blocks_written) * CS as u64;
    eprintln!(
        "mixed: blocks {before} -> {after}; repack emptied {} wrote {} ({rewritten} bytes rewritten, {freed_by_repack} freed by it); gc gave back {} bytes; file {alloc_before} -> {}",
        r.blocks_repacked,
        r.repack_blocks_written,
        r.bytes_reclaimed,
        allocated(&paths)
    );
    assert!(
        rewritten <= freed_by_repack,
        "rewrote {rewritten} bytes to free {freed_by_repack}"
    );
    assert_eq!(r.bytes_reclaimed, (before - after) * CS as u64);
    assert_eq!(read_all(&dev), model.read(0, 64 * MIB as usize));
    assert_consistent(&dev);
    dev.close().unwrap();
}
