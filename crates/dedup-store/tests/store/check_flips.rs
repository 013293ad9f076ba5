//! Byte-level damage and the store check: every flipped byte of a
//! container (all outside the segment bodies, a dense spread inside) is found with data verification (and, without it, every one
//! outside the segment bodies), a segment damaged under recomputed
//! checksums is found by its BLAKE3, and random damage to random objects
//! never panics and never costs a backup the check did not name.

use crate::catalog_support;
use crate::check_support;

use std::collections::BTreeSet;
use std::fs;
use std::time::Instant;

use catalog_support::{entries, trailer, with_entries};
use check_support::{fixture, Fixture};
use dedup_common::compress::Compression;
use dedup_store::format::{crc, HEADER_LEN};
use dedup_store::{CheckReport, Segmenting};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Only `object` is named, at least once.
fn names_only(report: &CheckReport, object: &str) -> bool {
    !report.problems.is_empty() && report.problems.iter().all(|p| p.object == object)
}

fn affected(report: &CheckReport) -> BTreeSet<String> {
    report
        .affected_backups()
        .into_iter()
        .map(String::from)
        .collect()
}

/// The smallest container holding both compressed and stored segments.
fn mixed_container(f: &Fixture) -> (String, Vec<u8>) {
    let mut mixed: Vec<(String, Vec<u8>)> = f
        .containers()
        .into_iter()
        .map(|c| (c.clone(), fs::read(f.path(&c)).unwrap()))
        .filter(|(_, b)| {
            let kinds: BTreeSet<bool> = entries(b)
                .iter()
                .map(|e| e.location.compression == Compression::None)
                .collect();
            kinds.len() == 2
        })
        .collect();
    mixed.sort_by_key(|(_, b)| b.len());
    mixed
        .into_iter()
        .next()
        .expect("a container with both kinds")
}

/// Which bytes to flip: every one outside the segment bodies, each body's
/// first and last 8 (compression framing, neighbours), and an even spread
/// of about 1500 body bytes in all, so the test stays within seconds in a
/// debug build (every byte of a 12 KiB container takes a minute).
fn flip_positions(good: &[u8]) -> BTreeSet<usize> {
    let catalog_at = trailer(good).catalog_offset as usize;
    let mut at: BTreeSet<usize> = (0..HEADER_LEN).chain(catalog_at..good.len()).collect();
    let stride = (catalog_at - HEADER_LEN).div_ceil(1500).max(1);
    at.extend((HEADER_LEN..catalog_at).step_by(stride));
    for e in entries(good) {
        let (start, end) = (
            e.location.offset as usize,
            (e.location.offset + u64::from(e.location.stored_len)) as usize,
        );
        at.extend((start..end).take(8));
        at.extend((start..end).rev().take(8));
    }
    at
}

#[test]
fn every_flipped_byte_of_a_container_is_found() {
    for segmenting in [Segmenting::DEFAULT, Segmenting::FASTCDC_4K] {
        let f = fixture(segmenting);
        let (object, good) = mixed_container(&f);
        let catalog_at = trailer(&good).catalog_offset as usize;
        let start = Instant::now();
        let positions = flip_positions(&good);
        for (n, &i) in positions.iter().enumerate() {
            let mut bad = good.clone();
            bad[i] ^= 1 << (i % 8);
            fs::write(f.path(&object), &bad).unwrap();
            let r = f.check(true);
            assert!(names_only(&r, &object), "flip at {i}: {r:#?}");
            // Without data, the bodies go unread; everything else is checked.
            let quick = f.check(false);
            let outside_bodies = i < HEADER_LEN || i >= catalog_at;
            if outside_bodies {
                assert!(names_only(&quick, &object), "flip at {i}: {quick:#?}");
            } else {
                assert!(quick.is_clean(), "flip at {i}: {quick:#?}");
            }
            // The backups named are exactly those that fail to restore (none
            // for a header flip). Restores are slower than checks, so only
            // a sample.
            if i < HEADER_LEN {
                assert!(affected(&r).is_empty(), "flip at {i}: {r:#?}");
            }
            if n % 13 == 0 || i < HEADER_LEN {
                assert_eq!(f.unrestorable(), affected(&r), "flip at {i}: {r:#?}");
            }
        }
        fs::write(f.path(&object), &good).unwrap();
        assert!(f.check(true).is_clean());
        eprintln!(
            "{segmenting:?}: {} flips of {object} ({} bytes) in {:.1?}",
            positions.len(),
            good.len(),
            start.elapsed()
        );
    }
}

/// Damage a frame's stored bytes and recompute its crc (in every entry of
/// the frame), the catalog's and the trailer's, so only BLAKE3 after
/// decompressing can tell.
#[test]
fn a_segment_damaged_under_valid_checksums_is_found_by_its_fingerprint() {
    let f = fixture(Segmenting::DEFAULT);
    let (object, good) = mixed_container(&f);
    let all = entries(&good);
    // The last segment of each frame: the frame's last byte is its.
    let lasts = (0..all.len()).filter(|&i| {
        all.get(i + 1)
            .is_none_or(|next| !next.location.same_frame(&all[i].location))
    });
    for i in lasts {
        let l = all[i].location;
        let mut c = good.clone();
        let body = l.offset as usize..(l.offset + u64::from(l.stored_len)) as usize;
        // The frame's last byte: for a compressed frame, a literal (LZ4
        // ends every block with literals), so it still decompresses.
        c[body.end - 1] ^= 0x20;
        let sum = crc(&c[body]);
        let c = with_entries(&c, |entries| {
            for e in entries.iter_mut().filter(|e| e.location.same_frame(&l)) {
                e.location.stored_crc = sum;
            }
        });
        fs::write(f.path(&object), &c).unwrap();

        assert!(f.check(false).is_clean(), "only the data can tell");
        let r = f.check(true);
        assert_eq!(r.problems.len(), 1, "{r:#?}");
        let said = r.problems[0].to_string();
        let entry_i = format!("{object}: catalog entry {i}: segment {i}");
        assert!(said.starts_with(&entry_i), "{said}");
        assert!(said.contains("fingerprint"), "{said}");
        assert_eq!(f.unrestorable(), affected(&r), "{r:#?}");
    }
}

#[derive(Clone, Debug)]
enum Damage {
    Flip { at: prop::sample::Index, mask: u8 },
    Truncate(prop::sample::Index),
    Append(Vec<u8>),
    Replace(Vec<u8>),
    Delete,
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), 1..=255u8).prop_map(|(at, mask)| Damage::Flip { at, mask }),
        1 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..64).prop_map(Damage::Append),
        1 => prop::collection::vec(any::<u8>(), 0..200).prop_map(Damage::Replace),
        1 => Just(Damage::Delete),
    ]
}

#[test]
fn random_damage_to_random_objects_never_panics_or_goes_unnamed() {
    let f = fixture(Segmenting::FASTCDC_4K);
    let mut objects = vec!["config".to_string()];
    for prefix in ["backups", "recipes"] {
        for e in fs::read_dir(f.path(prefix)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            objects.push(format!("{prefix}/{name}"));
        }
    }
    objects.extend(f.containers());
    let mut runner = TestRunner::new(Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (prop::sample::select(objects), damage());
    runner
        .run(&strategy, |(object, damage)| {
            let path = f.path(&object);
            let good = fs::read(&path).unwrap();
            match &damage {
                Damage::Flip { at, mask } => {
                    let mut bad = good.clone();
                    bad[at.index(good.len())] ^= mask;
                    fs::write(&path, bad).unwrap();
                }
                Damage::Truncate(at) => fs::write(&path, &good[..at.index(good.len())]).unwrap(),
                Damage::Append(more) => fs::write(&path, [&good[..], more].concat()).unwrap(),
                Damage::Replace(other) => fs::write(&path, other).unwrap(),
                Damage::Delete => fs::remove_file(&path).unwrap(),
            }
            let quick = f.check(false);
            let r = f.check(true);
            let failing = f.unrestorable();
            fs::write(&path, &good).unwrap();
            // Deleting a backup object is deleting the backup: its recipe
            // and containers become garbage, nothing is damaged.
            let deleted_backup = matches!(damage, Damage::Delete) && object.starts_with("backups/");
            if deleted_backup {
                prop_assert!(r.is_clean() && !r.garbage.is_empty(), "{r:#?}");
            } else {
                prop_assert!(names_only(&r, &object), "{r:#?}");
                prop_assert_eq!(&failing, &affected(&r), "{:#?}", r);
            }
            prop_assert!(
                quick.problems.iter().all(|p| p.object == object),
                "{quick:#?}"
            );
            Ok(())
        })
        .unwrap();
}
