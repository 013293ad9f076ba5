//! Which process wrote a temporary file, and whether it is known dead.
//!
//! Many processes may put objects into one repository directory at once,
//! so a temporary file (`local.rs`) may be removed only once its writer is
//! known dead. A process is known dead only on its own machine and in its
//! own process namespace, since the same number means another process
//! elsewhere: a temporary's name carries a digest of the kernel's boot id
//! and the pid namespace, the pid and the process's start time, and it is
//! a dead writer's only when the digest is ours and that pid no longer
//! runs with that start time. Nothing else is ever guessed dead (no clock
//! is trusted to say how old a file is).

/// This process, as a temporary file's name carries it:
/// `<machine digest>-<pid>-<start time>`.
pub fn tag() -> String {
    let pid = std::process::id();
    format!("{}-{pid}-{}", machine(), start_time(pid).unwrap_or(0))
}

/// Whether the process a `tag` names is known dead: of this machine,
/// boot and pid namespace, and no longer running. False for anything
/// that does not parse.
pub fn tag_is_dead_here(tag: &str) -> bool {
    let mut parts = tag.splitn(3, '-');
    let (Some(digest), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    if digest != machine() || digest == UNKNOWN || start == 0 {
        return false;
    }
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let gone = (unsafe { libc::kill(raw, 0) }) == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    gone || start_time(pid).is_some_and(|now| now != start)
}

const UNKNOWN: &str = "unknown";

/// A digest of the boot id and pid namespace: where a pid means this
/// process's neighbours. "unknown" when either cannot be read.
fn machine() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
    let ns = std::fs::read_link("/proc/self/ns/pid");
    match (boot, ns) {
        (Ok(boot), Ok(ns)) => {
            let mut h = blake3::Hasher::new();
            h.update(boot.trim().as_bytes());
            h.update(b"\0");
            h.update(ns.to_string_lossy().as_bytes());
            h.finalize().to_hex()[..16].to_string()
        }
        _ => UNKNOWN.into(),
    }
}

/// A process's start time in clock ticks after boot (`/proc/PID/stat`).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_dead_process_of_this_boot_and_namespace_is_dead() {
        let me = tag();
        assert!(!tag_is_dead_here(&me), "this process runs: {me}");
        let (digest, rest) = me.split_once('-').unwrap();
        let (pid, start) = rest.split_once('-').unwrap();
        assert!(
            tag_is_dead_here(&format!("{digest}-4000000-{start}")),
            "no such pid"
        );
        let later: u64 = start.parse::<u64>().unwrap() + 1;
        assert!(
            tag_is_dead_here(&format!("{digest}-{pid}-{later}")),
            "pid reused"
        );
        for never in [
            format!("0123456789abcdef-4000000-{start}"),
            format!("unknown-4000000-{start}"),
            format!("{digest}-{}-{start}", u32::MAX - 1),
            format!("{digest}-4000000-0"),
            "junk".to_string(),
            String::new(),
        ] {
            assert!(!tag_is_dead_here(&never), "{never}");
        }
    }
}
