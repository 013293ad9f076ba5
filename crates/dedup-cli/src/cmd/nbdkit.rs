//! Running nbdkit: finding it and our plugin, starting it in the foreground
//! on a socket, waiting until it serves, reading its CPU time, stopping it.
//! Shared by `dedup serve` and `dedup bench`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub const PLUGIN_FILE: &str = "libdedup_nbd.so";

/// Where a server listens.
#[derive(Clone, Debug)]
pub enum Listen {
    Unix(PathBuf),
    Tcp { bind: String, port: u16 },
}

impl Listen {
    /// The plain (no TLS) NBD URI.
    pub fn uri(&self) -> String {
        match self {
            Listen::Unix(sock) => {
                format!(
                    "nbd+unix:///?socket={}",
                    uri_escape(&sock.to_string_lossy())
                )
            }
            Listen::Tcp { bind, port } => format!("nbd://{}:{port}", uri_host(bind)),
        }
    }
}

/// Percent-encode what a URI path or query value may not hold as it is
/// (spaces, `&`, `?`, `#`, `%`, `@`, ...); `/` stays, so paths read as paths.
pub fn uri_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A host for a URI: IPv6 literals go in brackets.
pub fn uri_host(bind: &str) -> String {
    if bind.contains(':') && !bind.starts_with('[') {
        format!("[{bind}]")
    } else {
        bind.to_string()
    }
}

/// Our plugin: `explicit`, or next to the running `dedup` binary.
pub fn find_plugin(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if !p.exists() {
            bail!("the plugin {} does not exist", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("finding the dedup program's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidate = dir.join(PLUGIN_FILE);
    if candidate.exists() {
        return Ok(candidate);
    }
    bail!(
        "cannot find the nbdkit plugin {PLUGIN_FILE} next to {}: build the whole workspace \
         (`cargo build --release`) or pass --plugin PATH",
        exe.display()
    )
}

/// A program on PATH (or a path with a directory in it).
pub fn find_program(name: &Path) -> anyhow::Result<PathBuf> {
    if name.components().count() > 1 {
        return Ok(name.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{} is not installed (or not on PATH): install it, e.g. `apt-get install nbdkit`",
                name.display()
            )
        })
}

pub struct Nbdkit {
    child: Child,
    pidfile: PathBuf,
    socket: Option<PathBuf>,
}

impl Nbdkit {
    /// Start `nbdkit [OPTIONS...] PLUGIN ARGS...` in the foreground (it
    /// exits with us); `options` are nbdkit's own (TLS, read-only).
    pub fn spawn(
        nbdkit: &Path,
        listen: &Listen,
        pidfile: &Path,
        threads: u32,
        options: &[OsString],
        plugin: &[OsString],
    ) -> anyhow::Result<Nbdkit> {
        let _ = std::fs::remove_file(pidfile);
        let mut cmd = Command::new(nbdkit);
        cmd.arg("--foreground")
            .arg("--exit-with-parent")
            .arg("--pidfile")
            .arg(pidfile)
            .arg("--threads")
            .arg(threads.to_string());
        let socket = match listen {
            Listen::Unix(sock) => {
                dedup_core::control::remove_stale_socket(sock)?;
                cmd.arg("--unix").arg(sock);
                Some(sock.clone())
            }
            Listen::Tcp { bind, port } => {
                cmd.arg("--port")
                    .arg(port.to_string())
                    .arg("--ipaddr")
                    .arg(bind);
                None
            }
        };
        cmd.args(options).args(plugin);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", nbdkit.display()))?;
        Ok(Nbdkit {
            child,
            pidfile: pidfile.to_path_buf(),
            socket,
        })
    }

    pub fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Wait until nbdkit serves (its pid file exists and `also` holds), for
    /// as long as it lives, saying so every 10 s. `Ok(Some(status))` if it
    /// exited instead. A Unix socket is then made exactly 0600: our plugin
    /// sets nbdkit's umask to 077, so it was owner-only from the start
    /// (0700), and nbdkit itself never sets its mode.
    pub fn wait_ready(&mut self, also: impl Fn() -> bool) -> anyhow::Result<Option<ExitStatus>> {
        let started = Instant::now();
        let mut told = Duration::ZERO;
        while !(self.pidfile.exists() && also()) {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if started.elapsed() >= told + Duration::from_secs(10) {
                told = started.elapsed();
                eprintln!("dedup: still opening the device ({} s)...", told.as_secs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(sock) = &self.socket {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(dedup_core::perms::SOCKET_MODE);
            std::fs::set_permissions(sock, mode)
                .with_context(|| format!("making {} private to its owner", sock.display()))?;
        }
        Ok(None)
    }

    /// CPU seconds (user + system) the server has used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        // Fields after the parenthesised command name; utime and stime are 14 and 15.
        let rest = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Some(ticks / hz)
    }

    /// Wait for nbdkit to exit (it got a signal from elsewhere).
    pub fn wait(mut self) -> anyhow::Result<ExitStatus> {
        let status = self.child.wait().context("waiting for nbdkit")?;
        self.cleanup();
        Ok(status)
    }

    /// Ask nbdkit to stop (SIGTERM: it unloads the plugin, which saves the
    /// metadata) and wait for it.
    pub fn stop(self) -> anyhow::Result<ExitStatus> {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        self.wait()
    }

    fn cleanup(&mut self) {
        let _ = std::fs::remove_file(&self.pidfile);
        if let Some(sock) = &self.socket {
            let _ = std::fs::remove_file(sock);
        }
    }
}
