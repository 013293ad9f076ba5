//! `dedup store serve`: hold a repository open for writing and serve
//! backups to many clients at once (§3.4) over a Unix socket or TCP,
//! until SIGINT or SIGTERM, which abort the running backups (they leave no
//! backup) and remove the socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dedup_store::RepoLocation;

use anyhow::{bail, Context};
use dedup_store::rpc::{Endpoint, Server, ServerLimits, DEFAULT_IDLE_TIMEOUT};

use super::shared::args::IndexArgs;
use super::shared::psk::key_from_file;
use super::shared::repo::open_indexed;

#[derive(clap::Args)]
#[command(
    about = "Serve a backup repository to backup clients (dedup backup --server)",
    after_help = "The server holds the repository open for writing: backups from any number of clients run concurrently through it, and other processes may still list and restore from the directory read-only. Clients cut and hash their streams themselves and send only the segments the repository lacks. SIGINT or SIGTERM stops it: running backups are aborted and leave no backup.\n\nWho gets in: a Unix socket is created owner-only (0600), so only its owner (and root) can connect. Any local user can connect to a TCP port, even on loopback, so TCP needs a key: make a key file with `dedup tls-psk FILE`, serve with --psk FILE, and give clients a copy (--psk on their side; the first USER:HEXKEY line is the key). Each connection proves it holds the key before anything else, and the server proves it back, so a client never sends its data to another process that took the port. Every TCP connection is TLS 1.3, and both proofs cover the TLS session (its exported keying material), so a man in the middle can neither read nor alter a backup, nor relay the proofs. With a key, TCP may listen on any address; without one (--no-auth), on loopback only unless --allow-remote.\n\nExamples:\n  dedup store serve ./repo --socket /run/dedup-backup.sock\n  tar -cf - DIR | dedup backup --server unix:/run/dedup-backup.sock NAME --stdin\n  dedup tls-psk backup.psk && dedup store serve ./repo --listen 127.0.0.1:7070 --psk backup.psk\n  dedup backup --server tcp:127.0.0.1:7070 --psk backup.psk NAME /home"
)]
pub struct Args {
    /// Repository directory.
    pub repo: RepoLocation,
    /// Unix socket to create (owner-only, removed at exit).
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    pub socket: Option<PathBuf>,
    /// TCP address to listen on, e.g. 127.0.0.1:7070.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Serve only clients that prove they hold the key in this file (make
    /// one with `dedup tls-psk FILE`); needed with --listen.
    #[arg(long, value_name = "FILE")]
    pub psk: Option<PathBuf>,
    /// Serve --listen without a key: every local user (and, with
    /// --allow-remote, anyone who reaches the address) can then list,
    /// restore, add and delete backups.
    #[arg(long, conflicts_with = "psk", requires = "listen")]
    pub no_auth: bool,
    /// Allow --listen --no-auth on an address that is not loopback: the
    /// channel is TLS, but without a key anyone who reaches the address
    /// gets in, and nothing proves to a client that it reached this
    /// server. (With --psk any address is allowed.)
    #[arg(long, requires = "listen")]
    pub allow_remote: bool,
    /// Most client connections at once. With --psk, when all are taken a
    /// new connection closes the oldest one that has not proved the key
    /// yet (never one that has).
    #[arg(long, default_value_t = ServerLimits::default().max_connections)]
    pub max_connections: usize,
    /// Seconds a client may send nothing before its connection is closed
    /// and its backups aborted (0: never). Frees the slot of a client that
    /// vanished without closing.
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout: u64,
    /// The fingerprint index the server keeps (as `dedup backup`'s).
    #[command(flatten)]
    pub index: IndexArgs,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let at = match (&a.socket, a.listen) {
        (Some(p), _) => Endpoint::Unix(p.clone()),
        (None, Some(addr)) => {
            if a.psk.is_none() && !a.no_auth {
                bail!("--listen needs a key: every local user can connect to {addr}, and without one could restore, add and delete backups. Make one with `dedup tls-psk FILE` and give --psk FILE here and to the clients (or --no-auth to serve without, on a machine whose users you trust)");
            }
            if !addr.ip().is_loopback() && a.no_auth {
                if !a.allow_remote {
                    bail!("{addr} is not a loopback address, and without a key anyone who reaches it could list, restore, add and delete backups, and a client could not tell this server from a man in the middle. Give --psk FILE, or --allow-remote to do it anyway, on a network you trust");
                }
                eprintln!("dedup: warning: listening on {addr} without a key: the traffic is TLS, but anyone who reaches the address gets in");
            }
            if a.no_auth {
                eprintln!("dedup: warning: serving {addr} with no key: every user who can reach it can list, restore, add and delete backups");
            }
            Endpoint::Tcp(addr)
        }
        (None, None) => bail!("give --socket PATH or --listen ADDR"),
    };
    // A bad key file is refused before the repository is opened.
    let key = a.psk.as_deref().map(key_from_file).transpose()?;
    let repo = open_indexed(&a.repo, &a.index)?;
    let limits = ServerLimits {
        max_connections: a.max_connections.max(1),
        // Zero is none: the server's own reading of it.
        idle_timeout: Some(Duration::from_secs(a.idle_timeout)),
        ..ServerLimits::default()
    };
    let server = Server::bind_with_key(repo, &at, limits, key)
        .with_context(|| format!("serving on {at}"))?;
    let stop = server.stop_handle();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM])
        .context("installing signal handlers")?;
    let signals_handle = signals.handle();
    let watcher = std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!("dedup: signal {sig}: stopping; running backups are aborted");
            stop.stop();
        }
    });
    eprintln!(
        "dedup: serving {} on {}{} (stop with Ctrl-C or SIGTERM)",
        a.repo,
        server.endpoint(),
        match &a.psk {
            Some(p) => format!(" to clients holding the key in {}", p.display()),
            None => String::new(),
        }
    );
    let served = server.run();
    signals_handle.close();
    let _ = watcher.join();
    served.context("serving")?;
    eprintln!("dedup: stopped; the repository is closed");
    Ok(ExitCode::SUCCESS)
}
