//! Model-based test of the repository: seeded random sequences of backups
//! (streams built from a few shared blocks, so duplicates are common, of
//! lengths including 0 and non-multiples of 4 KiB), deletes, reopens and
//! crashed backups (a reader that fails part-way), checked after every step
//! against a map of what should be there.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::io::{self, Read};

use dedup_store::{RepoError, RepoOptions, Repository, Segmenting};
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};

/// A reader that returns `data` up to `fail_at`, then an error: a backup
/// that dies half-way.
struct Failing<'a> {
    data: &'a [u8],
    fail_at: usize,
    pos: usize,
}

impl Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.fail_at {
            return Err(io::Error::other("the disk being backed up went away"));
        }
        let n = buf.len().min(self.fail_at - self.pos).min(1000);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn stream(rng: &mut StdRng, blocks: &[Vec<u8>]) -> Vec<u8> {
    let mut s = Vec::new();
    match rng.random_range(0..8) {
        0 => return s,
        1 => {
            // Short and odd.
            s.extend_from_slice(&blocks[0][..rng.random_range(1..4096)]);
            return s;
        }
        _ => {}
    }
    for _ in 0..rng.random_range(1..40) {
        let b = &blocks[rng.random_range(0..blocks.len())];
        if rng.random_ratio(1, 6) {
            // A piece that is not a whole block shifts what follows.
            s.extend_from_slice(&b[..rng.random_range(1..b.len())]);
        } else {
            s.extend_from_slice(b);
        }
    }
    if rng.random_ratio(1, 3) {
        let mut noise = vec![0u8; rng.random_range(1..9000)];
        rng.fill_bytes(&mut noise);
        s.extend_from_slice(&noise);
    }
    s
}

fn check(repo: &mut Repository, model: &BTreeMap<String, Vec<u8>>, gone: &[String]) {
    let listed: Vec<String> = repo
        .list_backups()
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert_eq!(listed, model.keys().cloned().collect::<Vec<_>>());
    for (name, data) in model {
        let mut out = Vec::new();
        repo.restore(name, &mut out).unwrap();
        assert!(out == *data, "backup {name} restored wrong");
    }
    for name in gone.iter().filter(|n| !model.contains_key(*n)) {
        assert!(matches!(
            repo.restore(name, Vec::new()),
            Err(RepoError::NoSuchBackup { .. })
        ));
    }
}

fn run(seed: u64, segmenting: Segmenting) {
    let mut rng = StdRng::seed_from_u64(seed);
    let blocks: Vec<Vec<u8>> = (0..6)
        .map(|_| {
            let mut b = vec![0u8; 4096];
            rng.fill_bytes(&mut b);
            b
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let options = RepoOptions {
        segmenting,
        container_target: 48 << 10,
        force: false,
        ..RepoOptions::default()
    };
    let mut repo = Repository::init_with(tmp.path(), options).unwrap();
    // Recipes of many parts, and of one (the default is far larger).
    let part = |rng: &mut StdRng| [1, 2, 7, 1 << 16][rng.random_range(0..4)];
    repo.set_recipe_part_segments(part(&mut rng));
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut gone: Vec<String> = Vec::new();
    let (mut new_bytes, mut in_bytes) = (0u64, 0u64);
    for step in 0..60 {
        let name = format!("b{}", rng.random_range(0..12));
        match rng.random_range(0..10) {
            0..=4 => {
                let data = stream(&mut rng, &blocks);
                let result = repo.backup_stream(&name, "grp", &data[..]);
                match model.entry(name) {
                    Entry::Occupied(_) => {
                        assert!(matches!(result, Err(RepoError::BackupExists { .. })))
                    }
                    Entry::Vacant(slot) => {
                        let r = result.unwrap();
                        assert_eq!(r.bytes_in, data.len() as u64);
                        new_bytes += r.bytes_new;
                        in_bytes += r.bytes_in;
                        slot.insert(data);
                    }
                }
            }
            5 | 6 => {
                let result = repo.delete_backup(&name);
                if model.remove(&name).is_some() {
                    result.unwrap();
                    gone.push(name);
                } else {
                    assert!(matches!(result, Err(RepoError::NoSuchBackup { .. })));
                }
            }
            7 => {
                drop(repo);
                repo = Repository::open(tmp.path()).unwrap();
                repo.set_recipe_part_segments(part(&mut rng));
            }
            _ => {
                if model.contains_key(&name) {
                    continue;
                }
                let data = stream(&mut rng, &blocks);
                let fail_at = rng.random_range(0..=data.len());
                let reader = Failing {
                    data: &data,
                    fail_at,
                    pos: 0,
                };
                let e = repo.backup_stream(&name, "grp", reader).unwrap_err();
                assert!(matches!(e, RepoError::Io { .. }), "step {step}: {e}");
                gone.push(name);
                // A crash loses the process too: sometimes carry on in this
                // one, sometimes start again from the directory.
                if rng.random_bool(0.5) {
                    drop(repo);
                    repo = Repository::open(tmp.path()).unwrap();
                }
            }
        }
        check(&mut repo, &model, &gone);
    }
    eprintln!(
        "seed {seed} {segmenting:?}: {in_bytes} bytes backed up, {new_bytes} new ({:.1}x)",
        in_bytes as f64 / new_bytes.max(1) as f64
    );
    assert!(new_bytes < in_bytes || in_bytes == 0);
}

#[test]
fn model_fixed_segments() {
    for seed in 0..6 {
        run(seed, Segmenting::DEFAULT);
    }
}

#[test]
fn model_fastcdc_segments() {
    for seed in 100..106 {
        run(seed, Segmenting::FASTCDC_4K);
    }
}
