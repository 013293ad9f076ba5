//! A restore through `dedup store serve` goes on past damage as a restore
//! beside the repository does: a byte flipped in a container frame of the
//! served repository costs only the segments of that frame; every other
//! byte arrives exact, the damaged range as zeros, and the client is told
//! its offset, length and why.

use crate::rpc_support;

use std::collections::BTreeSet;
use std::fs;
use std::ops::Range;
use std::path::Path;

use dedup_common::compress::Compression;
use dedup_common::testdata::noise;
use dedup_store::rpc::ServerLimits;
use dedup_store::{Catalog, LocalDir, RepoOptions, Repository, Segmenting};
use rpc_support::Running;

/// A repository under `dir/repo` with stream backup `s` of `stream`, in
/// small containers of 4 KiB segments.
fn repository(dir: &Path, stream: &[u8]) -> Repository {
    let options = RepoOptions {
        segmenting: Segmenting::Fixed { size: 4096 },
        container_target: 256 << 10,
        compression: Compression::Lz4,
        ..RepoOptions::default()
    };
    let repo = Repository::init_with(dir.join("repo"), options).unwrap();
    repo.set_recipe_part_segments(16);
    repo.backup_stream("s", "s", stream).unwrap();
    repo
}

/// Flip the first byte of a frame in the middle of backup `s`'s second
/// container; the ranges of the stream whose segments lie in that frame.
fn flip_a_frame(repo: &Repository, dir: &Path) -> Vec<Range<u64>> {
    let (_, recipe) = repo.recipe("s").unwrap();
    let containers: BTreeSet<u64> = recipe.segments.iter().map(|s| s.container).collect();
    let id = *containers
        .iter()
        .nth(1)
        .expect("the stream fills several containers");
    let store = LocalDir::open(dir.join("repo")).unwrap();
    let catalog = Catalog::read(&store, id).unwrap();
    let entries = catalog.entries();
    let frame = entries[entries.len() / 2].location.offset;
    let hit: BTreeSet<u32> = (0..entries.len() as u32)
        .filter(|&e| entries[e as usize].location.offset == frame)
        .collect();
    let path = dir.join("repo").join(format!("containers/{id:016x}"));
    let mut bytes = fs::read(&path).unwrap();
    bytes[frame as usize] ^= 0x40;
    fs::write(&path, bytes).unwrap();
    let mut at = 0;
    let mut lost = Vec::new();
    for s in &recipe.segments {
        let range = at..at + u64::from(s.len);
        at = range.end;
        if s.container == id && hit.contains(&s.entry) {
            lost.push(range);
        }
    }
    assert!(!lost.is_empty());
    lost
}

#[test]
fn a_restore_through_the_server_goes_on_past_a_damaged_frame_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let stream = noise(41, (3 << 20) + 777);
    let repo = repository(dir.path(), &stream);
    let lost = flip_a_frame(&repo, dir.path());
    drop(repo);
    let repo = Repository::open(dir.path().join("repo")).unwrap();
    let server = Running::serving(repo, dir.path(), ServerLimits::default());
    let c = server.client();

    let mut out = Vec::new();
    let got = c.restore("s", &mut out).unwrap();
    assert_eq!(got.bytes, stream.len() as u64);
    assert_eq!(out.len(), stream.len());
    let zeroed = |at: u64| lost.iter().any(|r| r.contains(&at));
    for (i, b) in out.iter().enumerate() {
        let want = if zeroed(i as u64) { 0 } else { stream[i] };
        assert_eq!(*b, want, "byte {i}");
    }
    // The damaged ranges are the frame's segments, each named with why,
    // as a restore beside the repository names them.
    let first = lost.first().unwrap().start;
    let end = lost.last().unwrap().end;
    let mut at = first;
    for d in &got.damaged {
        assert_eq!(d.offset, at, "{:?}", got.damaged);
        assert!(d.error.contains("containers/"), "{}", d.error);
        at += d.len;
    }
    assert_eq!(at, end, "{:?}", got.damaged);
    let direct = Repository::open_read_only(dir.path().join("repo")).unwrap();
    let beside = direct.restore_salvage("s", &mut Vec::new()).unwrap();
    assert_eq!(got, beside);

    // The connection serves on after it.
    assert_eq!(c.list().unwrap().len(), 1);
    server.shut();
}
