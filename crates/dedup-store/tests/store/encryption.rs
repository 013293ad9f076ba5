//! An encrypted repository: backups of files and streams round trip, the
//! directory under it holds no file name, no content and no plain
//! fingerprint, deduplication works across sessions on keyed
//! fingerprints, a flipped byte in any object is refused naming it, the
//! wrong passphrase or none is refused by name, a config swapped for one
//! in the clear is refused, and passphrases can be added and removed.

use std::fs;
use std::path::{Path, PathBuf};

use dedup_store::crypto::passphrase::for_this_thread;
use dedup_store::crypto::KdfParams;
use dedup_store::{CheckOptions, RepoError, RepoOptions, Repository, RestoreOptions, Segmenting};

const PASSPHRASE: &[u8] = b"correct horse battery staple";
/// Found in a file's name and in its contents.
const SECRET_NAME: &str = "quarterly-payroll-2026.csv";
const SECRET_LINE: &[u8] = b"alice,engineering,123456.78\n";

fn options() -> RepoOptions {
    RepoOptions {
        segmenting: Segmenting::Fixed { size: 4096 },
        container_target: 256 << 10,
        encryption: Some(KdfParams::FOR_TESTS),
        ..RepoOptions::default()
    }
}

fn tree(root: &Path) -> PathBuf {
    let data = root.join("data");
    fs::create_dir_all(data.join("hr")).unwrap();
    fs::write(data.join("hr").join(SECRET_NAME), SECRET_LINE.repeat(3000)).unwrap();
    let noise: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(data.join("noise.bin"), &noise).unwrap();
    data
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn an_encrypted_repository_round_trips_and_shows_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let _p = for_this_thread(PASSPHRASE);
    let data = tree(tmp.path());
    let dir = tmp.path().join("repo");
    let repo = Repository::init_with(&dir, options()).unwrap();
    assert!(repo.is_encrypted());
    repo.backup_paths("files", "g", &[&data], |_| {}).unwrap();
    let stream = SECRET_LINE.repeat(5000);
    repo.backup_stream("stream", "g", &stream[..]).unwrap();
    // Keyed fingerprints still deduplicate: the same bytes again store nothing.
    let again = repo.backup_stream("stream2", "g", &stream[..]).unwrap();
    assert_eq!(again.segments_new, 0, "{again:?}");
    drop(repo);

    let repo = Repository::open(&dir).unwrap();
    let mut out = Vec::new();
    repo.restore("stream", &mut out).unwrap();
    assert_eq!(out, stream);
    let target = tmp.path().join("restored");
    repo.restore_tree("files", &target, &RestoreOptions::default())
        .unwrap();
    let mut restored_files = Vec::new();
    all_files(&target, &mut restored_files);
    let secret = restored_files.iter().find(|f| f.ends_with(SECRET_NAME));
    let restored = fs::read(secret.expect("the file restored")).unwrap();
    assert_eq!(restored, SECRET_LINE.repeat(3000));
    let report = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);

    // Nothing in the clear: no file name, no content, no plain fingerprint
    // of a segment (BLAKE3 of a 4 KiB block of the stream).
    let block = &stream[..4096];
    let plain_fp = blake3::hash(block);
    let mut files = Vec::new();
    all_files(&dir, &mut files);
    assert!(files.len() > 5, "{files:?}");
    let holders = |needle: &[u8]| -> Vec<String> {
        (files.iter())
            .filter(|f| holds(&fs::read(f).unwrap(), needle))
            .map(|f| f.display().to_string())
            .collect()
    };
    let none: Vec<String> = Vec::new();
    assert_eq!(holders(SECRET_NAME.as_bytes()), none, "the file name");
    assert_eq!(holders(&SECRET_LINE[..16]), none, "the contents");
    assert_eq!(
        holders(&plain_fp.as_bytes()[..16]),
        none,
        "a plain fingerprint"
    );
    let magic: Vec<String> = holders(b"DDUP")
        .into_iter()
        .filter(|f| !f.contains("/keys/"))
        .collect();
    assert_eq!(magic, none, "a dedup magic");
}

#[test]
fn without_the_passphrase_nothing_opens_and_errors_say_how() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    {
        let _p = for_this_thread(PASSPHRASE);
        Repository::init_with(&dir, options()).unwrap();
    }
    let _wrong = for_this_thread(b"not it");
    match Repository::open_read_only(&dir) {
        Err(e @ RepoError::WrongPassphrase { keys: 1, .. }) => {
            assert!(e.to_string().contains(&dir.display().to_string()), "{e}")
        }
        other => panic!("{:?}", other.err()),
    }
    drop(_wrong);
    // No passphrase at all (DEDUP_PASSWORD is not set in the tests).
    if std::env::var_os("DEDUP_PASSWORD").is_none()
        && std::env::var_os("DEDUP_PASSWORD_FILE").is_none()
    {
        let e = Repository::open_read_only(&dir).err().expect("refused");
        assert!(matches!(e, RepoError::NeedsPassphrase { .. }), "{e}");
        assert!(e.to_string().contains("DEDUP_PASSWORD"), "{e}");
    }
}

#[test]
fn a_config_in_the_clear_beside_keys_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let plain_dir = tmp.path().join("plain");
    let plain = RepoOptions {
        encryption: None,
        ..options()
    };
    Repository::init_with(&plain_dir, plain).unwrap();
    {
        let _p = for_this_thread(PASSPHRASE);
        Repository::init_with(&dir, options()).unwrap();
    }
    fs::remove_file(dir.join("config")).unwrap();
    fs::copy(plain_dir.join("config"), dir.join("config")).unwrap();
    let _p = for_this_thread(PASSPHRASE);
    let e = Repository::open(&dir).err().expect("refused");
    assert!(e.to_string().contains("replaced"), "{e}");
}

#[test]
fn every_flipped_byte_is_refused_naming_its_object() {
    let tmp = tempfile::tempdir().unwrap();
    let _p = for_this_thread(PASSPHRASE);
    let data = tree(tmp.path());
    let dir = tmp.path().join("repo");
    let repo = Repository::init_with(&dir, options()).unwrap();
    repo.backup_paths("files", "g", &[&data], |_| {}).unwrap();
    drop(repo);
    let mut files = Vec::new();
    all_files(&dir, &mut files);
    files.retain(|f| !f.starts_with(dir.join("keys")) && !f.ends_with("config"));
    // Containers, a recipe, a backup, a tree at least.
    assert!(files.len() >= 4, "{files:?}");
    for f in files {
        let object = f.strip_prefix(&dir).unwrap().display().to_string();
        let good = fs::read(&f).unwrap();
        for at in [0, good.len() / 3, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            fs::write(&f, &bad).unwrap();
            let repo = Repository::open_read_only(&dir).unwrap();
            let report = repo.check(CheckOptions { data: true }, &|_| {}).unwrap();
            let named = report
                .problems
                .iter()
                .any(|p| p.object == object || p.detail.contains(&object));
            assert!(named, "{object} byte {at}: {:?}", report.problems);
            fs::write(&f, &good).unwrap();
        }
    }
    // The config and a key: the open is refused, naming them.
    let key = fs::read_dir(dir.join("keys"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let key = format!("keys/{}", key.file_name().to_str().unwrap());
    for object in ["config", key.as_str()] {
        let f = dir.join(object);
        let good = fs::read(&f).unwrap();
        let mut bad = good.clone();
        bad[good.len() / 2] ^= 1;
        fs::write(&f, &bad).unwrap();
        let e = Repository::open_read_only(&dir).err().expect("refused");
        assert!(e.to_string().contains(object), "{e}");
        fs::write(&f, &good).unwrap();
    }
}

#[test]
fn passphrases_are_added_listed_and_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let first = {
        let _p = for_this_thread(PASSPHRASE);
        let repo = Repository::init_with(&dir, options()).unwrap();
        let keys = repo.list_keys().unwrap();
        assert_eq!(keys.len(), 1);
        assert!(keys[0].current);
        let second = repo.add_key(b"second", KdfParams::FOR_TESTS).unwrap();
        assert_eq!(repo.list_keys().unwrap().len(), 2);
        let e = repo.remove_key(&keys[0].name).expect_err("its own key");
        assert!(e.to_string().contains("this passphrase opens"), "{e}");
        assert!(second.starts_with("keys/"));
        keys[0].name.clone()
    };
    let _p = for_this_thread(b"second");
    let repo = Repository::open_read_only(&dir).unwrap();
    repo.remove_key(&first).unwrap();
    assert!(repo.remove_key(&first).is_err(), "gone already");
    drop(repo);
    let _old = for_this_thread(PASSPHRASE);
    assert!(matches!(
        Repository::open_read_only(&dir),
        Err(RepoError::WrongPassphrase { .. })
    ));
}

#[test]
fn a_repository_in_the_clear_is_not_written_to_while_a_passphrase_is_given() {
    // Whoever can write the bucket replaced an encrypted repository with
    // one in the clear: a backup run with the passphrase must not write
    // into it unsealed. Reading it is harmless and allowed.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    Repository::init_with(
        &dir,
        RepoOptions {
            encryption: None,
            ..options()
        },
    )
    .unwrap();
    let _p = for_this_thread(PASSPHRASE);
    let e = Repository::open(&dir).err().expect("refused");
    assert!(e.to_string().contains("not encrypted"), "{e}");
    assert!(e.to_string().contains("DEDUP_PASSWORD"), "{e}");
    Repository::open_read_only(&dir).unwrap();
}

#[test]
fn an_empty_passphrase_makes_no_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let _p = for_this_thread(b"");
    let e = Repository::init_with(&dir, options())
        .err()
        .expect("refused");
    assert!(e.to_string().contains("passphrase is empty"), "{e}");
    assert!(!dir.join("keys").exists() || fs::read_dir(dir.join("keys")).unwrap().next().is_none());
}

#[test]
fn a_stray_key_object_neither_blocks_the_repository_nor_is_left_by_a_refused_init() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let _p = for_this_thread(PASSPHRASE);
    Repository::init_with(&dir, options()).unwrap();
    // init --force over it: refused, and no second key object is left.
    let force = RepoOptions {
        force: true,
        ..options()
    };
    assert!(Repository::init_with(&dir, force).is_err());
    assert_eq!(fs::read_dir(dir.join("keys")).unwrap().count(), 1);
    // A key object of another master key under the same passphrase,
    // sorting first: it opens, but not the config, so the next is tried.
    let other = tmp.path().join("other");
    Repository::init_with(&other, options()).unwrap();
    let stray = fs::read_dir(other.join("keys"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    fs::copy(stray.path(), dir.join("keys/0000000000000000")).unwrap();
    let repo = Repository::open(&dir).unwrap();
    assert!(repo.is_encrypted());
}
