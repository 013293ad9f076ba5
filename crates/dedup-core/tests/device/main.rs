//! The engine's integration tests, one module per file, linked into one
//! test binary: each binary of its own linked the whole engine again (about
//! 30 of them did). A file runs alone with its module path, e.g.
//! `cargo test --release -p dedup-core --test device crash::`.

mod common;

mod block_map;
mod changes;
mod concurrency;
mod corruption;
mod crash;
mod crash_kill;
mod failed_sync;
mod fuzz_change_pages;
mod fuzz_open;
mod fuzz_packed_block;
mod fuzz_snapshot_reply;
mod fuzz_thin_blocks;
mod grow;
mod host_full_stop;
mod layout;
mod live_copy;
mod map_known;
mod model;
mod mutations;
mod names;
mod overwrite;
mod packing;
mod sampled_index;
mod seams;
mod snapshot;
mod space_back;
mod stale;
mod thin;
mod thin_host_full;
mod write_back;
mod write_path;
