use super::*;
use crate::blockfile::FileBlockFile;
use crate::compress::Compression;
use crate::fingerprint::HashAlgo;

fn cfg(logical_chunks: u64, physical_chunks: u64) -> DeviceConfig {
    DeviceConfig {
        uuid: [7; 16],
        backend: "sparse".into(),
        chunk_size: 4096,
        hash: HashAlgo::Blake3,
        verify: false,
        logical_size: logical_chunks * 4096,
        physical_chunks,
        compression: Compression::None,
    }
}

fn fp(i: u64) -> Fingerprint {
    Fingerprint(*blake3::hash(&i.to_le_bytes()).as_bytes())
}

fn writable() -> OpenOptions {
    OpenOptions {
        writable: true,
        ..Default::default()
    }
}

/// A store on a real sparse file, as `dedup create` makes it.
fn on_file(
    dir: &std::path::Path,
    cfg: &DeviceConfig,
    params: &BackendParams,
) -> Arc<FileBlockFile> {
    let path = dir.join("meta");
    let f = Arc::new(FileBlockFile::create(&path, metadata_device_len(cfg)).unwrap());
    format(cfg, f.as_ref(), params).unwrap();
    f
}

fn open_store(f: &Arc<FileBlockFile>) -> Sparse {
    let sb = Superblock::read(f.as_ref(), std::path::Path::new("meta")).unwrap();
    Sparse::open(sb, Box::new(f.clone()), &writable()).unwrap()
}

/// `n` chunks stored, chunk `i` mapped at LBN `lbn(i)`.
fn store_chunks(s: &mut Sparse, n: u64, lbn: impl Fn(u64) -> u64) {
    for i in 0..n {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
        s.refcount_inc(pbn).unwrap();
        s.lbn_map_insert(lbn(i), pbn).unwrap();
    }
}

/// A small budget that still holds a working index.
const SMALL: u64 = 256 << 10;

#[test]
fn a_terabyte_device_costs_what_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let tib = (1u64 << 40) / 4096;
    let c = cfg(tib, tib);
    let f = on_file(dir.path(), &c, &BackendParams::default());
    assert!(f.len().unwrap() > 1 << 30, "address space for every table");
    let at_create = f.allocated().unwrap().unwrap();
    assert!(at_create < 1 << 20, "{at_create} bytes at create");
    let mut s = open_store(&f);
    // 10,000 chunks written at the far end of the device.
    for i in 0..10_000u64 {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
        s.refcount_inc(pbn).unwrap();
        s.lbn_map_insert(tib - 1 - i, pbn).unwrap();
    }
    s.close(&[1, 2, 3]).unwrap();
    let written = f.allocated().unwrap().unwrap();
    // LBN map, counts, records and summary for 10,000 chunks, and the
    // journal's reserve for a save (as many blocks again, plus 1 MiB):
    // well under 3 MiB, whatever the device size.
    assert!(written < 3 << 20, "{written} bytes for 10,000 chunks");
    let t = std::time::Instant::now();
    let mut s = open_store(&f);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(s.private_data(), [1, 2, 3]);
    assert_eq!(s.usage().pbns_used, 10_000);
    for i in (0..10_000u64).step_by(97) {
        let pbn = s.lbn_map_lookup(tib - 1 - i).unwrap().unwrap();
        assert_eq!(s.hash_index_lookup(&fp(i)).unwrap(), Some(pbn));
        assert_eq!(s.refcount_get(pbn).unwrap(), 2);
    }
}

/// The summaries are paged: at 15 TiB with lz4 (16 addresses a data
/// block, so 63 million refcount blocks) an open reads the summary blocks
/// written, not 250 MiB of them, and RAM holds pages for what is stored.
#[test]
fn summaries_follow_the_data_not_the_device_size() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = 15 * (1u64 << 40) / 4096;
    let c = DeviceConfig {
        compression: Compression::Lz4,
        ..cfg(chunks, chunks)
    };
    let f = on_file(dir.path(), &c, &BackendParams::default());
    let mut s = open_store(&f);
    store_chunks(&mut s, 10_000, |i| chunks - 1 - i * 1000);
    s.close(&[]).unwrap();
    let t = std::time::Instant::now();
    let mut s = open_store(&f);
    let took = t.elapsed();
    let read = s.t.cache.io.bytes_read;
    assert!(read < 8 << 20, "open read {read} bytes of tables");
    assert!(took < std::time::Duration::from_millis(500), "{took:?}");
    assert_eq!(s.usage().pbns_used, 10_000);
    assert_eq!(s.summary.sum(), 10_000);
    assert_eq!(s.mapped.sum(), 10_000);
    // Scans jump over the empty ranges of the map.
    let mut all = Vec::new();
    let mut cursor = Some(ScanCursor::start());
    while let Some(c) = cursor.take() {
        cursor = s.lbn_map_scan(&c, 4096, &mut all).unwrap();
    }
    assert_eq!(all.len(), 10_000);
}

/// A metadata file on a filesystem of 1 KiB blocks, copied sparse (`cp
/// --sparse=always`): its extents may end inside a 4 KiB table block.
struct Fragmented(Arc<FileBlockFile>);

impl BlockFile for Fragmented {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> Result<()> {
        self.0.sync()
    }
    fn len(&self) -> Result<u64> {
        self.0.len()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn capacity(&self) -> Result<Option<u64>> {
        self.0.capacity()
    }
    fn allocated(&self) -> Result<Option<u64>> {
        self.0.allocated()
    }
    fn data_ranges(&self, range: Range<u64>) -> Result<Option<Vec<Range<u64>>>> {
        let whole = self.0.data_ranges(range)?;
        Ok(whole.map(|ranges| {
            (ranges.into_iter())
                .flat_map(|r| {
                    (r.start..r.end)
                        .step_by(1024)
                        .map(move |a| a..(a + 1024).min(r.end))
                })
                .collect()
        }))
    }
}

#[test]
fn summaries_load_once_when_extents_split_a_table_block() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(1 << 20, 1 << 20);
    let f = on_file(dir.path(), &c, &BackendParams::default());
    let mut s = open_store(&f);
    store_chunks(&mut s, 10_000, |i| i * 7);
    s.close(&[]).unwrap();
    let sb = Superblock::read(f.as_ref(), std::path::Path::new("meta")).unwrap();
    let mut s = Sparse::open(sb, Box::new(Fragmented(f.clone())), &writable())
        .unwrap_or_else(|e| panic!("a fragmented file must open: {e}"));
    assert_eq!(s.usage().pbns_used, 10_000);
    assert_eq!(s.mapped.sum(), 10_000);
    assert!(s.lbn_map_lookup(7 * 9_999).unwrap().is_some());
}

fn mem_store(c: &DeviceConfig, index_memory: u64) -> Sparse {
    let meta = Arc::new(crate::blockfile::MemBlockFile::new(
        metadata_device_len(c),
        "meta",
    ));
    let params = BackendParams {
        index_memory,
        ..Default::default()
    };
    format(c, meta.as_ref(), &params).unwrap();
    let sb = Superblock::read(meta.as_ref(), std::path::Path::new("meta")).unwrap();
    Sparse::open(sb, Box::new(meta), &writable()).unwrap()
}

#[test]
fn a_lost_index_costs_deduplication_never_wrong_data() {
    let mut s = mem_store(&cfg(64, 64), SMALL);
    for i in 0..32 {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
    }
    s.index = SampledIndex::new(SMALL, s.index.grouping);
    for i in 0..32 {
        assert_eq!(s.hash_index_lookup(&fp(i)).unwrap(), None);
    }
    // GC and check still see every record.
    let mut all = Vec::new();
    crate::backend::scan_all(
        |c, p| s.hash_index_scan(c, 5, p),
        |f, pbn| {
            all.push((f, pbn));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(all.len(), 32);
    assert!(s.hash_index_delete(&fp(3), all[3].1).unwrap());
}

#[test]
fn stale_advice_fails_confirmation() {
    let mut s = mem_store(&cfg(64, 64), SMALL);
    let pbn = s.alloc_pbn().unwrap().unwrap();
    s.hash_index_insert(&fp(1), pbn).unwrap();
    // The record goes, the advice stays (as after a crash or a lost
    // update), and the PBN now holds another chunk.
    s.set_record(pbn, None).unwrap();
    s.set_record(pbn, Some(&fp(2))).unwrap();
    assert_eq!(s.hash_index_lookup(&fp(1)).unwrap(), None);
    assert_eq!(s.index.stats.stale, 1);
    // A delete names the pair: the wrong fingerprint deletes nothing.
    assert!(!s.hash_index_delete(&fp(1), pbn).unwrap());
    assert!(s.hash_index_delete(&fp(2), pbn).unwrap());
}

#[test]
fn prefetch_finds_the_neighbours_of_a_sampled_hit() {
    // A budget so small that most fingerprints are not in the table.
    let n = 200_000u64;
    let mut s = mem_store(&cfg(n, n), SMALL);
    for i in 0..n {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
    }
    let period = s.index.stats.sampling_period;
    assert!(period >= 2, "{:?}", s.index.stats);
    // The same stream again: after the first hook of each group, the
    // prefetched records find the rest.
    let found = (0..n)
        .filter(|&i| s.hash_index_lookup(&fp(i)).unwrap().is_some())
        .count() as u64;
    assert!(
        found * 100 >= n * 95,
        "{found} of {n} at sampling period {period}"
    );
    assert!(s.index.stats.prefetch_hits > s.index.stats.table_hits);
}

#[test]
fn allocation_skips_full_blocks_and_wraps_to_freed_ones() {
    let n = 3 * REFS_PER_BLOCK + 5;
    let mut s = mem_store(&cfg(16, n), SMALL);
    for _ in 0..n {
        s.alloc_pbn().unwrap().unwrap();
    }
    assert_eq!(s.alloc_pbn().unwrap(), None);
    s.refcount_dec(7).unwrap();
    // Freed in the open transaction: not reusable before the commit.
    assert_eq!(s.alloc_pbn().unwrap(), None);
    assert_eq!(s.usage().pbns_free, 0);
    s.commit(&[]).unwrap();
    assert_eq!(s.usage().pbns_free, 1);
    assert_eq!(s.alloc_pbn().unwrap(), Some(7));
    assert_eq!(s.summary.get(0) as u64, REFS_PER_BLOCK);
}

/// A repack moves a chunk's count before its index entry: for a moment
/// the record sits on a free PBN, in a refcount block with nothing in
/// use. Scans must still find it (they skip by records, not by counts).
#[test]
fn scans_find_records_whose_counts_moved_first() {
    let n = 4 * REFS_PER_BLOCK;
    let mut s = mem_store(&cfg(16, n), SMALL);
    s.refcount_set(5, 1).unwrap();
    s.hash_index_insert(&fp(5), 5).unwrap();
    let new = 3 * REFS_PER_BLOCK + 1;
    s.refcount_set(new, 1).unwrap();
    s.refcount_set(5, 0).unwrap();
    let mut seen = Vec::new();
    crate::backend::scan_all(
        |c, p| s.hash_index_scan(c, 4096, p),
        |f, pbn| {
            seen.push((f, pbn));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seen, vec![(fp(5), 5)]);
    assert!(s.hash_index_delete(&fp(5), 5).unwrap());
    s.hash_index_insert(&fp(5), new).unwrap();
    s.close(&[]).unwrap();
}

#[test]
fn lbn_scans_skip_blocks_with_nothing_mapped_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let tib = (1u64 << 40) / 4096;
    let c = cfg(tib, 1 << 20);
    let f = on_file(dir.path(), &c, &BackendParams::default());
    let mut s = open_store(&f);
    let lbns = [0, 5, 1 << 20, tib / 2, tib - 1];
    for &l in &lbns {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.lbn_map_insert(l, pbn).unwrap();
    }
    s.lbn_map_insert(5, 0).unwrap(); // a remap is not a new mapping
    assert!(s.lbn_map_delete(1 << 20).unwrap().is_some());
    s.close(&[]).unwrap();
    let mut s = open_store(&f);
    let t = std::time::Instant::now();
    let mut seen = Vec::new();
    crate::backend::scan_all(
        |cur, p| s.lbn_map_scan(cur, 2, p),
        |l, _| {
            seen.push(l);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seen, vec![0, 5, tib / 2, tib - 1]);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t.elapsed()
    );
}

/// Fill a store on a file with `n` indexed chunks, closing it cleanly.
fn filled(dir: &std::path::Path, n: u64) -> Arc<FileBlockFile> {
    let c = cfg(4 * n, 4 * n);
    let f = on_file(dir, &c, &BackendParams::default());
    let mut s = open_store(&f);
    for i in 0..n {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
    }
    s.close(&[]).unwrap();
    f
}

fn finds_all(s: &mut Sparse, n: u64) -> bool {
    (0..n).all(|i| s.hash_index_lookup(&fp(i)).unwrap().is_some())
}

#[test]
fn a_clean_stop_checkpoints_the_index_and_the_next_open_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = filled(dir.path(), 5000);
    let mut s = open_store(&f);
    assert!(s.index.stats.from_checkpoint);
    assert_eq!(s.usage().index.unwrap().entries, 5000);
    assert!(finds_all(&mut s, 5000));
    // Reopened and closed again: the new checkpoint names the new commit.
    let pbn = s.alloc_pbn().unwrap().unwrap();
    s.hash_index_insert(&fp(99_999), pbn).unwrap();
    s.close(&[]).unwrap();
    let mut s = open_store(&f);
    assert!(s.index.stats.from_checkpoint);
    assert!(s.hash_index_lookup(&fp(99_999)).unwrap().is_some());
}

#[test]
fn a_damaged_or_stale_checkpoint_is_rebuilt_from_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let f = filled(dir.path(), 5000);
    // Damage the checkpoint's body: the digest fails, the index is rebuilt.
    let geo = Geometry::new(&cfg(20_000, 20_000));
    let at = geo.device_len().next_multiple_of(BLOCK as u64) + BLOCK as u64 + 100;
    f.write_at(&[0xff; 64], at).unwrap();
    let mut s = open_store(&f);
    assert!(!s.index.stats.from_checkpoint);
    assert!(finds_all(&mut s, 5000));
    // Commits after the last clean stop, then a crash: the checkpoint of
    // that stop is stale and ignored.
    let pbn = s.alloc_pbn().unwrap().unwrap();
    s.hash_index_insert(&fp(77_777), pbn).unwrap();
    s.commit(&[]).unwrap();
    drop(s);
    let mut s = open_store(&f);
    assert!(!s.index.stats.from_checkpoint);
    assert!(finds_all(&mut s, 5000));
    assert_eq!(s.hash_index_lookup(&fp(77_777)).unwrap(), Some(pbn));
}

/// After a crash (no checkpoint) a large store serves before its index is
/// whole: the rest is read in steps in the background. A partial index is
/// never checkpointed, so the next open does not take it for whole.
#[test]
fn the_index_is_rebuilt_in_steps_and_never_checkpointed_partial() {
    let dir = tempfile::tempdir().unwrap();
    let f = filled(dir.path(), 5000);
    let mut s = open_store(&f);
    // As an open that read no record yet would leave it.
    s.index = s.index.emptied();
    (s.warm_from, s.warmed) = (Some(0), 0);
    let held = |s: &Sparse| {
        (0..5000)
            .filter(|&i| s.index.hints(fp(i).prefix_u64()).1 > 0)
            .count()
    };
    assert_eq!(held(&s), 0);
    assert_eq!(s.usage().index.unwrap().records_to_warm, 5000);
    let mut steps = 0;
    while s.warm_index(700).unwrap() {
        steps += 1;
        let left = s.usage().index.unwrap().records_to_warm;
        assert_eq!(left, 5000 - 700 * steps, "step {steps}");
    }
    assert_eq!(steps, 7);
    assert_eq!(held(&s), 5000);
    assert_eq!(s.usage().index.unwrap().records_to_warm, 0);
    assert!(!s.warm_index(700).unwrap(), "nothing more to do");

    // Stopped while still partial: no checkpoint, the next open rebuilds.
    s.index = s.index.emptied();
    (s.warm_from, s.warmed) = (Some(0), 0);
    s.warm_index(100).unwrap();
    s.close(&[]).unwrap();
    let mut s = open_store(&f);
    assert!(!s.index.stats.from_checkpoint);
    assert!(finds_all(&mut s, 5000));
}

#[test]
fn missed_duplicates_are_estimated_for_shuffled_copies_too() {
    // A sampled index, then a copy of everything stored in shuffled order
    // (a stride through the chunks: no neighbour follows a hit), mixed
    // with new data: prefetch finds little, and the estimate must say so.
    let n = 200_000u64;
    let mut s = mem_store(&cfg(2 * n, 2 * n), SMALL);
    for i in 0..n {
        let pbn = s.alloc_pbn().unwrap().unwrap();
        s.hash_index_insert(&fp(i), pbn).unwrap();
    }
    assert!(s.index.stats.sampling_period >= 8, "{:?}", s.index.stats);
    let mut missed = 0u64;
    for k in 0..n {
        let i = k * 7919 % n;
        missed += s.hash_index_lookup(&fp(i)).unwrap().is_none() as u64;
        if k % 4 == 0 {
            assert_eq!(s.hash_index_lookup(&fp(10 * n + k)).unwrap(), None);
        }
    }
    let est = missed_estimate(&s.index.stats);
    assert!(
        missed > n / 2,
        "shuffled copies should defeat prefetch: {missed}"
    );
    assert!(
        est.abs_diff(missed) * 10 <= missed,
        "estimated {est} missed duplicates, {missed} were; {:?}",
        s.index.stats
    );
}
