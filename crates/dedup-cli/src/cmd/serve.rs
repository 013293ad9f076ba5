//! `dedup serve`: run nbdkit with the dedup plugin on a device, in the
//! foreground, until SIGINT/SIGTERM; then nbdkit unloads the plugin, which
//! saves the metadata and marks the device clean.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use dedup_core::layout::{self, DevicePaths};
use dedup_core::lock::DeviceLock;
use dedup_core::size::format_size;
use dedup_core::superblock::DeviceState;

use super::access::{self, Access, Credentials, TlsMode};
use super::nbdkit::{find_plugin, find_program, Listen, Nbdkit};
use super::shared::args::{index_memory_arg, size_arg};
use super::shared::device::control_path;
use super::shared::EXIT_FAILURE;
const NBD_SOCKET_NAME: &str = "nbd.sock";
const PID_FILE_NAME: &str = "nbdkit.pid";

#[derive(clap::Args)]
#[command(
    about = "Serve a device over NBD (runs nbdkit with the dedup plugin) until Ctrl-C",
    after_help = "Examples:\n  dedup serve ./dev                      # Unix socket ./dev/nbd.sock, yours alone (0600)\n  dedup serve ./dev --port 10809         # TCP on localhost: every local user can connect\n  dedup tls-psk ./dev.psk && dedup serve ./dev --port 10809 --bind 0.0.0.0 --tls require --tls-psk ./dev.psk\n  dedup serve ./dev --read-only          # clients cannot write\n  dedup serve ./dev --accept-unclean     # roll back after a crash\n  dedup serve ./dev --record build.trace # capture the workload for `dedup replay`\n  dedup serve ./dev --writeback 0        # apply every write before acknowledging it\n\nAttach the device with nbd-client, qemu, or nbdfuse + losetup (printed when ready)."
)]
pub struct Args {
    /// Device directory made by `dedup create`.
    pub dir: PathBuf,
    /// Unix socket to listen on (default: DIR/nbd.sock).
    #[arg(long, conflicts_with = "port")]
    pub socket: Option<PathBuf>,
    /// TCP port to listen on instead of a Unix socket.
    #[arg(long)]
    pub port: Option<u16>,
    /// Address to bind with --port. Anything but loopback (127.0.0.0/8,
    /// ::1, localhost) is refused unless TLS is required (--tls require)
    /// or --insecure is given: NBD has no password of its own.
    #[arg(long, default_value = "127.0.0.1", requires = "port")]
    pub bind: String,
    /// TLS for NBD connections (nbdkit --tls): off; allow (each client
    /// chooses); require (connections without TLS are refused). Default:
    /// require with --tls-psk or --tls-certificates, else off.
    #[arg(long, value_enum)]
    pub tls: Option<TlsMode>,
    /// Pre-shared key file for TLS (USERNAME:HEXKEY lines), made by
    /// `dedup tls-psk FILE`; clients need a copy.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Directory with the server's X.509 certificates for TLS
    /// (ca-cert.pem, server-cert.pem, server-key.pem; see nbdkit-tls(1)).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Serve a non-loopback --bind address without TLS: anyone who reaches
    /// the port can then read and overwrite the whole device.
    #[arg(long)]
    pub insecure: bool,
    /// Export the device read-only: clients' writes, trims and zeroes fail
    /// (EPERM). Not an offline mode: the device is opened as usual, its
    /// metadata saved at stop, and `dedup gc` still changes it.
    #[arg(long)]
    pub read_only: bool,
    /// After an unclean stop, roll back to the last clean state (each chunk
    /// verified against its fingerprint) instead of refusing to serve.
    #[arg(long)]
    pub accept_unclean: bool,
    /// Metadata cache size for this run (default: the one chosen at create).
    #[arg(long, value_parser = size_arg)]
    pub cache: Option<u64>,
    /// sparse: the hash index's RAM budget for this run (default: the one
    /// chosen at create). Another budget than the last run's rebuilds the
    /// index from the chunk records at start.
    #[arg(long, value_parser = index_memory_arg)]
    pub index_memory: Option<u64>,
    /// sparse: of the index's memory, how much holds prefetched
    /// fingerprints (default an eighth). For experiments: the cache the
    /// streams need does not grow with the data the way the table does.
    #[arg(long, value_parser = size_arg)]
    pub index_cache: Option<u64>,
    /// nbdkit worker threads per connection (requests in flight on
    /// each). Default: twice the CPUs, 4 to 16.
    #[arg(long, default_value_t = default_threads())]
    pub threads: u32,
    /// Write-back queue: a write that arrives alone is acknowledged once
    /// copied here, up to SIZE in all, and applied in the background;
    /// FLUSH and FUA wait for it. 0 applies every write before
    /// acknowledging it.
    #[arg(long, value_name = "SIZE", value_parser = size_arg, default_value = "32M")]
    pub writeback: u64,
    /// Record every completed request (time, op, offset, length, a 128-bit
    /// blake3 per 4 KiB block written; no data) to FILE, to replay later
    /// with `dedup replay FILE DIR`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// The nbdkit plugin (default: libdedup_nbd.so next to this program).
    #[arg(long, env = "DEDUP_PLUGIN")]
    pub plugin: Option<PathBuf>,
    /// The nbdkit program.
    #[arg(long, env = "NBDKIT", default_value = "nbdkit")]
    pub nbdkit: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let dir = std::path::absolute(&a.dir).context("resolving the device directory")?;
    let paths = DevicePaths::from_dir(&dir)?;
    // Fail early, with our own words, on the common refusals: in use
    // first, and the configuration read under the lock, so a server or
    // repair writing it at that moment is reported as what it is.
    let lock = DeviceLock::acquire(&paths.meta)?;
    let (cfg, state) = layout::read_config(&paths)?;
    drop(lock);
    if state == DeviceState::Open {
        if !dedup_core::registry::crash_safe(&cfg.backend) && !a.accept_unclean {
            return Err(dedup_core::Error::Unclean {
                path: paths.meta.clone(),
                backend: cfg.backend.clone(),
            }
            .into());
        }
        if dedup_core::registry::crash_safe(&cfg.backend) {
            eprintln!(
                "dedup: the device was not shut down cleanly; the {} backend recovers on its own",
                cfg.backend
            );
        }
    }
    let plugin = find_plugin(a.plugin)?;
    let nbdkit = find_program(&a.nbdkit)?;
    let pidfile = dir.join(PID_FILE_NAME);
    // Left by a server that was killed; readiness below waits for a new one.
    dedup_core::control::remove_stale_socket(&control_path(&dir))?;
    let listen = match (a.port, a.socket) {
        (Some(port), _) => Listen::Tcp {
            bind: a.bind.clone(),
            port,
        },
        (None, Some(s)) => Listen::Unix(std::path::absolute(s).context("resolving --socket")?),
        (None, None) => Listen::Unix(dir.join(NBD_SOCKET_NAME)),
    };
    let access = Access::new(a.tls, a.tls_psk, a.tls_certificates, a.read_only)?;
    access::check_exposure(&listen, access.tls, a.insecure)?;
    let mut plugin_args: Vec<OsString> =
        vec![plugin.into(), format!("dir={}", dir.display()).into()];
    if a.accept_unclean {
        plugin_args.push("accept_unclean=true".into());
    }
    if let Some(cache) = a.cache {
        plugin_args.push(format!("cache={cache}").into());
    }
    if let Some(budget) = a.index_memory {
        plugin_args.push(format!("index_memory={budget}").into());
    }
    if let Some(cache) = a.index_cache {
        plugin_args.push(format!("index_cache={cache}").into());
    }
    if let Some(record) = &a.record {
        let path = std::path::absolute(record).context("resolving --record")?;
        plugin_args.push(format!("record={}", path.display()).into());
    }
    plugin_args.push(format!("writeback={}", a.writeback).into());
    let mut server = Nbdkit::spawn(
        &nbdkit,
        &listen,
        &pidfile,
        a.threads,
        &access.nbdkit_args(),
        &plugin_args,
    )?;
    let pid = server.pid();

    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
            .context("installing signal handlers")?;
    let forwarder = signals.handle();
    let control_sock = control_path(&dir);
    std::thread::spawn(move || stop_on_signals(&mut signals, pid, &control_sock));

    let control = control_path(&dir);
    if let Some(status) = server.wait_ready(|| control.exists())? {
        forwarder.close();
        eprintln!("dedup: nbdkit stopped before serving ({status}); see its message above");
        return Ok(ExitCode::from(EXIT_FAILURE));
    }
    let uri = match access.tls {
        TlsMode::Require => access.tls_uri(&listen),
        TlsMode::Off | TlsMode::Allow => listen.uri(),
    };
    outln!(
        "dedup: serving {} ({} logical, {} backend, {} chunks{}) at {uri}",
        dir.display(),
        format_size(cfg.logical_size),
        cfg.backend,
        format_size(cfg.chunk_size as u64),
        if access.read_only { ", read-only" } else { "" }
    );
    print_attach(&listen, &access);
    outln!(
        "Status: dedup status {}    Stop: Ctrl-C or SIGTERM (metadata is saved on a clean stop)",
        dir.display()
    );

    let status = server.wait()?;
    forwarder.close();
    let clean = match layout::read_config(&paths) {
        Ok((_, DeviceState::Clean)) => {
            eprintln_safe("dedup: stopped; metadata saved cleanly");
            true
        }
        Ok((_, DeviceState::Open)) => {
            eprintln_safe(&format!(
                "dedup: error: the metadata was not saved at stop (nbdkit exited {status}; its log above says why). {}",
                unsaved_advice(&cfg.backend, &dir)
            ));
            false
        }
        Err(e) => {
            eprintln_safe(&format!(
                "dedup: warning: cannot read the device state after stopping: {e}"
            ));
            false
        }
    };
    // Success is a saved device: nbdkit exits 0 when its unload failed to
    // save, and ends by SIGKILL after a second Ctrl-C that saved.
    Ok(if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILURE)
    })
}

/// What to do about a stop that did not save, for the device's store: a
/// crash-safe one recovers by its journal (no --accept-unclean: that is
/// for stores saved only at a clean stop).
fn unsaved_advice(backend: &str, dir: &Path) -> String {
    if dedup_core::registry::crash_safe(backend) {
        format!(
            "The {backend} store recovers from its journal when served again, losing nothing acknowledged; \
             if the filesystem holding {} is full, free space on it first.",
            dir.display()
        )
    } else {
        format!(
            "The {backend} store keeps only its last clean stop: free space on the filesystem holding {} if it is full, \
             then serve it again with --accept-unclean to roll back to that stop.",
            dir.display()
        )
    }
}

/// How to attach the device, for the ways it is served.
fn print_attach(listen: &Listen, access: &Access) {
    if access.tls != TlsMode::Require {
        let uri = listen.uri();
        let attach = match listen {
            Listen::Unix(sock) => format!("nbd-client -unix {} /dev/nbd0", sock.display()),
            Listen::Tcp { bind, port } => format!("nbd-client {bind} {port} /dev/nbd0"),
        };
        outln!("Attach it:");
        outln!("  kernel NBD client:  modprobe nbd && {attach}");
        outln!("  without nbd module: mkdir -p /mnt/dedup && nbdfuse /mnt/dedup/ '{uri}' &");
        outln!("                      losetup -f --show /mnt/dedup/nbd   # then mkfs.ext4 / mount the loop device");
        outln!(
            "  or with qemu-nbd:   modprobe nbd && qemu-nbd --connect=/dev/nbd0 --format=raw '{uri}'"
        );
        outln!("  qemu:               qemu-img info '{uri}'  (or -drive file={uri},format=raw)");
    }
    if access.tls != TlsMode::Off {
        let uri = access.tls_uri(listen);
        match &access.creds {
            Credentials::Psk { file, .. } => outln!(
                "Attach it with TLS (clients need a copy of {}, kept 0600):",
                file.display()
            ),
            _ => outln!(
                "Attach it with TLS (clients check the server against their CA: libnbd looks in /etc/pki/libnbd, or add &tls-certificates=DIR to the URI):"
            ),
        }
        outln!("  libnbd tools:       nbdinfo '{uri}'   (nbdcopy, nbdfuse take the same URI)");
        outln!("  without nbd module: mkdir -p /mnt/dedup && nbdfuse /mnt/dedup/ '{uri}' &");
        outln!("                      losetup -f --show /mnt/dedup/nbd");
        outln!(
            "  qemu:               {}",
            access::qemu_tls_command(access, listen)
        );
        if let Credentials::Psk { file, .. } = &access.creds {
            if file.file_name().is_none_or(|n| n != "keys.psk") {
                outln!(
                    "                      (qemu reads the key as KEYDIR/keys.psk: copy {} there)",
                    file.display()
                );
            }
        }
        outln!("  kernel NBD client:  nbd-client has no PSK; use nbdfuse, or certificates (see docs/operations.md, Security)");
    }
    // Plain NBD over TCP: say who else can reach it (check_exposure let
    // a non-loopback address through only with --insecure).
    match listen {
        Listen::Tcp { bind, port } if access.tls != TlsMode::Require => {
            if access::is_loopback(bind) {
                outln!(
                    "Note: every local user can connect to TCP port {port} without TLS; the Unix socket (the default) is yours alone."
                );
            } else {
                eprintln!(
                    "dedup: warning: serving {bind}:{port} without required TLS (--insecure): anyone who reaches it can read and overwrite the device"
                );
            }
        }
        _ => {}
    }
}

/// Ctrl-C (or SIGTERM) asks nbdkit to stop; it unloads the plugin, which
/// saves the metadata, once its clients have disconnected. A client that
/// stays attached (a mounted filesystem) keeps it waiting: after a moment
/// say so, and on a second signal save the metadata through the control
/// socket (the device closes; its clients get errors from then on) and end
/// nbdkit.
fn stop_on_signals(signals: &mut signal_hook::iterator::Signals, pid: libc::pid_t, control: &Path) {
    let mut signals = signals.forever();
    if signals.next().is_none() {
        return;
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let started = std::time::Instant::now();
    // A stop with no client attached is quick; only a wait is explained.
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        // SAFETY: signal 0 only checks that the process exists.
        if unsafe { libc::kill(pid, 0) } == 0 {
            eprintln_safe(
                "dedup: stopping: nbdkit waits for its clients to disconnect. Unmount the filesystem \
                 and detach the device (losetup -d, then stop nbdfuse; or nbd-client -d). \
                 Press Ctrl-C again to save the metadata and stop now: clients still attached then get I/O errors.",
            );
        }
    });
    if signals.next().is_none() {
        return;
    }
    eprintln_safe(&format!(
        "dedup: saving the metadata and stopping now ({} s after the first Ctrl-C)",
        started.elapsed().as_secs()
    ));
    match dedup_core::control::request(control, &dedup_core::control::Request::Save) {
        Ok(_) => eprintln_safe("dedup: metadata saved cleanly; ending nbdkit"),
        Err(e) => eprintln_safe(&format!(
            "dedup: saving through the control socket failed ({e}); ending nbdkit anyway: the next serve recovers"
        )),
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// A message on stderr that never panics (a closed or full stderr).
fn eprintln_safe(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// nbdkit's threads per connection when `--threads` is not given: twice
/// the CPUs, at least 4 and at most 16 (nbdkit's own default). Each
/// thread waits its turn to read the connection's next request, and the
/// work a request brings is CPU (fingerprints, compression): with 16 on
/// 2 CPUs, idle threads woke and slept around every request. Measured on
/// 2 CPUs, 4 against 16, alternating, 2 rounds each: the unique GiB
/// copied with `nbdcopy` 0.82-0.88 s against 0.93 (server CPU 1.08-1.14 s
/// against 1.17-1.21), fio's 4 KiB random writes with a FLUSH every 8
/// 10,170-10,914 IOPS against 8,948-9,298.
fn default_threads() -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (2 * cpus).clamp(4, 16) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_that_did_not_save_advises_what_fits_the_store() {
        let dir = Path::new("/srv/dev");
        let sparse = unsaved_advice("sparse", dir);
        assert!(!sparse.contains("--accept-unclean"), "{sparse}");
        assert!(
            sparse.contains("journal") && sparse.contains("/srv/dev"),
            "{sparse}"
        );
        assert!(unsaved_advice("inram", dir).contains("--accept-unclean"));
    }
}
