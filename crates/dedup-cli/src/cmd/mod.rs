//! The subcommands, one file each (a large one split into its parts:
//! `backup_files.rs`, `restore_files.rs`, `gc_repo.rs`, `store_*.rs`), the
//! helpers only some commands use (`nbdkit`, `access`, `restore_target`,
//! `write_behind`, `analyze_plot`), and what they all share (`shared/`).
//! Imports run one way: a command uses its parts, helpers and `shared`,
//! never another command (`scripts/module-cycles` checks for cycles).

pub mod access;
pub mod analyze;
mod analyze_plot;
pub mod backup;
mod backup_device;
mod backup_files;
mod backup_remote;
pub mod bench;
pub mod bench_thin;
pub mod check;
pub mod create;
pub mod delete;
pub mod gc;
mod gc_repo;
pub mod grow;
pub mod list;
pub mod nbdkit;
pub mod replay;
pub mod restore;
mod restore_device;
mod restore_files;
mod restore_target;
pub mod serve;
pub mod shared;
pub mod status;
pub mod store;
mod store_check;
mod store_key;
mod store_remote;
mod store_serve;
pub mod tls;
pub mod trace;
mod write_behind;
