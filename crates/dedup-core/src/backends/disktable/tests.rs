//! disktable with a cache far smaller than its tables, so eviction, re-reads
//! and 75 %-dirty commits happen all the time: random backend operations
//! checked against a model, and power cuts at any metadata I/O, after which
//! the tables must be exactly those of the last commit (or of the one in
//! flight, if its journal was complete).

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};

use super::*;
use crate::blockfile::sim::{PowerSwitch, SimDisk};
use crate::fingerprint::HashAlgo;

const LOGICAL: u64 = 40_000;
const PHYSICAL: u64 = 8_000;

fn cfg() -> DeviceConfig {
    DeviceConfig {
        uuid: [5; 16],
        backend: NAME.into(),
        chunk_size: 4096,
        hash: HashAlgo::Blake3,
        verify: false,
        logical_size: LOGICAL * 4096,
        physical_chunks: PHYSICAL,
        compression: crate::compress::Compression::None,
    }
}

/// The smallest cache the backend allows (64 blocks): the tables need ~175.
fn open_tiny(meta: Arc<SimDisk>) -> Result<DiskTable> {
    let sb = Superblock::read(meta.as_ref(), std::path::Path::new("meta"))?;
    let opts = OpenOptions {
        writable: true,
        cache_bytes: Some(1),
        ..Default::default()
    };
    open_table(sb, Box::new(meta), &opts)
}

#[derive(Clone, Default, PartialEq, Eq, Debug)]
struct Model {
    lbn: BTreeMap<u64, u64>,
    hash: BTreeMap<Fingerprint, u64>,
    refs: BTreeMap<u64, u32>,
}

fn fp(n: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&n.to_le_bytes())
}

/// One random, reference-count-consistent change, mirrored in the model.
fn step(t: &mut DiskTable, m: &mut Model, rng: &mut impl Rng) -> Result<()> {
    match rng.random_range(0..10) {
        0..=4 => {
            // Map an LBN to a new chunk (alloc + index + map), or to an existing one.
            let lbn = rng.random_range(0..LOGICAL);
            let target = if rng.random_bool(0.5) || m.hash.is_empty() {
                let Some(pbn) = t.alloc_pbn()? else {
                    return Ok(());
                };
                let key = fp(rng.random::<u64>());
                t.hash_index_insert(&key, pbn)?;
                m.hash.insert(key, pbn);
                m.refs.insert(pbn, 1);
                pbn
            } else {
                let i = rng.random_range(0..m.hash.len());
                *m.hash.values().nth(i).expect("in range")
            };
            t.refcount_inc(target)?;
            *m.refs.get_mut(&target).expect("live") += 1;
            if let Some(old) = m.lbn.insert(lbn, target) {
                t.refcount_dec(old)?;
                *m.refs.get_mut(&old).expect("live") -= 1;
            }
            t.lbn_map_insert(lbn, target).map(|_| ())
        }
        5..=6 => {
            // Unmap an LBN.
            let Some((&lbn, &pbn)) = m.lbn.iter().nth(rng.random_range(0..m.lbn.len().max(1)))
            else {
                return Ok(());
            };
            t.lbn_map_delete(lbn)?;
            t.refcount_dec(pbn)?;
            m.lbn.remove(&lbn);
            *m.refs.get_mut(&pbn).expect("live") -= 1;
            Ok(())
        }
        _ => {
            // Collect one index-only chunk.
            let garbage: Vec<(Fingerprint, u64)> = m
                .hash
                .iter()
                .filter(|(_, p)| m.refs[*p] == 1)
                .map(|(f, p)| (*f, *p))
                .take(3)
                .collect();
            for (f, pbn) in garbage {
                t.hash_index_delete(&f, pbn)?;
                t.refcount_dec(pbn)?;
                m.hash.remove(&f);
                m.refs.remove(&pbn);
            }
            Ok(())
        }
    }
}

fn assert_matches(t: &mut DiskTable, m: &Model, at: &str) {
    for lbn in 0..LOGICAL {
        assert_eq!(
            t.lbn_map_lookup(lbn).unwrap(),
            m.lbn.get(&lbn).copied(),
            "{at}: LBN {lbn}"
        );
    }
    for (f, p) in &m.hash {
        assert_eq!(
            t.hash_index_lookup(f).unwrap(),
            Some(*p),
            "{at}: fingerprint"
        );
    }
    for pbn in 0..PHYSICAL {
        let want = m.refs.get(&pbn).copied().unwrap_or(0);
        assert_eq!(t.refcount_get(pbn).unwrap(), want, "{at}: PBN {pbn}");
    }
    assert_eq!(t.hash_entries, m.hash.len() as u64, "{at}: entries");
    let mut mapped = 0u64;
    crate::backend::scan_all(
        |c, page| t.lbn_map_scan(c, 4096, page),
        |_, _| {
            mapped += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(mapped, m.lbn.len() as u64, "{at}: mapped");
}

fn formatted(power: Arc<PowerSwitch>) -> Arc<SimDisk> {
    let c = cfg();
    let meta = SimDisk::new(metadata_device_len(&c), "meta", Arc::default());
    format(&c, &meta, &BackendParams::default()).unwrap();
    Arc::new(SimDisk::from_image(meta.contents(), "meta", power))
}

#[test]
fn a_tiny_cache_still_matches_the_model() {
    let meta = formatted(Arc::default());
    let mut t = open_tiny(meta.clone()).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for i in 0..3000 {
        step(&mut t, &mut m, &mut rng).unwrap();
        if t.wants_commit() || i % 500 == 0 {
            t.commit(&[]).unwrap();
        }
    }
    assert!(
        t.usage().io.cache_misses > 1000,
        "the cache really was too small"
    );
    assert_matches(&mut t, &m, "before reopen");
    t.close(&[]).unwrap();
    let mut t = open_tiny(meta).unwrap();
    assert_matches(&mut t, &m, "after reopen");
}

#[test]
fn power_cuts_leave_exactly_a_committed_state() {
    let total = {
        let power = Arc::new(PowerSwitch::default());
        let meta = formatted(power.clone());
        let mut t = open_tiny(meta).unwrap();
        let mut m = Model::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..600 {
            step(&mut t, &mut m, &mut rng).unwrap();
            if t.wants_commit() {
                t.commit(&[]).unwrap();
            }
        }
        power.ops()
    };
    for cut in (0..total).step_by((total / 60).max(1) as usize) {
        let power = PowerSwitch::cutting_at(cut);
        let meta = formatted(power.clone());
        let mut committed = Model::default();
        let mut in_flight = None;
        if let Ok(mut t) = open_tiny(meta.clone()) {
            let mut m = Model::default();
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            for _ in 0..600 {
                if step(&mut t, &mut m, &mut rng).is_err() {
                    break;
                }
                if t.wants_commit() {
                    in_flight = Some(m.clone());
                    if t.commit(&[]).is_err() {
                        break;
                    }
                    committed = in_flight.take().expect("set above");
                }
            }
        }
        power.cut();
        for seed in 0..3 {
            let mut rng = {
                let mut s = cut * 31 + seed;
                move || {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    s >> 11
                }
            };
            let image = meta.crash_image(&mut rng, seed % 2 == 0);
            let disk = Arc::new(SimDisk::from_image(image, "meta", Arc::default()));
            let mut t = open_tiny(disk).unwrap_or_else(|e| panic!("cut {cut}: reopen failed: {e}"));
            let at = format!("cut {cut} image {seed}");
            let mut probe = Model::default();
            for lbn in 0..LOGICAL {
                if let Some(p) = t.lbn_map_lookup(lbn).unwrap() {
                    probe.lbn.insert(lbn, p);
                }
            }
            let expected = if probe.lbn == committed.lbn {
                &committed
            } else {
                in_flight
                    .as_ref()
                    .unwrap_or_else(|| panic!("{at}: LBN map matches no committed state"))
            };
            assert_matches(&mut t, expected, &at);
        }
    }
}

#[test]
fn more_dirty_blocks_than_the_cache_holds_between_commits() {
    let meta = formatted(Arc::default());
    let mut t = open_tiny(meta.clone()).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    // No commit for a long while: the dirty set outgrows the 64-block cache,
    // and reads of other blocks must still work.
    for _ in 0..400 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    assert!(t.t.cache.dirty_count() > t.t.cache.capacity_blocks());
    assert_matches(&mut t, &m, "with the cache over-full");
    t.commit(&[]).unwrap();
    assert_matches(&mut t, &m, "after the commit");
}

/// A torn journal write that keeps an older header but a newer root's state
/// sector must not replay: the state record ends in its own crc32c, which a
/// crc32c over the body could not see (found by the device crash test).
#[test]
fn a_torn_journal_under_an_older_header_is_not_replayed() {
    let meta = formatted(Arc::default());
    let mut t = open_tiny(meta.clone()).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for _ in 0..20 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    // The private record stands for the engine's totals: it must match
    // the tables it was committed with.
    t.commit(&[m.lbn.len() as u64]).unwrap();
    t.commit(&[m.lbn.len() as u64]).unwrap(); // a journal holding only the root block
    let committed = meta.contents();
    for _ in 0..20 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    t.commit(&[m.lbn.len() as u64]).unwrap();
    let newer = meta.contents();
    // The newer journal's root image starts two blocks into the journal
    // (header, descriptor); keep only its first sector, where the state is.
    let root_at = (t.geo.journal_start() + 2 * BLOCK as u64) as usize;
    let mut image = committed.clone();
    image[root_at..root_at + 512].copy_from_slice(&newer[root_at..root_at + 512]);
    assert_ne!(image, committed, "the two roots differ");
    drop(t);
    let disk = Arc::new(SimDisk::from_image(image, "meta", Arc::default()));
    let mut t = open_tiny(disk).expect("the torn journal is ignored");
    let mut probe = 0;
    for lbn in 0..LOGICAL {
        probe += t.lbn_map_lookup(lbn).unwrap().is_some() as u64;
    }
    assert_eq!(probe, t.private_data()[0]);
}

#[test]
fn a_device_of_another_layout_is_refused_with_what_to_do() {
    for (layout, advice) in [(0u32, "earlier development version"), (9, "newer dedup")] {
        let meta = formatted(Arc::default());
        let mut sb = Superblock::read(meta.as_ref(), std::path::Path::new("meta")).unwrap();
        let at = AREA_OFFSET + 8;
        sb.backend_area[at..at + 4].copy_from_slice(&layout.to_le_bytes());
        sb.write(meta.as_ref()).unwrap();
        let e = open_tiny(meta).err().expect("opened a foreign layout");
        let msg = e.to_string();
        assert!(msg.contains("layout") && msg.contains(advice), "{msg}");
    }
}

/// `open_tiny`, with `data` as the data device a listed journal is
/// checked against (chunks of 4 KiB from offset 4096).
fn open_checking(
    meta: Arc<SimDisk>,
    data: Arc<dyn crate::blockfile::BlockFile>,
) -> Result<DiskTable> {
    let mut sb = Superblock::read(meta.as_ref(), std::path::Path::new("meta"))?;
    sb.data_check = Some(crate::blockfile::written::DataCheck {
        data,
        block: 4096,
        first: 4096,
    });
    let opts = OpenOptions {
        writable: true,
        cache_bytes: Some(1),
        ..Default::default()
    };
    open_table(sb, Box::new(meta), &opts)
}

/// A journal that lists data blocks (`blockfile/written.rs`) is replayed
/// only if they all hold their digests' bytes: the power can fail after
/// the journal's sync and before the data's, which run side by side.
#[test]
fn a_journal_is_replayed_only_if_the_data_it_lists_is_there() {
    use crate::blockfile::written::digest;
    let open_with_data =
        |meta: Arc<SimDisk>, data: &Arc<SimDisk>| open_checking(meta, data.clone());
    let no_data = || Arc::new(SimDisk::new(1 << 20, "data", Arc::default()));
    let meta = formatted(Arc::default());
    let mut t = open_with_data(meta.clone(), &no_data()).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    for _ in 0..30 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    t.commit(&[]).unwrap();
    let committed = m.clone();
    for _ in 0..30 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    // The transaction wrote one data block; the power fails while its
    // data syncs, after the journal's sync (the homes are not written):
    // the metadata as it is then.
    let block = vec![9u8; 4096];
    let listed = [(8192, digest(&block))];
    let mut image = Vec::new();
    let cut = t
        .commit_beside_data(&[], Some(&listed), &mut || {
            image = meta.contents();
            Err(Error::Io {
                context: "the power failed".into(),
                cause: std::io::Error::other("cut"),
            })
        })
        .expect("disktable commits beside its data");
    assert!(cut.is_err());
    drop(t);
    // Had the data sync failed without a power cut, the journal is
    // cleared: a restart must not replay it on the strength of pages the
    // kernel kept after their write-back failed.
    let kept = no_data();
    kept.write_at(&block, 8192).unwrap();
    let mut after = open_with_data(meta.clone(), &kept).unwrap();
    assert_matches(&mut after, &committed, "a failed data sync");
    drop(after);
    let reopen = || Arc::new(SimDisk::from_image(image.clone(), "meta", Arc::default()));
    // The block never reached the disk: back to the last commit.
    let mut t = open_with_data(reopen(), &no_data()).unwrap();
    assert_matches(&mut t, &committed, "data missing");
    drop(t);
    // It did: the transaction is replayed.
    let data = no_data();
    data.write_at(&block, 8192).unwrap();
    data.sync().unwrap();
    let mut t = open_with_data(reopen(), &data).unwrap();
    assert_matches(&mut t, &m, "data there");
    drop(t);
    // After a kill -9 the block may be in the page cache only: recovery
    // reads it back there, and makes it durable before replaying the
    // transaction that names it (a power cut later must not lose it).
    let data = no_data();
    data.write_at(&block, 8192).unwrap();
    let mut t = open_with_data(reopen(), &data).unwrap();
    assert_matches(&mut t, &m, "data in the page cache");
    assert_eq!(
        data.unsynced_writes(),
        0,
        "the data was synced before the replay"
    );
    // Without the data device to check against, recovery refuses.
    let sb = Superblock::read(reopen().as_ref(), std::path::Path::new("meta")).unwrap();
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    let err = open_table(sb, Box::new(reopen()), &opts)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("data device"), "{err}");
}

/// A commit whose homes reached the disk had its data synced first: its
/// journal is replayed without reading the data it lists, so a data block
/// that can no longer be read (a bad sector) does not stop the open.
#[test]
fn a_journal_whose_root_home_holds_its_commit_is_replayed_without_reading_data() {
    use crate::blockfile::written::digest;

    /// A data device whose every read fails.
    struct Unreadable;
    impl crate::blockfile::BlockFile for Unreadable {
        fn read_at(&self, _: &mut [u8], offset: u64) -> Result<()> {
            Err(Error::Io {
                context: format!("reading the data device at {offset}"),
                cause: std::io::Error::other("bad sector"),
            })
        }
        fn write_at(&self, _: &[u8], _: u64) -> Result<()> {
            Ok(())
        }
        fn sync(&self) -> Result<()> {
            Ok(())
        }
        fn len(&self) -> Result<u64> {
            Ok(1 << 20)
        }
        fn describe(&self) -> String {
            "data".into()
        }
        fn capacity(&self) -> Result<Option<u64>> {
            Ok(None)
        }
    }
    let open_with = |meta: Arc<SimDisk>| open_checking(meta, Arc::new(Unreadable));
    let meta = formatted(Arc::default());
    let mut t = open_tiny(meta.clone()).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for _ in 0..30 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    let listed = [(8192, digest(&[4u8; 4096]))];
    t.commit_beside_data(&[], Some(&listed), &mut || Ok(()))
        .expect("disktable commits beside its data")
        .unwrap();
    // A kill -9 now: the journal and the homes are as written.
    let image = meta.contents();
    drop(t);
    let mut t = open_with(Arc::new(SimDisk::from_image(image, "meta", Arc::default())))
        .expect("the homes prove the data was synced");
    assert_matches(&mut t, &m, "replayed");
}

/// A commit whose home writes failed part-way (the host's disk full)
/// leaves the homes a mix of two commits; only a journal holding all of
/// them repairs that, so the next one must be one recovery never drops:
/// it lists no data (the data syncs first).
#[test]
fn after_half_written_homes_the_next_journal_lists_no_data() {
    use crate::blockfile::written::digest;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// The metadata device; while `full`, writes past the journal's first
    /// block (the homes) fail as on a full filesystem.
    struct Filling {
        inner: Arc<SimDisk>,
        full: AtomicBool,
    }
    impl crate::blockfile::BlockFile for Filling {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
            if self.full.load(Ordering::SeqCst) && offset > 8192 {
                return Err(Error::Io {
                    context: "writing a table block home".into(),
                    cause: std::io::Error::from_raw_os_error(libc::ENOSPC),
                });
            }
            self.inner.write_at(buf, offset)
        }
        fn sync(&self) -> Result<()> {
            self.inner.sync()
        }
        fn len(&self) -> Result<u64> {
            self.inner.len()
        }
        fn describe(&self) -> String {
            "meta".into()
        }
        fn capacity(&self) -> Result<Option<u64>> {
            self.inner.capacity()
        }
    }
    let inner = formatted(Arc::default());
    let meta = Arc::new(Filling {
        inner: inner.clone(),
        full: AtomicBool::new(false),
    });
    let sb = Superblock::read(meta.as_ref(), std::path::Path::new("meta")).unwrap();
    let opts = OpenOptions {
        writable: true,
        cache_bytes: Some(1),
        ..Default::default()
    };
    let mut t = open_table(sb, Box::new(meta.clone()), &opts).unwrap();
    let mut m = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    for _ in 0..30 {
        step(&mut t, &mut m, &mut rng).unwrap();
    }
    let listed = [(8192, digest(&[5u8; 4096]))];
    meta.full.store(true, Ordering::SeqCst);
    let failed = t
        .commit_beside_data(&[], Some(&listed), &mut || Ok(()))
        .expect("disktable commits beside its data");
    assert!(failed.is_err(), "the homes could not be written");
    meta.full.store(false, Ordering::SeqCst);
    t.commit_beside_data(&[], Some(&listed), &mut || Ok(()))
        .expect("disktable commits beside its data")
        .unwrap();
    let mut magic = [0u8; 8];
    inner.read_at(&mut magic, 8192).unwrap();
    assert_eq!(
        &magic, b"DDUPJRNL",
        "the journal after half-written homes lists data"
    );
    assert_matches(&mut t, &m, "after the retry");
}
