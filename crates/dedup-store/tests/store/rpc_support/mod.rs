//! A server of a new repository on a temporary socket, in this process,
//! for the RPC tests.

#![allow(dead_code)] // each test file uses some of it

use std::path::Path;
use std::thread::JoinHandle;

use dedup_store::rpc::protocol::{Call, Reply};
use dedup_store::rpc::{Client, Endpoint, Key, Server, ServerLimits, StopHandle};
use dedup_store::{Container, LocalDir, ObjectStore, Repository};

pub struct Running {
    pub at: Endpoint,
    pub stop: StopHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    /// The server must have stopped without an error (checked at drop).
    strict: bool,
}

impl Running {
    pub fn with_limits(dir: &Path, limits: ServerLimits) -> Running {
        let repo = Repository::open(dir.join("repo")).unwrap();
        // Recipes of many parts, each written as its session goes.
        repo.set_recipe_part_segments(64);
        Running::serving(repo, dir, limits)
    }

    /// Serve `repo` on a socket in `dir`.
    pub fn serving(repo: Repository, dir: &Path, limits: ServerLimits) -> Running {
        let server = Server::bind(repo, &Endpoint::Unix(dir.join("s.sock")), limits).unwrap();
        Running::run(server, false)
    }

    /// Serve `repo` at `at` (a TCP port 0 is resolved) with `key`; at drop
    /// the server must stop without an error.
    pub fn bound(
        repo: Repository,
        at: &Endpoint,
        limits: ServerLimits,
        key: Option<Key>,
    ) -> Running {
        let server = Server::bind_with_key(repo, at, limits, key).unwrap();
        Running::run(server, true)
    }

    fn run(server: Server, strict: bool) -> Running {
        let (at, stop) = (server.endpoint().clone(), server.stop_handle());
        Running {
            at,
            stop,
            thread: Some(std::thread::spawn(move || server.run())),
            strict,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.at).unwrap()
    }

    pub fn shut(mut self) {
        self.stop.stop();
        self.thread.take().unwrap().join().unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.stop();
            let ended = t.join();
            if self.strict {
                ended.unwrap().unwrap();
            }
        }
    }
}

pub fn setup() -> (tempfile::TempDir, Running) {
    setup_with(ServerLimits::default())
}

/// A new repository served with `limits`.
pub fn setup_with(limits: ServerLimits) -> (tempfile::TempDir, Running) {
    let dir = tempfile::tempdir().unwrap();
    Repository::init(dir.path().join("repo")).unwrap();
    let r = Running::with_limits(dir.path(), limits);
    (dir, r)
}

/// Begin backup `name` in group `g`; its session.
pub fn begin(c: &Client, name: &str) -> u64 {
    let begun = c.call(Call::BeginBackup {
        name: name.into(),
        group: "g".into(),
    });
    match begun.unwrap() {
        Reply::Begun { session, .. } => session,
        other => panic!("beginning {name}: {other:?}"),
    }
}

/// The stream of backup `name` in the repository under `dir`.
pub fn restored(dir: &Path, name: &str) -> Vec<u8> {
    let repo = Repository::open_read_only(dir.join("repo")).unwrap();
    let mut out = Vec::new();
    repo.restore(name, &mut out).unwrap();
    out
}

/// Copies of the segment fingerprinted `fp` in the containers of the
/// repository under `dir`.
pub fn copies(dir: &Path, fp: [u8; 32]) -> usize {
    let store = LocalDir::open(dir.join("repo")).unwrap();
    let names = store.list("containers/").unwrap();
    (names.iter())
        .map(|name| {
            let c = Container::parse(name, store.get(name).unwrap()).unwrap();
            let entries = c.catalog().entries();
            entries.iter().filter(|e| e.fingerprint.0 == fp).count()
        })
        .sum()
}
