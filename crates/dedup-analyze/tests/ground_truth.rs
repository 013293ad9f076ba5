//! Datasets with known answers, made here: copies of one file (WFH folds
//! exactly N), files sharing aligned blocks (FBH exact), an insertion near
//! the start (CDC keeps finding the rest, FBH loses it), zero blocks, and
//! inputs that cannot be read.

use std::path::{Path, PathBuf};

use dedup_analyze::{report, walk, Algorithm, Analysis, Report};
use dedup_core::fingerprint::HashAlgo;

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn analyse(inputs: &[PathBuf], algos: &[&str]) -> Report {
    let algorithms = algos.iter().map(|a| Algorithm::parse(a).unwrap()).collect();
    let a = Analysis::new(algorithms, HashAlgo::Blake3);
    let files = walk(inputs, &mut |p, why| a.skip(p, why));
    a.run(&files, 2);
    report(&a)
}

fn get<'a>(r: &'a Report, label: &str) -> &'a dedup_analyze::report::AlgoReport {
    r.algorithms.iter().find(|a| a.label == label).unwrap()
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

#[test]
fn n_copies_of_a_file_fold_n_times_under_whole_file_hashing() {
    let d = tempfile::tempdir().unwrap();
    let f = random(300_001, 1);
    for i in 0..5 {
        write(d.path(), &format!("sub{i}/copy.bin"), &f);
    }
    write(d.path(), "other.bin", &random(1000, 2));
    let r = analyse(&[d.path().to_path_buf()], &["wfh", "fbh:4k", "fastcdc:8k"]);
    assert_eq!(r.files, 6);
    let wfh = get(&r, "wfh");
    assert_eq!(wfh.chunks, 6);
    assert_eq!(wfh.unique_chunks, 2);
    let expect = (5 * 300_001 + 1000) as f64 / (300_001 + 1000) as f64;
    assert!(
        (wfh.fold_factor - expect).abs() < 1e-12,
        "{}",
        wfh.fold_factor
    );
    // Whole copies fold the same under any chunking.
    assert!((get(&r, "fbh-4K").fold_factor - expect).abs() < 1e-12);
    assert!((get(&r, "fastcdc-8K").fold_factor - expect).abs() < 1e-12);
    // A file of chunks never seen before is one contiguous read.
    assert!(get(&r, "fbh-4K").reads_per_file.unwrap() >= 1.0);
}

#[test]
fn files_sharing_aligned_blocks_are_counted_exactly_by_fixed_blocks() {
    let d = tempfile::tempdir().unwrap();
    let blocks: Vec<Vec<u8>> = (0..15).map(|i| random(4096, 100 + i)).collect();
    let a: Vec<u8> = blocks[..10].concat();
    let b: Vec<u8> = [&blocks[..5], &blocks[10..15]].concat().concat();
    let zeros = vec![0u8; 8 * 4096];
    write(d.path(), "a", &a);
    write(d.path(), "b", &b);
    write(d.path(), "z", &zeros);
    let r = analyse(&[d.path().to_path_buf()], &["fbh:4k", "wfh"]);
    let fbh = get(&r, "fbh-4K");
    assert_eq!(fbh.chunks, 28);
    assert_eq!(
        fbh.unique_chunks, 16,
        "15 distinct blocks and the zero block"
    );
    assert_eq!(fbh.unique_bytes, 16 * 4096);
    assert_eq!(fbh.zero_chunks, 8);
    assert!((fbh.zero_share - 8.0 / 28.0).abs() < 1e-12);
    assert_eq!(get(&r, "wfh").unique_chunks, 3);
    assert_eq!(fbh.index_bytes, 16 * 40);
    assert_eq!(fbh.recipe_bytes, 28 * 12);
}

#[test]
fn an_insertion_near_the_start_defeats_fixed_blocks_but_not_cdc() {
    let d = tempfile::tempdir().unwrap();
    let f = random(8 << 20, 7);
    let mut g = f.clone();
    g.splice(1000..1000, random(100, 8));
    write(d.path(), "v1", &f);
    write(d.path(), "v2", &g);
    let r = analyse(
        &[d.path().join("v1"), d.path().join("v2")],
        &["fbh:8k", "fastcdc:8k", "rabin:8k"],
    );
    let fbh = get(&r, "fbh-8K").fold_factor;
    let fast = get(&r, "fastcdc-8K").fold_factor;
    let rabin = get(&r, "rabin-8K").fold_factor;
    assert!(fbh < 1.01, "FBH found shifted duplicates: {fbh}");
    assert!(
        fast > 1.98 && rabin > 1.98,
        "CDC missed them: fastcdc {fast}, rabin {rabin}"
    );
    // Sizes near the asked-for average (min = avg/2, max = 2 avg).
    for a in ["fastcdc-8K", "rabin-8K"] {
        let mean = get(&r, a).mean_chunk_bytes;
        assert!((6000.0..16384.0).contains(&mean), "{a}: mean {mean}");
        let h = &get(&r, a).size_histogram;
        assert!(h.iter().all(|&(bound, _)| bound <= 16384), "{a}: {h:?}");
    }
    assert!(get(&r, "fastcdc-8K").chunk_mb_per_cpu_s.unwrap() > 0.0);
}

#[test]
fn what_cannot_be_read_is_reported_and_the_rest_analysed() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "ok", &random(5000, 3));
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(d.path().join("ok"), d.path().join("link")).unwrap();
    let r = analyse(
        &[d.path().to_path_buf(), d.path().join("missing")],
        &["wfh"],
    );
    assert_eq!(r.files, 1, "the symlink is not followed");
    assert_eq!(r.skipped, 2);
    let all = r.first_skipped.join("\n");
    assert!(
        all.contains("fifo") && all.contains("not a regular file"),
        "{all}"
    );
    assert!(all.contains("missing"), "{all}");
    let empty = analyse(&[], &["wfh"]);
    assert_eq!((empty.files, get(&empty, "wfh").fold_factor), (0, 1.0));
}

#[test]
fn a_tar_stream_counts_as_its_files_and_one_ending_early_is_reported() {
    let f = random(200_000, 11);
    let mut builder = tar::Builder::new(Vec::new());
    for name in ["x/one", "y/two", "z/three"] {
        let mut h = tar::Header::new_gnu();
        h.set_size(f.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        builder.append_data(&mut h, name, &f[..]).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    let analyse_tar = |bytes: &[u8]| {
        let a = Analysis::new(
            vec![Algorithm::Wfh, Algorithm::parse("fbh:4k").unwrap()],
            HashAlgo::Blake3,
        );
        a.run_tar(std::path::Path::new("stream.tar"), bytes);
        report(&a)
    };
    let r = analyse_tar(&tar);
    assert_eq!((r.files, r.skipped), (3, 0));
    assert!((get(&r, "wfh").fold_factor - 3.0).abs() < 1e-12);
    // Cut inside the second member.
    let cut = &tar[..512 + 200_000 + 512 + 100_000];
    let r = analyse_tar(cut);
    assert_eq!(r.skipped, 1, "{:?}", r.first_skipped);
    assert!(
        r.first_skipped[0].contains("ended early"),
        "{:?}",
        r.first_skipped
    );
    assert!(
        get(&r, "fbh-4K").logical_bytes >= 200_000,
        "the first member counts"
    );
}

#[test]
fn compression_of_distinct_chunks_adds_to_deduplication_and_never_grows_a_chunk() {
    let d = tempfile::tempdir().unwrap();
    // Text-like data compresses; random data does not.
    let text: Vec<u8> = (0..400_000u32)
        .flat_map(|i| format!("line {} of a log, status ok\n", i % 977).into_bytes())
        .take(400_000)
        .collect();
    write(d.path(), "a.log", &text);
    write(d.path(), "b.log", &text);
    write(d.path(), "r.bin", &random(200_000, 9));
    let algorithms = vec![Algorithm::parse("fbh:4k").unwrap()];
    let mut a = Analysis::new(algorithms, HashAlgo::Blake3);
    a.codecs = vec![dedup_analyze::Codec::Lz4, dedup_analyze::Codec::Zstd];
    let files = walk(&[d.path().to_path_buf()], &mut |p, why| a.skip(p, why));
    a.run(&files, 2);
    let r = report(&a);
    let f = get(&r, "fbh-4K");
    assert_eq!(f.compression.len(), 2);
    for c in &f.compression {
        // The random file stays (nearly) its size; the log shrinks a lot.
        assert!(c.stored_bytes < f.unique_bytes, "{c:?}");
        assert!(c.stored_bytes > 200_000 - 4096, "{c:?}");
        assert!(c.fold_factor > f.fold_factor, "{c:?}");
    }
    // zstd beats lz4 on text.
    assert!(f.compression[1].stored_bytes < f.compression[0].stored_bytes);

    // Only random data: compression gains nothing and loses nothing.
    let d2 = tempfile::tempdir().unwrap();
    write(d2.path(), "r.bin", &random(100_000, 10));
    let mut a = Analysis::new(vec![Algorithm::parse("fbh:4k").unwrap()], HashAlgo::Blake3);
    a.codecs = vec![dedup_analyze::Codec::Lz4];
    let files = walk(&[d2.path().to_path_buf()], &mut |p, why| a.skip(p, why));
    a.run(&files, 1);
    let r = report(&a);
    let f = get(&r, "fbh-4K");
    assert_eq!(f.compression[0].stored_bytes, 100_000);
}

#[test]
fn near_duplicate_chunks_are_found_by_delta_and_stored_small() {
    let d = tempfile::tempdir().unwrap();
    // 64 distinct 4 KiB blocks; a second file has each with a few bytes
    // edited (no block is a duplicate, every block is a near-duplicate);
    // a third file is unrelated.
    let blocks: Vec<Vec<u8>> = (0..64).map(|i| random(4096, 500 + i)).collect();
    let v1: Vec<u8> = blocks.concat();
    let v2: Vec<u8> = blocks
        .iter()
        .flat_map(|b| {
            let mut b = b.clone();
            b[2000..2008].copy_from_slice(b"EDITED!!");
            b
        })
        .collect();
    write(d.path(), "v1", &v1);
    write(d.path(), "v2", &v2);
    write(d.path(), "other", &random(64 * 4096, 999));
    let mut a = Analysis::new(vec![Algorithm::parse("fbh:4k").unwrap()], HashAlgo::Blake3);
    a.measure_delta(64 << 20);
    // One thread: v1 is stored before v2 is read.
    let files = vec![
        d.path().join("v1"),
        d.path().join("v2"),
        d.path().join("other"),
    ];
    a.run(&files, 1);
    let r = report(&a);
    let f = get(&r, "fbh-4K");
    assert!((f.fold_factor - 1.0).abs() < 1e-9, "no exact duplicates");
    let delta = f.delta.as_ref().unwrap();
    // Nearly every edited block is found (resemblance is probabilistic),
    // none of the unrelated ones.
    assert!(delta.similar_chunks >= 60, "{delta:?}");
    assert!(delta.similar_chunks <= 64, "{delta:?}");
    assert!(delta.delta_bytes < delta.similar_chunks * 100, "{delta:?}");
    assert!(
        delta.zstd_alone_bytes > delta.similar_chunks * 4000,
        "{delta:?}"
    );
    assert!(delta.fold_factor > 1.4, "{delta:?}");
}

#[test]
fn a_sampled_estimate_falls_within_its_stated_bound() {
    // A large synthetic set: 60,000 distinct chunks of varied sizes, each
    // repeated 1 to 6 times, in files of a few hundred chunks.
    let d = tempfile::tempdir().unwrap();
    let mut x = 0x1234_5678_u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pool: Vec<Vec<u8>> = (0..60_000u64)
        .map(|i| {
            let mut c = random(4096, 10_000 + i);
            c.truncate(4096);
            c
        })
        .collect();
    let mut file = Vec::new();
    let mut n = 0;
    for (i, c) in pool.iter().enumerate() {
        for _ in 0..=(next() % 6) {
            file.extend_from_slice(c);
        }
        if file.len() > (2 << 20) || i + 1 == pool.len() {
            write(d.path(), &format!("f{n}"), &file);
            file.clear();
            n += 1;
        }
    }
    let exact = analyse(&[d.path().to_path_buf()], &["fbh:4k"]);
    let exact = get(&exact, "fbh-4K").clone();
    for rate in [4, 16, 64] {
        let mut a = Analysis::new(vec![Algorithm::parse("fbh:4k").unwrap()], HashAlgo::Blake3);
        a.sample = dedup_analyze::sample::Sampling::new(rate).unwrap();
        let files = walk(&[d.path().to_path_buf()], &mut |p, why| a.skip(p, why));
        a.run(&files, 2);
        let r = report(&a);
        let s = get(&r, "fbh-4K");
        let [lo, hi] = s.fold_factor_range.unwrap();
        assert!(
            lo <= exact.fold_factor && exact.fold_factor <= hi,
            "rate {rate}: exact {} outside [{lo}, {hi}]",
            exact.fold_factor
        );
        // The bound is useful, not vacuous.
        assert!(
            hi - lo < 0.2 * exact.fold_factor,
            "rate {rate}: [{lo}, {hi}]"
        );
        assert_eq!(s.logical_bytes, exact.logical_bytes);
        assert!(s.reads_per_file.is_none());
    }
}

#[test]
fn a_sample_too_small_is_flagged_and_its_bounds_stay_sane() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "f", &random(400_000, 77));
    let mut a = Analysis::new(vec![Algorithm::parse("fbh:4k").unwrap()], HashAlgo::Blake3);
    a.sample = dedup_analyze::sample::Sampling::new(1_000_000).unwrap();
    let files = walk(&[d.path().to_path_buf()], &mut |p, why| a.skip(p, why));
    a.run(&files, 1);
    let r = report(&a);
    assert!(r.sample_warning.is_some());
    let f = get(&r, "fbh-4K");
    let [lo, hi] = f.fold_factor_range.unwrap();
    // Distinct bytes lie between those sampled and all the bytes.
    assert!(lo >= 1.0 && lo <= hi, "{lo} {hi}");
    assert!(f.space_saved >= 0.0 && f.space_saved <= 1.0);
}

#[test]
fn cpu_seconds_are_cpu_time_even_with_more_readers_than_cores() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..16 {
        write(d.path(), &format!("f{i}"), &random(2 << 20, 300 + i));
    }
    let started = std::time::Instant::now();
    let r = {
        let a = Analysis::new(
            vec![Algorithm::parse("rabin:8k").unwrap()],
            HashAlgo::Blake3,
        );
        let files = walk(&[d.path().to_path_buf()], &mut |p, why| a.skip(p, why));
        a.run(&files, 32);
        report(&a)
    };
    let wall = started.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let x = get(&r, "rabin-8K");
    let cpu = x.chunk_cpu_s + x.hash_cpu_s;
    // 32 readers on a few cores: wall-clock timers would add up to many
    // times the wall time; CPU time cannot exceed wall × cores.
    assert!(
        cpu <= wall * cores * 1.05 + 0.05,
        "cpu {cpu} s, wall {wall} s, {cores} cores"
    );
    assert!(cpu > 0.0);
}
