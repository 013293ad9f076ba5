//! `dedup store serve`: hold a repository open for writing and serve
//! backups to many clients at once (§3.4) over a Unix socket or TCP,
//! until SIGINT or SIGTERM, which abort the running backups (they leave no
//! backup) and remove the socket.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use dedup_store::rpc::{Endpoint, Server, ServerLimits, DEFAULT_IDLE_TIMEOUT};

#[derive(clap::Args)]
#[command(
    about = "Serve a backup repository to backup clients (dedup backup --server)",
    after_help = "The server holds the repository open for writing: backups from any number of clients run concurrently through it, and other processes may still list and restore from the directory read-only. Clients cut and hash their streams themselves and send only the segments the repository lacks. SIGINT or SIGTERM stops it: running backups are aborted and leave no backup.\n\nThere is no authentication or TLS yet: a Unix socket is created owner-only (0600), and TCP listens on loopback only unless --allow-remote.\n\nExamples:\n  dedup store serve ./repo --socket /run/dedup-backup.sock\n  tar -cf - DIR | dedup backup --server unix:/run/dedup-backup.sock NAME --stdin\n  dedup store serve ./repo --listen 127.0.0.1:7070"
)]
pub struct Args {
    /// Repository directory.
    pub repo: PathBuf,
    /// Unix socket to create (owner-only, removed at exit).
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    pub socket: Option<PathBuf>,
    /// TCP address to listen on, e.g. 127.0.0.1:7070.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Allow --listen on an address that is not loopback (no
    /// authentication or TLS yet: anyone who reaches it can back up,
    /// list and delete).
    #[arg(long)]
    pub allow_remote: bool,
    /// Most client connections at once.
    #[arg(long, default_value_t = ServerLimits::default().max_connections)]
    pub max_connections: usize,
    /// Seconds a client may send nothing before its connection is closed
    /// and its backups aborted (0: never). Frees the slot of a client that
    /// vanished without closing.
    #[arg(long, default_value_t = DEFAULT_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout: u64,
    /// The fingerprint index the server keeps (as `dedup backup`'s).
    #[command(flatten)]
    pub index: super::store::IndexArgs,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let at = match (&a.socket, a.listen) {
        (Some(p), _) => Endpoint::Unix(p.clone()),
        (None, Some(addr)) => {
            if !addr.ip().is_loopback() {
                if !a.allow_remote {
                    bail!("{addr} is not a loopback address: the server has no authentication or TLS yet, so anyone who reaches it could read the repository's backups list, add and delete backups. Give --allow-remote to do it anyway, on a network you trust");
                }
                eprintln!("dedup: warning: listening on {addr} with no authentication and no TLS: anyone who reaches this address can back up, list and delete backups");
            }
            Endpoint::Tcp(addr)
        }
        (None, None) => bail!("give --socket PATH or --listen ADDR"),
    };
    let repo = super::store::open_indexed(&a.repo, &a.index)?;
    let limits = ServerLimits {
        max_connections: a.max_connections.max(1),
        // Zero is none: the server's own reading of it.
        idle_timeout: Some(Duration::from_secs(a.idle_timeout)),
        ..ServerLimits::default()
    };
    let server = Server::bind(repo, &at, limits).with_context(|| format!("serving on {at}"))?;
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
        "dedup: serving {} on {} (stop with Ctrl-C or SIGTERM)",
        a.repo.display(),
        server.endpoint()
    );
    let served = server.run();
    signals_handle.close();
    let _ = watcher.join();
    served.context("serving")?;
    eprintln!("dedup: stopped; the repository is closed");
    Ok(ExitCode::SUCCESS)
}
