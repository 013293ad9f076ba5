//! The backup store's integration tests, as one test binary: each file
//! below is a module of the tests it names, and the `*_support` and
//! `*_model` modules are what several of them share. One binary, not one
//! per file, because each binary links the whole store again (some ten
//! CPU-seconds apiece, minutes for the suite). `backup_memory` (a counting
//! allocator) and `s3_records` (the process's request counters and cache
//! directory) keep binaries of their own: they measure the whole process.
//!
//! Run one file's tests with `cargo test -p dedup-store --test store NAME::`.

mod blocks_model;
mod blocks_support;
mod catalog_support;
mod check_support;
mod gc_support;
mod index_support;
mod object_model;
mod rpc_support;
mod s3_support;
mod tree_support;

mod backup_blocks;
mod backup_snapshot;
mod check;
mod check_flips;
mod corruption;
mod encryption;
mod fuzz;
mod fuzz_entry;
mod gc_compact_candidates;
mod gc_concurrent;
mod gc_crash;
mod gc_damaged_backup;
mod gc_groups;
mod gc_model;
mod gc_sampled;
mod index_efficiency;
mod index_eviction;
mod index_persistence;
mod index_sampling;
mod many_writers;
mod objects;
mod open_listing;
mod recipe_format;
mod recipe_parts;
mod repo;
mod repo_checkpoint;
mod repo_concurrent;
mod repo_corruption;
mod repo_inflight;
mod repo_model;
mod repo_sampled;
mod repo_temporaries;
mod restore_blocks;
mod restore_damage;
mod roundtrip;
mod rpc;
mod rpc_auth;
mod rpc_blocks;
mod rpc_damage;
mod rpc_encrypted;
mod rpc_handshake;
mod rpc_parent;
mod rpc_tls;
mod rpc_unhashed;
mod s3;
mod sealed;
mod segment_blocks;
mod segmenting;
mod session_put;
mod tree;
mod tree_model;
mod tree_parent;
