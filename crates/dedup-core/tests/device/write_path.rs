//! Every branch of Dmdedup's Figure 2, read-modify-write at chunk edges,
//! zero chunks, TRIM, garbage collection, ENOSPC and verify mode, each with
//! the reference counts the paper prescribes.

use crate::common;

use common::{assert_consistent, MemDevice, Patterns};
use dedup_core::Error;

const CS: usize = 4096;

fn setup() -> (MemDevice, Patterns) {
    (MemDevice::new(CS as u32, 16, 16), Patterns::new(6, CS))
}

fn write_chunk(dev: &dedup_core::Device, p: &Patterns, lbn: u64, pattern: usize) {
    dev.write(lbn * CS as u64, p.chunk(pattern), false).unwrap();
}

fn read_chunk(dev: &dedup_core::Device, lbn: u64) -> Vec<u8> {
    let mut b = vec![0; CS];
    dev.read(lbn * CS as u64, &mut b).unwrap();
    b
}

#[test]
fn new_data_on_a_new_lbn_stores_one_chunk_with_count_two() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 3, 1);
    let (pbn, count) = dev.inspect_lbn(3).unwrap().unwrap();
    assert_eq!(count, 2, "Dmdedup §2.4: +2, hash index and LBN map");
    assert_eq!(pbn, 0, "sequential allocation starts at PBN 0");
    assert_eq!(read_chunk(&dev, 3), p.chunk(1));
    let s = dev.stats();
    assert_eq!(
        (s.chunks_stored, s.chunks_mapped, s.counters.unique_writes),
        (1, 1, 1)
    );
    assert_consistent(&dev);
}

#[test]
fn new_data_over_an_old_lbn_leaves_the_old_chunk_to_the_index() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    let (old, _) = dev.inspect_lbn(0).unwrap().unwrap();
    write_chunk(&dev, &p, 0, 2);
    let (new, count) = dev.inspect_lbn(0).unwrap().unwrap();
    assert_ne!(old, new);
    assert_eq!(count, 2);
    assert_eq!(
        dev.refcount(old).unwrap(),
        1,
        "only the hash index holds it until GC"
    );
    assert_eq!(read_chunk(&dev, 0), p.chunk(2));
    assert_eq!(dev.stats().counters.overwrites, 1);
    assert_consistent(&dev);
}

#[test]
fn duplicate_to_a_new_lbn_shares_the_chunk() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    write_chunk(&dev, &p, 5, 1);
    let (a, _) = dev.inspect_lbn(0).unwrap().unwrap();
    let (b, count) = dev.inspect_lbn(5).unwrap().unwrap();
    assert_eq!(a, b);
    assert_eq!(count, 3, "index + two LBNs");
    let s = dev.stats();
    assert_eq!(
        (
            s.chunks_stored,
            s.chunks_mapped,
            s.counters.duplicate_writes
        ),
        (1, 2, 1)
    );
    assert_eq!(s.dedup_ratio, 2.0);
    assert_eq!(
        s.counters.data_bytes_written, CS as u64,
        "the duplicate wrote no data"
    );
    assert_consistent(&dev);
}

#[test]
fn duplicate_over_a_different_old_lbn_moves_the_reference() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    write_chunk(&dev, &p, 1, 2);
    let (pbn1, _) = dev.inspect_lbn(0).unwrap().unwrap();
    let (pbn2, _) = dev.inspect_lbn(1).unwrap().unwrap();
    write_chunk(&dev, &p, 1, 1); // LBN 1: pattern 2 -> pattern 1 (already stored)
    assert_eq!(dev.inspect_lbn(1).unwrap().unwrap(), (pbn1, 3));
    assert_eq!(dev.refcount(pbn2).unwrap(), 1);
    assert_eq!(read_chunk(&dev, 1), p.chunk(1));
    let s = dev.stats();
    assert_eq!((s.counters.duplicate_writes, s.counters.overwrites), (1, 1));
    assert_consistent(&dev);
}

#[test]
fn rewrite_of_the_same_data_changes_nothing() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 7, 4);
    let before = dev.inspect_lbn(7).unwrap();
    write_chunk(&dev, &p, 7, 4);
    assert_eq!(dev.inspect_lbn(7).unwrap(), before);
    let s = dev.stats();
    assert_eq!(
        (s.counters.rewrites, s.counters.overwrites, s.chunks_stored),
        (1, 0, 1)
    );
    assert_eq!(s.counters.data_bytes_written, CS as u64);
    assert_consistent(&dev);
}

#[test]
fn duplicates_inside_one_request_are_stored_once() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    let mut buf = Vec::new();
    for _ in 0..8 {
        buf.extend_from_slice(p.chunk(3));
    }
    dev.write(0, &buf, false).unwrap();
    let s = dev.stats();
    assert_eq!((s.chunks_stored, s.chunks_mapped), (1, 8));
    assert_eq!(dev.inspect_lbn(0).unwrap().unwrap().1, 9);
    assert_consistent(&dev);
}

#[test]
fn zero_chunks_are_never_stored_and_unmap_what_was_there() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    dev.write(0, &vec![0u8; 4 * CS], false).unwrap();
    assert_eq!(dev.stats().chunks_stored, 0);
    assert_eq!(dev.stats().counters.zero_writes, 4);
    write_chunk(&dev, &p, 2, 1);
    dev.write(2 * CS as u64, &vec![0u8; CS], false).unwrap();
    assert_eq!(dev.inspect_lbn(2).unwrap(), None);
    assert_eq!(read_chunk(&dev, 2), vec![0u8; CS]);
    assert_eq!(dev.stats().counters.data_bytes_written, CS as u64);
    assert_consistent(&dev);
}

#[test]
fn partial_writes_read_modify_write_at_every_chunk_edge() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    let mut model = vec![0u8; 16 * CS];
    dev.write(0, &p.bytes(1, 0, 4 * CS), false).unwrap();
    model[..4 * CS].copy_from_slice(&p.bytes(1, 0, 4 * CS));
    // Straddling a boundary, inside one chunk, touching first and last bytes.
    for &(off, len, pat) in &[
        (CS - 1, 2, 2),
        (CS + 100, 50, 3),
        (2 * CS - 1, 1, 4),
        (3 * CS, 1, 5),
        (5 * CS + 7, 3 * CS, 2),
        (15 * CS + 4000, 96, 1),
    ] {
        let bytes = p.bytes(pat, off as u64, len);
        dev.write(off as u64, &bytes, false).unwrap();
        model[off..off + len].copy_from_slice(&bytes);
        assert_eq!(
            common::read_all(&dev),
            model,
            "after writing {len} bytes at {off}"
        );
    }
    assert!(dev.stats().counters.rmw_reads >= 4);
    assert_consistent(&dev);
}

#[test]
fn trim_unmaps_whole_chunks_and_zeroes_partial_ones() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    dev.write(0, &p.bytes(2, 0, 4 * CS), false).unwrap();
    dev.discard(100, (2 * CS) as u64, false).unwrap();
    let mut model = p.bytes(2, 0, 4 * CS);
    model[100..100 + 2 * CS].fill(0);
    let mut got = vec![0u8; 4 * CS];
    dev.read(0, &mut got).unwrap();
    assert_eq!(got, model);
    assert_eq!(
        dev.inspect_lbn(1).unwrap(),
        None,
        "the fully covered chunk is unmapped"
    );
    assert!(
        dev.inspect_lbn(0).unwrap().is_some(),
        "partially covered chunks keep data"
    );
    assert_eq!(dev.stats().counters.discarded_chunks, 1);
    assert_consistent(&dev);
}

#[test]
fn gc_frees_chunks_only_the_index_holds_and_they_are_reused() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    for pat in 1..=5 {
        write_chunk(&dev, &p, 0, pat);
    }
    assert_eq!(dev.stats().chunks_stored, 5);
    let report = dev.gc().unwrap();
    assert_eq!(report.reclaimed, 4);
    assert_eq!(dev.stats().chunks_stored, 1);
    assert_eq!(read_chunk(&dev, 0), p.chunk(5));
    // The hash index forgot the collected contents: writing one again stores it anew.
    write_chunk(&dev, &p, 1, 1);
    assert_eq!(dev.stats().chunks_stored, 2);
    assert_consistent(&dev);
}

#[test]
fn a_collected_chunk_is_still_deduplicated_before_gc_runs() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    let (pbn, _) = dev.inspect_lbn(0).unwrap().unwrap();
    dev.discard(0, CS as u64, false).unwrap();
    assert_eq!(dev.refcount(pbn).unwrap(), 1);
    write_chunk(&dev, &p, 9, 1);
    assert_eq!(
        dev.inspect_lbn(9).unwrap(),
        Some((pbn, 2)),
        "Dmdedup §2.4: rewritten data is found again"
    );
    assert_consistent(&dev);
}

#[test]
fn a_full_device_collects_garbage_before_refusing_with_enospc() {
    let md = MemDevice::new(CS as u32, 16, 4);
    let p = Patterns::new(8, CS);
    let dev = md.open().unwrap();
    for pat in 1..=4 {
        write_chunk(&dev, &p, pat as u64, pat);
    }
    // Full: new content over a live chunk cannot be placed (the old chunk is
    // only released once the new one is written).
    assert!(matches!(
        dev.write(CS as u64, p.chunk(5), false),
        Err(Error::NoSpace { .. })
    ));
    assert_eq!(
        read_chunk(&dev, 1),
        p.chunk(1),
        "the failed write left the old data"
    );
    // After a trim its chunk is garbage, and the next write collects it inline.
    dev.discard(CS as u64, CS as u64, false).unwrap();
    write_chunk(&dev, &p, 1, 5);
    assert_eq!(read_chunk(&dev, 1), p.chunk(5));
    // Now four live distinct chunks: new content cannot fit.
    let err = dev.write(6 * CS as u64, p.chunk(6), false).unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(
        err.to_string().contains("dedup gc"),
        "the message says what to do: {err}"
    );
    // Nothing already stored was harmed, duplicates and zeros still work.
    for (lbn, pat) in [(1, 5), (2, 2), (3, 3), (4, 4)] {
        assert_eq!(read_chunk(&dev, lbn), p.chunk(pat));
    }
    assert_eq!(read_chunk(&dev, 6), vec![0; CS]);
    write_chunk(&dev, &p, 10, 2);
    dev.write(11 * CS as u64, &vec![0; CS], false).unwrap();
    assert_eq!(dev.stats().counters.nospace_errors, 2);
    assert_consistent(&dev);
}

/// Simulate a fingerprint collision: write pattern 1 to LBN 0, then change
/// its stored bytes to pattern 2 behind the engine's back, and write pattern
/// 1 (whose fingerprint is indexed) to LBN 1.
fn collide(verify: bool) -> (MemDevice, dedup_core::Device, Patterns, u64) {
    use dedup_core::blockfile::BlockFile;
    let md = MemDevice::with(
        CS as u32,
        16,
        16,
        dedup_core::fingerprint::HashAlgo::Md5,
        verify,
    );
    let p = Patterns::new(4, CS);
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    let (pbn, _) = dev.inspect_lbn(0).unwrap().unwrap();
    md.data
        .write_at(p.chunk(2), dev.config().pbn_offset(pbn))
        .unwrap();
    write_chunk(&dev, &p, 1, 1);
    (md, dev, p, pbn)
}

#[test]
fn verify_mode_stores_a_colliding_chunk_apart() {
    let (_md, dev, p, pbn) = collide(true);
    assert_eq!(
        read_chunk(&dev, 1),
        p.chunk(1),
        "verify mode never shares unequal bytes"
    );
    let (other, count) = dev.inspect_lbn(1).unwrap().unwrap();
    assert_ne!(other, pbn);
    assert_eq!(count, 1, "held by its LBN only, not indexed");
    assert_eq!(dev.stats().counters.verify_mismatches, 1);
    // Overwriting it frees it at once.
    write_chunk(&dev, &p, 1, 3);
    assert_eq!(dev.refcount(other).unwrap(), 0);
}

#[test]
fn without_verify_a_collision_would_share_the_stored_bytes() {
    // What verify protects from: the same setup with verify off.
    let (_md, dev, p, _) = collide(false);
    assert_eq!(read_chunk(&dev, 1), p.chunk(2));
}

#[test]
fn io_beyond_the_end_is_refused_by_the_engine() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    let size = dev.size();
    let err = dev.write(size - 10, &p.bytes(1, 0, 20), false).unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    let mut buf = [0u8; 1];
    assert!(dev.read(size, &mut buf).is_err());
    assert!(
        dev.discard(u64::MAX - 1, 10, false).is_err(),
        "no overflow on huge offsets"
    );
    assert!(dev.extents(0, size + 1).is_err());
    dev.write(size - 10, &p.bytes(1, 0, 10), false).unwrap();
}

#[test]
fn a_closed_device_refuses_io_and_a_clean_reopen_keeps_everything() {
    let (md, p) = setup();
    let dev = md.open().unwrap();
    dev.write(0, &p.bytes(1, 0, 3 * CS + 17), false).unwrap();
    dev.write(8 * CS as u64, p.chunk(1), false).unwrap();
    let before = common::read_all(&dev);
    let stats_before = dev.stats();
    dev.close().unwrap();
    assert!(matches!(
        dev.write(0, p.chunk(1), false),
        Err(Error::Closed)
    ));
    drop(dev);
    let dev = md.open().unwrap();
    assert_eq!(common::read_all(&dev), before);
    let s = dev.stats();
    assert_eq!(
        s.counters.unique_writes, stats_before.counters.unique_writes,
        "counters survive"
    );
    assert_eq!(
        (s.chunks_stored, s.chunks_mapped),
        (stats_before.chunks_stored, stats_before.chunks_mapped)
    );
    assert_consistent(&dev);
}

#[test]
fn an_unclean_stop_is_refused_and_recovery_rolls_back_safely() {
    let cfg = common::config(
        "inram",
        CS as u32,
        16,
        16,
        dedup_core::fingerprint::HashAlgo::Blake3,
        false,
    );
    let md = MemDevice::format(cfg, &Default::default());
    let p = Patterns::new(6, CS);
    let dev = md.open().unwrap();
    write_chunk(&dev, &p, 0, 1);
    write_chunk(&dev, &p, 1, 2);
    dev.close().unwrap();
    drop(dev);
    let dev = md.open().unwrap();
    // After the clean stop: LBN 1 changes, GC frees pattern 2's chunk, and
    // new data reuses that PBN. Then the process dies.
    write_chunk(&dev, &p, 1, 3);
    dev.gc().unwrap();
    write_chunk(&dev, &p, 2, 4);
    drop(dev); // crash: no close
    let err = md
        .open()
        .err()
        .expect("an unclean INRAM device must be refused");
    assert!(matches!(err, Error::Unclean { .. }), "{err}");
    assert!(
        err.to_string().contains("--accept-unclean"),
        "the message names the way out: {err}"
    );
    let dev = md.open_with(true).unwrap();
    let r = dev.recovery().unwrap().clone();
    assert_eq!(read_chunk(&dev, 0), p.chunk(1), "untouched data survives");
    let lbn1 = read_chunk(&dev, 1);
    assert!(
        lbn1 == p.chunk(2) || lbn1 == vec![0; CS],
        "stale LBN 1 reads its old data or zeros, never another chunk"
    );
    assert!(r.chunks_verified >= 2);
    assert_consistent(&dev);
}

#[test]
fn a_failed_data_write_changes_no_metadata() {
    use std::sync::atomic::Ordering;
    let (md, p) = setup();
    let data = common::FaultyBlockFile::new(md.data.clone());
    let fail = data.fail_writes.clone();
    let dev = md
        .open_on(Box::new(data), Box::new(md.meta.clone()))
        .unwrap();
    write_chunk(&dev, &p, 0, 1);
    write_chunk(&dev, &p, 1, 2);
    let before = dev.stats();
    fail.store(true, Ordering::SeqCst);
    // A batch mixing a duplicate (no data write) and new content (fails).
    let mut buf = p.chunk(2).to_vec();
    buf.extend_from_slice(p.chunk(3));
    let err = dev.write(0, &buf, false).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(read_chunk(&dev, 0), p.chunk(1), "old data still there");
    assert_eq!(read_chunk(&dev, 1), p.chunk(2));
    let after = dev.stats();
    assert_eq!(
        (after.chunks_stored, after.chunks_mapped),
        (before.chunks_stored, before.chunks_mapped)
    );
    assert_consistent(&dev);
    fail.store(false, Ordering::SeqCst);
    dev.write(0, &buf, false).unwrap();
    assert_eq!(read_chunk(&dev, 1), p.chunk(3));
    assert_consistent(&dev);
}

/// A save refused for space (the host's filesystem full under the
/// metadata file) can be retried once space is back. A failing disk (EIO)
/// is not retried: the metadata stops taking writes until a restart
/// (`failed_sync.rs`).
#[test]
fn a_failed_close_keeps_the_device_open_so_close_can_be_retried() {
    use std::sync::atomic::Ordering;
    let (md, p) = setup();
    let mut meta = common::FaultyBlockFile::new(md.meta.clone());
    meta.errno = libc::ENOSPC;
    let fail = meta.fail_writes.clone();
    let dev = md
        .open_on(Box::new(md.data.clone()), Box::new(meta))
        .unwrap();
    write_chunk(&dev, &p, 4, 2);
    fail.store(true, Ordering::SeqCst);
    assert!(dev.close().is_err(), "the save cannot be written");
    assert_eq!(read_chunk(&dev, 4), p.chunk(2), "still open and serving");
    fail.store(false, Ordering::SeqCst);
    dev.close().unwrap();
    drop(dev);
    let dev = md.open().unwrap();
    assert_eq!(read_chunk(&dev, 4), p.chunk(2));
}

#[test]
fn a_full_device_without_garbage_does_not_rescan_the_index_on_every_refused_write() {
    let md = MemDevice::new(CS as u32, 16, 3);
    let p = Patterns::new(8, CS);
    let dev = md.open().unwrap();
    for pat in 1..=3 {
        write_chunk(&dev, &p, pat as u64, pat);
    }
    for pat in 4..=7 {
        assert!(matches!(
            dev.write(0, p.chunk(pat), false),
            Err(Error::NoSpace { .. })
        ));
    }
    assert_eq!(
        dev.stats().counters.gc_runs,
        1,
        "one fruitless scan, then no more until garbage appears"
    );
    dev.discard(CS as u64, CS as u64, false).unwrap(); // pattern 1's chunk is now garbage
    write_chunk(&dev, &p, 0, 4);
    assert_eq!(dev.stats().counters.gc_runs, 2);
    assert_eq!(read_chunk(&dev, 0), p.chunk(4));
    assert_consistent(&dev);
}
