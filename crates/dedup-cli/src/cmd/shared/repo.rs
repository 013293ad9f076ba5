//! Reaching a backup repository: opened here, to write (with the
//! fingerprint index the command asks for) or read-only beside a process
//! that writes; or through a running `dedup store serve` (`--server`).

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use dedup_store::rpc::{Client, Endpoint};
use dedup_store::{RepoLocation, Repository};

use super::args::IndexArgs;
use super::psk::key_from_file;

/// Open `repo` to write (backup, delete, gc) with the index `index` asks for.
pub fn open_indexed(repo: &RepoLocation, index: &IndexArgs) -> anyhow::Result<Repository> {
    if index.exact_index {
        return open(repo);
    }
    Ok(Repository::open_sampled(repo, index.config())?)
}

/// Open `repo` to write (backup, delete): one writing process at a time.
pub fn open(repo: &RepoLocation) -> anyhow::Result<Repository> {
    Ok(Repository::open(repo)?)
}

/// Open `repo` to read (list, restore, stats): no lock, no index, so it
/// works beside a process that writes.
pub fn open_read_only(repo: &RepoLocation) -> anyhow::Result<Repository> {
    Ok(Repository::open_read_only(repo)?)
}

/// Where a client command reaches its server, and how.
pub struct Remote<'a> {
    pub server: &'a Endpoint,
    /// Give up after this many seconds without an answer (`--timeout`;
    /// 0: never).
    pub timeout: u64,
    /// The key file (`--psk`) whose key this client and the server prove
    /// to each other they hold.
    pub psk: Option<&'a Path>,
    /// `--no-auth`: connect over TCP without a key.
    pub no_auth: bool,
}

impl Remote<'_> {
    pub fn connect(&self) -> anyhow::Result<Client> {
        // Any local user can listen on a TCP port: without the key, the
        // client cannot tell the server from another process on it.
        if matches!(self.server, Endpoint::Tcp(_)) && self.psk.is_none() && !self.no_auth {
            bail!(
                "{} is TCP: give --psk FILE (a copy of the server's key file), so that the client checks it reaches the server and not another process on the port; --no-auth connects without one, to a server started with --no-auth",
                self.server
            );
        }
        let key = self.psk.map(key_from_file).transpose()?;
        let timeout = Some(Duration::from_secs(self.timeout));
        Ok(Client::connect_with_key(
            self.server,
            timeout,
            key.as_ref(),
        )?)
    }
}
