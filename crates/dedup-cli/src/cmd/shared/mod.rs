//! What the commands share, one layer below all of them: clap arguments
//! and their value parsers (`args`), report types and their text
//! (`report`), reaching a device (`device`), a stopped device as blocks
//! (`device_blocks`) or a served one through a snapshot
//! (`served_blocks`), or a backup repository, here or through a server
//! (`repo`), key files (`psk`), progress bars
//! (`progress`) and a trace's statistics (`trace_stats`). A command module
//! imports these and never another command, nor do these import a command,
//! so imports run one way (`scripts/module-cycles crates/dedup-cli`).

pub mod args;
pub mod device;
pub mod device_blocks;
pub mod progress;
pub mod psk;
pub mod repo;
pub mod report;
pub mod served_blocks;
pub mod trace_stats;

/// Exit code for "could not do it" (check uses 1 for "problems found").
pub const EXIT_FAILURE: u8 = 2;
