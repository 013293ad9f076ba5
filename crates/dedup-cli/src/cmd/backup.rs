//! `dedup backup`: back up files and directories (see `backup_files.rs`)
//! or a stream from standard input into a repository (issue 17).

use std::io::{self, IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::bail;
use dedup_core::size::format_size;
use dedup_store::rpc::Endpoint;
use dedup_store::{BackupReport, RepoLocation};
use serde::Serialize;

use super::shared::args::IndexArgs;
use super::shared::progress::backup_spinner;
use super::shared::repo::{open_indexed, Remote};
use super::shared::report::{mb_per_sec, print_json, ratio_text, IndexJson, ReportJson};

#[derive(clap::Args)]
#[command(
    about = "Back up files and directories, a stream from standard input, or a dedup device (stopped or served), into a repository",
    after_help = "Files and directories are stored with their metadata (type, mode including setuid/setgid/sticky, owner, times to the nanosecond, symlink targets, hard links, fifos and devices, extended attributes); symlinks are never followed; sockets are skipped with a warning, as are files that vanish or cannot be read. Paths are kept as given, made relative like tar does: /home/me is stored as home/me, so `dedup restore REPO NAME /restore` recreates /restore/home/me. A file that changes while it is read is stored as read. A file whose size, mtime, ctime and inode are those the newest backup of files in the same group recorded is not read again: its segments are reused (after checking them against their containers).\n\nThe backup becomes visible only once all of it is durable; a backup that fails or is killed leaves no backup behind.\n\nExamples:\n  dedup backup ./repo home-monday /home\n  dedup backup ./repo etc-1 /etc --group etc --json\n  pg_dump db | dedup backup ./repo db-1 --stdin --group db --json\n  dedup backup ./repo vm-1 --device /var/lib/dedup/vm --group vm\n  dedup backup --server unix:/run/dedup-backup.sock home-monday /home\n  dedup backup --server unix:/run/dedup-backup.sock vm-1 --device /var/lib/dedup/vm\n  tar -cf - /home | dedup backup --server unix:/run/dedup-backup.sock home-tar --stdin\n  dedup backup --server tcp:127.0.0.1:7070 --psk backup.psk home-monday /home"
)]
pub struct Args {
    /// Repository: a directory or s3://BUCKET/PREFIX (see `dedup store init`).
    pub repo: RepoLocation,
    /// Name of the new backup (letters, digits, . _ -). With --server the
    /// first argument is the name: dedup backup --server ADDR NAME PATH...
    #[arg(required_unless_present = "server")]
    pub name: Option<String>,
    /// Files or directories to back up.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Back up standard input (a stream) instead of files.
    #[arg(long)]
    pub stdin: bool,
    /// Back up the dedup device in DIR, by the fingerprints its metadata
    /// keeps: only chunks the repository lacks are read. A served device
    /// is backed up through a snapshot of one instant while clients go
    /// on writing. Restores as the device's image. Needs a repository of
    /// fixed segments of the device's chunk size (dedup store init REPO
    /// --segments fixed:4K), in the clear or encrypted (not one encrypted
    /// by a build before 2026-12-01); any other is backed up by reading
    /// the whole device, and the report says why. With --server, by
    /// fingerprint too: only chunks the server lacks are read and sent,
    /// and regions unchanged since the parent are taken from it.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["stdin", "paths"])]
    pub device: Option<PathBuf>,
    /// With --device: walk every block, whatever the device's
    /// changed-block tracking says (the tracking starts again from this
    /// backup all the same).
    #[arg(long, requires = "device")]
    pub walk_all: bool,
    /// Backup group the backup belongs to.
    #[arg(long, default_value = "default")]
    pub group: String,
    /// Back up through a running `dedup store serve` instead of opening
    /// the repository here: unix:PATH or tcp:HOST:PORT. Files unchanged
    /// since the group's last backup of files are not read, as here; of
    /// the others, only segments the repository lacks are sent.
    #[arg(long, value_name = "ADDR", value_parser = Endpoint::parse)]
    pub server: Option<Endpoint>,
    /// With --server: give up, and fail the backup, when the server has
    /// answered nothing, or taken no data, for this many seconds (0:
    /// wait for ever).
    #[arg(long, value_name = "SECS", default_value_t = 3600, requires = "server")]
    pub timeout: u64,
    /// With --server: a copy of the key file the server was started with
    /// (`dedup store serve --psk FILE`). The client proves it holds the
    /// key and checks that the server does, before sending anything.
    #[arg(long, value_name = "FILE", requires = "server")]
    pub psk: Option<PathBuf>,
    /// With a tcp: --server: connect without a key (to a server started
    /// with --no-auth), unable to check it is the server you meant.
    #[arg(long, requires = "server", conflicts_with = "psk")]
    pub no_auth: bool,
    /// Print the report as JSON (and no progress bar).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub index: IndexArgs,
}

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    #[serde(flatten)]
    report: ReportJson,
    #[serde(flatten)]
    index: Option<IndexJson>,
    seconds: f64,
    mb_per_sec: f64,
}

/// Counts the bytes read into the progress bar.
struct Counting<R> {
    inner: R,
    bar: indicatif::ProgressBar,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    if let Some(server) = &a.server {
        return remote(server, &a);
    }
    keep_large_buffers_out_of_the_heap();
    let name = a.name.clone().unwrap_or_default();
    if let Some(dir) = &a.device {
        return super::backup_device::run(
            &a.repo, &a.index, &name, &a.group, dir, a.walk_all, a.json,
        );
    }
    if !a.paths.is_empty() {
        if a.stdin {
            bail!("give either files and directories or --stdin, not both");
        }
        return super::backup_files::run(&a.repo, &a.index, &name, &a.group, &a.paths, a.json);
    }
    if !a.stdin {
        bail!("nothing to back up: give files or directories, or --stdin and pipe the data in");
    }
    let stdin = io::stdin();
    if stdin.is_terminal() {
        bail!("--stdin is a terminal; pipe the data in, e.g. tar -cf - DIR | dedup backup {} {name} --stdin", a.repo);
    }
    widen_stdin_pipe();
    let repo = open_indexed(&a.repo, &a.index)?;
    let bar = backup_spinner(&name, a.json)?;
    let start = Instant::now();
    let result = repo.backup_stream(
        &name,
        &a.group,
        Counting {
            inner: stdin,
            bar: bar.clone(),
        },
    );
    bar.finish_and_clear();
    let r: BackupReport = result?;
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        name: name.clone(),
        group: a.group.clone(),
        report: r.into(),
        index: IndexJson::of(&repo),
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if a.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "Backed up {} into {} (group {}): {} in, {} new ({} written, {} new containers), dedup ratio {}; {} segments new, {} duplicate; {:.1} s, {:.1} MB/s.",
        name,
        a.repo,
        a.group,
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        r.containers_written,
        ratio_text(&r),
        r.segments_new,
        r.segments_duplicate,
        seconds,
        report.mb_per_sec
    );
    if let Some(i) = report.index {
        i.print();
    }
    Ok(ExitCode::SUCCESS)
}

/// `--server`: the positionals are NAME (parsed as REPO), then the paths
/// (the first parsed as NAME).
fn remote(server: &Endpoint, a: &Args) -> anyhow::Result<ExitCode> {
    let name = a.repo.to_string();
    let remote = Remote {
        server,
        timeout: a.timeout,
        psk: a.psk.as_deref(),
        no_auth: a.no_auth,
    };
    let paths: Vec<PathBuf> = a
        .name
        .iter()
        .map(PathBuf::from)
        .chain(a.paths.iter().cloned())
        .collect();
    if let Some(dir) = &a.device {
        if !paths.is_empty() {
            bail!("give either --device or files and directories, not both");
        }
        return super::backup_remote::run_device(&remote, &name, &a.group, dir, a.walk_all, a.json);
    }
    if !paths.is_empty() {
        if a.stdin {
            bail!("give either files and directories or --stdin, not both");
        }
        return super::backup_remote::run_files(&remote, &name, &a.group, &paths, a.json);
    }
    if !a.stdin {
        bail!("nothing to back up: give files or directories (dedup backup --server {server} {name} DIR), or --stdin and pipe the data in");
    }
    if io::stdin().is_terminal() {
        bail!("--stdin is a terminal; pipe the data in, e.g. tar -cf - DIR | dedup backup --server {server} {name} --stdin");
    }
    widen_stdin_pipe();
    super::backup_remote::run(&remote, &name, &a.group, a.json)
}

/// If standard input is a pipe, ask for a 1 MiB pipe buffer (Linux's
/// default is 64 KiB): the writer (tar, head) and the backup then trade
/// turns 16 times less often. Best effort: a pipe that stays small works.
pub fn widen_stdin_pipe() {
    // SAFETY: fcntl on fd 0 with an integer argument touches no memory.
    unsafe {
        libc::fcntl(0, libc::F_SETPIPE_SZ, 1 << 20);
    }
}

/// Allocations of 4 MiB and more (a container being filled and the one
/// being written: 16 MiB each) are mapped on their own and unmapped when
/// freed. glibc's default raises that threshold to the size of the
/// largest mapped block freed, after which the containers came from the
/// heap and left it fragmented: the first backup of `/usr/share` and
/// `/usr/lib` (4.4 GB) peaked at 192 MB of RSS for 128 MB of heap, 143 MB
/// with this. A fixed threshold also ends glibc's adjusting it.
fn keep_large_buffers_out_of_the_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of the allocator; called before
    // the backup allocates its buffers, and any value is valid for it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}
