//! Datasets written by real clients instead of fio (Dmdedup §4.2.1's
//! Linux-kernels tarball): a tar stream copied onto the device with
//! nbdcopy, and the same tree extracted as files onto ext4 over the device
//! (nbdfuse + loop + mkfs.ext4 + mount), each timed to the end of a flush.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::fio::Measured;

/// Run a command to completion; its stderr in the error.
fn sh(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The dataset as one tar stream: the given tarball, or a directory
/// archived once (GNU tar, 512-byte aligned members, like the paper's
/// tar-512) into the work directory.
pub fn tar_stream(source: &Path, workdir: &Path) -> anyhow::Result<PathBuf> {
    let meta = std::fs::metadata(source)
        .with_context(|| format!("reading the dataset {}", source.display()))?;
    if meta.is_file() {
        // An uncompressed tar has "ustar" at byte 257 of its first header;
        // a compressed one would be written as compressed bytes.
        let mut head = [0u8; 262];
        let is_tar = std::fs::File::open(source)
            .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0))
            .is_ok()
            && &head[257..262] == b"ustar";
        if !is_tar {
            bail!(
                "--source {} is not an uncompressed tar file: decompress it first (e.g. `xz -dk`), or give a directory",
                source.display()
            );
        }
        return Ok(source.to_path_buf());
    }
    if !meta.is_dir() {
        bail!(
            "--source {} is neither a directory nor a tar file",
            source.display()
        );
    }
    let out = workdir.join("source.tar");
    let parent = source.parent().unwrap_or(Path::new("/"));
    let name = source.file_name().context("--source names no directory")?;
    sh(Command::new("tar")
        .arg("-cf")
        .arg(&out)
        .arg("-C")
        .arg(parent)
        .arg(name))?;
    Ok(out)
}

/// Measured for `bytes` moved in `elapsed`.
fn measured(bytes: u64, elapsed: Duration) -> Measured {
    Measured {
        bytes,
        mb_per_s: bytes as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9),
        ..Measured::default()
    }
}

/// Copy the tar stream onto the device from byte 0 with nbdcopy, flushed.
pub fn write_tar(uri: &str, tar: &Path) -> anyhow::Result<Measured> {
    let bytes = std::fs::metadata(tar)?.len();
    let t0 = Instant::now();
    sh(Command::new("nbdcopy").arg("--flush").arg(tar).arg(uri))
        .context("nbdcopy is needed: apt-get install libnbd-bin")?;
    Ok(measured(bytes, t0.elapsed()))
}

/// ext4 on the device through nbdfuse and a loop device, torn down in
/// reverse on drop (also when a step fails).
struct Mounted {
    fuse_dir: PathBuf,
    fuse: Option<Child>,
    loop_dev: Option<String>,
    mnt: Option<PathBuf>,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(m) = self.mnt.take() {
            let unmounted = Command::new("umount")
                .arg(&m)
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                // Busy: detach it now so that nothing below it is removed
                // while still mounted; the kernel finishes when it can.
                let _ = Command::new("umount").arg("-l").arg(&m).status();
            }
        }
        if let Some(l) = self.loop_dev.take() {
            let _ = Command::new("losetup").arg("-d").arg(&l).status();
        }
        if let Some(mut f) = self.fuse.take() {
            let unmounted = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.fuse_dir)
                .status()
                .is_ok_and(|s| s.success());
            if !unmounted {
                let _ = f.kill();
            }
            let _ = f.wait();
        }
    }
}

fn mount(uri: &str, dir: &Path) -> anyhow::Result<Mounted> {
    let fuse_dir = dir.join("fuse");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&fuse_dir)?;
    std::fs::create_dir_all(&mnt)?;
    let mut m = Mounted {
        fuse_dir: fuse_dir.clone(),
        fuse: None,
        loop_dev: None,
        mnt: None,
    };
    m.fuse = Some(
        Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(uri)
            .stdin(Stdio::null())
            .spawn()
            .context("nbdfuse is needed (apt-get install nbdfuse fuse3), and root")?,
    );
    let file = fuse_dir.join("nbd");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !file.exists() {
        if let Some(status) = m.fuse.as_mut().and_then(|f| f.try_wait().ok().flatten()) {
            m.fuse = None;
            bail!("nbdfuse exited ({status}) before exposing the device; its message is above");
        }
        if Instant::now() > deadline {
            bail!("nbdfuse did not expose {} within 30 s", file.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let loop_dev = sh(Command::new("losetup").arg("-f").arg("--show").arg(&file))
        .context("making a loop device (needs root)")?;
    m.loop_dev = Some(loop_dev.clone());
    // 4 KiB blocks whatever the size (mke2fs picks 1 KiB below 512 MiB,
    // which would misalign file data with the chunks).
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096"])
        .arg(&loop_dev))?;
    sh(Command::new("mount").arg(&loop_dev).arg(&mnt))?;
    m.mnt = Some(mnt);
    Ok(m)
}

/// Extract the tar stream as files onto ext4 over the device and sync;
/// the time runs from the start of the extraction to the end of the sync.
/// `bytes` is the tar stream's size (what the client handed over).
pub fn write_files(uri: &str, tar: &Path, dir: &Path) -> anyhow::Result<Measured> {
    let bytes = std::fs::metadata(tar)?.len();
    let m = mount(uri, dir)?;
    let mnt = m.mnt.clone().expect("mounted");
    let t0 = Instant::now();
    sh(Command::new("tar").arg("-xf").arg(tar).arg("-C").arg(&mnt))?;
    sh(Command::new("sync").arg("-f").arg(&mnt))?;
    let elapsed = t0.elapsed();
    drop(m);
    Ok(measured(bytes, elapsed))
}
