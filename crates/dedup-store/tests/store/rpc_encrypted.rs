//! `dedup store serve` of an encrypted repository: clients hash with the
//! repository's fingerprint key, which the server hands them over its
//! Unix socket, so their backups deduplicate against every other writer
//! and restore byte-exact (over TCP: `rpc_tls.rs`).

use crate::rpc_support;

use dedup_common::testdata::noise;
use dedup_store::config::KeyedOf;
use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::crypto::KdfParams;
use dedup_store::rpc::{BackupOptions, ServerLimits};
use dedup_store::{RepoOptions, Repository};
use rpc_support::Running;

/// An encrypted repository whose fingerprints key what `keyed_of` says:
/// the plain digest (made since config version 3) or the bytes (before).
fn encrypted(dir: &std::path::Path, keyed_of: KeyedOf) -> Repository {
    let options = RepoOptions {
        encryption: Some(KdfParams::FOR_TESTS),
        keyed_of,
        ..RepoOptions::default()
    };
    Repository::init_with(dir.join("repo"), options).unwrap();
    Repository::open(dir.join("repo")).unwrap()
}

#[test]
fn clients_back_up_with_keyed_fingerprints_and_deduplicate() {
    for keyed_of in [KeyedOf::PlainDigest, KeyedOf::Bytes] {
        clients_deduplicate(keyed_of);
    }
}

fn clients_deduplicate(keyed_of: KeyedOf) {
    let dir = tempfile::tempdir().unwrap();
    let _p = for_this_thread(b"served");
    // Some of the data backed up directly, before the server runs.
    let bytes = noise(21, 1 << 20);
    let repo = encrypted(dir.path(), keyed_of);
    repo.backup_stream("direct", "g", &bytes[..]).unwrap();
    let server = Running::serving(repo, dir.path(), ServerLimits::default());
    let c = server.client();
    let opts = BackupOptions::default();
    // A client hashing without the key would send fingerprints the server
    // refuses ("its bytes hash to ..."), and find nothing to reuse.
    let first = c
        .backup_stream("served", "g", &bytes[..], None, &opts, &|_| {})
        .unwrap();
    assert_eq!(first.report.segments_new, 0, "{first:?}");
    let mut more = bytes.clone();
    more.extend_from_slice(&noise(22, 300_000));
    let second = c
        .backup_stream("more", "g", &more[..], None, &opts, &|_| {})
        .unwrap();
    assert!(second.report.segments_duplicate > 0, "{second:?}");
    let mut out = Vec::new();
    c.restore("more", &mut out).unwrap();
    assert!(out == more);
    server.shut();
    let repo = Repository::open_read_only(dir.path().join("repo")).unwrap();
    let mut out = Vec::new();
    repo.restore("served", &mut out).unwrap();
    assert!(out == bytes);
}
