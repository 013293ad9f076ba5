//! The fuzz targets' entry points (`dedup_store::fuzzing`, run by
//! `fuzz/fuzz_targets/store_*.rs`) over inputs a CI run can afford: every
//! object of a real repository (containers, recipes whole and in parts,
//! a tree, backups, marks, the config, an index checkpoint, epoch records,
//! a pin, id reservations) given to every
//! decoder, whole, cut short and with bytes flipped; real request and
//! response frames (a restore's among them) mutated; and arbitrary bytes.

use dedup_common::testdata::noise;
use dedup_store::fuzzing::{objects, wire, OBJECT_KINDS};
use dedup_store::index::IndexConfig;
use dedup_store::rpc::protocol::{Call, ErrorKind, Item, Reply, Request, Response, WireError};
use dedup_store::{GcOptions, LocalDir, ObjectStore, Repository};
use proptest::prelude::*;

/// Every object of a small repository that has one of each kind.
fn a_repository_s_objects() -> Vec<(String, Vec<u8>)> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    drop(Repository::init(&dir).unwrap());
    {
        // The sampled index leaves a checkpoint when the handle closes.
        let repo = Repository::open_sampled(&dir, IndexConfig::default()).unwrap();
        repo.set_recipe_part_segments(8);
        let data = [noise(1, 40_000), noise(2, 30_000), noise(1, 40_000)].concat();
        repo.backup_stream("s1", "g", &data[..]).unwrap();
        repo.backup_stream("s2", "g", &data[..20_000]).unwrap();
        let files = tmp.path().join("files");
        std::fs::create_dir_all(files.join("d")).unwrap();
        std::fs::write(files.join("d/a"), noise(3, 5000)).unwrap();
        std::os::unix::fs::symlink("d/a", files.join("l")).unwrap();
        repo.backup_paths("f1", "h", &[&files], |_| {}).unwrap();
        repo.delete_backup("s2").unwrap();
        repo.gc(&GcOptions::default()).unwrap();
    } // closing checkpoints the index
    let store = LocalDir::open(&dir).unwrap();
    let names = store.list("").unwrap();
    let found: Vec<_> = names
        .into_iter()
        .map(|n| {
            let bytes = store.get(&n).unwrap();
            (n, bytes)
        })
        .collect();
    // An encrypted repository's key object and sealed config.
    let mut found = found;
    let sealed_dir = tmp.path().join("sealed");
    {
        let _p = dedup_store::crypto::passphrase::for_this_thread(b"fuzz");
        let options = dedup_store::RepoOptions {
            encryption: Some(dedup_store::crypto::KdfParams::FOR_TESTS),
            ..Default::default()
        };
        drop(Repository::init_with(&sealed_dir, options).unwrap());
    }
    let sealed = LocalDir::open(&sealed_dir).unwrap();
    for n in sealed.list("").unwrap() {
        let bytes = sealed.get(&n).unwrap();
        found.push((format!("sealed/{n}"), bytes));
    }
    // A pin (its writer deletes its own at close).
    let pin = dedup_store::epochs::PinRecord {
        epoch: 3,
        process: "0123456789abcdef-1-2".into(),
        containers: vec![1, 2],
        ranges: vec![(256, 250)],
        objects: vec!["recipes/s3-0000000000000001".into()],
    };
    found.push((
        dedup_store::epochs::PinRecord::object_name(3, "w", 0),
        pin.encode(),
    ));
    for prefix in [
        "gc/epoch-",
        "pins/",
        "ids/",
        "sealed/keys/",
        "containers/",
        "recipes/",
        "trees/",
        "backups/",
        "index/",
        "config",
    ] {
        assert!(
            found.iter().any(|(n, _)| n.starts_with(prefix)),
            "no {prefix} object in {:?}",
            found.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
    }
    found
}

#[test]
fn every_decoder_survives_every_real_object_whole_cut_and_flipped() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for (name, bytes) in a_repository_s_objects() {
        for kind in 0..OBJECT_KINDS {
            let run = |b: &[u8]| objects(&[&[kind][..], b].concat());
            run(&bytes);
            for cut in [0, 1, bytes.len() / 2, bytes.len().saturating_sub(1)] {
                run(&bytes[..cut]);
            }
            for _ in 0..24 {
                let mut b = bytes.clone();
                if b.is_empty() {
                    break;
                }
                let at = next() as usize % b.len();
                b[at] ^= 1 << (next() % 8);
                run(&b);
            }
        }
        let _ = name;
    }
}

fn request_frames() -> Vec<u8> {
    let calls = [
        Call::Hello { protocol: 4 },
        Call::Authenticate {
            nonce: [1; 32],
            proof: [2; 32],
        },
        Call::BeginBackup {
            name: "b".into(),
            group: "g".into(),
        },
        Call::Lookup {
            session: 1,
            fingerprints: vec![[3; 32]; 3],
        },
        Call::Append {
            session: 1,
            items: vec![
                Item::Known {
                    fingerprint: [4; 32],
                },
                Item::New {
                    fingerprint: [5; 32],
                    data: vec![6; 100],
                },
                Item::Parent { offset: 9, len: 10 },
                Item::Unhashed { data: vec![9; 50] },
            ],
        },
        Call::ParentTree { session: 1, at: 11 },
        Call::TreePart {
            session: 1,
            bytes: vec![7; 10],
        },
        Call::Commit {
            session: 1,
            tree: Some(vec![8; 5]),
        },
        Call::Restore { name: "b".into() },
        Call::Gc {
            compact_below: Some(0.5),
        },
    ];
    let mut out = Vec::new();
    for (id, call) in calls.into_iter().enumerate() {
        let id = id as u64;
        frame(&mut out, &Request { id, call });
    }
    out
}

fn frame(out: &mut Vec<u8>, message: &impl serde::Serialize) {
    let body = postcard::to_allocvec(message).unwrap();
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
}

/// A restore's answers as a client reads them: chunks, a damaged range
/// between them, the end; and a refusal.
fn response_frames() -> Vec<u8> {
    let replies = [
        Ok(Reply::Chunk(vec![1; 40])),
        Ok(Reply::Damaged {
            offset: 40,
            len: 4096,
            error: "corrupt object containers/0000000000000001".into(),
        }),
        Ok(Reply::Chunk(vec![2; 30])),
        Ok(Reply::Restored { bytes: 4166 }),
        Err(WireError::new(ErrorKind::Repository, "no backup named b")),
    ];
    let mut out = Vec::new();
    for reply in replies {
        frame(&mut out, &Response { id: 7, reply });
    }
    out
}

#[test]
fn real_request_frames_round_trip() {
    wire(&request_frames());
}

#[test]
fn real_restore_response_frames_round_trip() {
    wire(&response_frames());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn mutated_request_frames_never_panic(flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8), cut in any::<usize>(), responses in any::<bool>()) {
        let mut frames = match responses {
            true => response_frames(),
            false => request_frames(),
        };
        for (at, x) in flips {
            let i = at % frames.len();
            frames[i] ^= x;
        }
        let cut = cut % (frames.len() + 1);
        wire(&frames[..cut]);
    }

    #[test]
    fn arbitrary_bytes_never_panic_any_decoder(data in prop::collection::vec(any::<u8>(), 0..4096)) {
        objects(&data);
        wire(&data);
    }
}
