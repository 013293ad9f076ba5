//! Every report a command prints on standard output goes through `out!`
//! and `outln!`, never `print!`: the Rust runtime ignores SIGPIPE, so
//! `println!` to a reader that went away (`dedup status --json | head`)
//! panics, exits 101 with a backtrace, and skips the rest of the command
//! (the note after a gc, a device's clean close). Here a reader that goes
//! away costs only the output after it: the command finishes and keeps
//! its exit status. Any other failure to write (a full disk under
//! `> report.json`) is said once on stderr and fails the command at its
//! end (`failed`).

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};
use std::sync::Mutex;

/// Why standard output stopped taking what is printed, once it did.
static STOPPED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// Write `args` to standard output, unless it stopped taking output.
pub fn write(args: Arguments) {
    let mut stopped = STOPPED.lock().unwrap_or_else(|p| p.into_inner());
    if stopped.is_some() {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        stop(&mut stopped, e);
    }
}

/// Standard output failed with `e`: said on stderr unless its reader
/// went away, and nothing more is printed.
fn stop(stopped: &mut Option<std::io::Error>, e: std::io::Error) {
    if e.kind() != ErrorKind::BrokenPipe {
        eprintln!("dedup: error: writing to standard output: {e}");
    }
    *stopped = Some(e);
}

/// Whether writing standard output failed other than by its reader going
/// away (a command that printed less than it meant to then fails).
pub fn failed() -> bool {
    // The last of the output may still be buffered.
    let mut stopped = STOPPED.lock().unwrap_or_else(|p| p.into_inner());
    if stopped.is_none() {
        if let Err(e) = std::io::stdout().lock().flush() {
            stop(&mut stopped, e);
        }
    }
    stopped
        .as_ref()
        .is_some_and(|e| e.kind() != ErrorKind::BrokenPipe)
}

/// `print!` that a closed or failing standard output cannot panic.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}

/// `println!` that a closed or failing standard output cannot panic.
macro_rules! outln {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
