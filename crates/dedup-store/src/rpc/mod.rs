//! `dedup store serve` (§3.4): one process holds the repository open for
//! writing and serves backups, list, delete and stats to many clients at
//! once over a Unix socket or TCP; clients cut and hash their streams
//! themselves and send only the segments the server does not have.
//!
//! Stack: messages are serde types encoded with `postcard` (compact,
//! well-kept, `no_std`-grade careful decoding that never trusts a length
//! to allocate), one message per frame of a 4-byte length prefix checked
//! against [`protocol::MAX_FRAME`] before any allocation. Every request
//! carries an id and the server answers each connection's requests in
//! order, so a client pipelines: several lookup and append batches are in
//! flight while it reads and hashes the next ones. The server is
//! synchronous on purpose: a [`BackupSession`](crate::BackupSession) does
//! blocking file I/O and CPU work (compression, hashing) and borrows the
//! repository, so a thread per connection that owns its sessions is the
//! natural shape; an async runtime (tokio/tarpc) would add a dependency
//! tree and `spawn_blocking` hops for no gain at these connection counts.
//!
//! On a server given a key (`dedup store serve --psk FILE`), a connection
//! must prove it holds the same key before any other call, and the server
//! proves it back (`auth.rs`).
//!
//! Sessions belong to their connection: a connection that closes, for any
//! reason, aborts its running backups (they leave no backup). Shutdown
//! closes every connection the same way, then drops the repository.

pub mod auth;
mod batch;
mod blocks;
mod connection;
mod found;
pub(crate) mod frame;
pub(crate) mod item_ref;
pub mod protocol;
mod read_ahead;
mod serve_restore;
mod server;
mod stream;
pub mod tls;

pub mod client;
mod pipeline;

pub use auth::Key;
pub use client::{Client, ClientError};
pub use pipeline::{BackupOptions, FilesBackup, Progress};
pub use protocol::{Endpoint, WireBackup};
pub use server::{Server, ServerLimits, StopHandle, DEFAULT_IDLE_TIMEOUT};
