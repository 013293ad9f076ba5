//! `dedup`: create, serve and inspect deduplicating block devices.
//! Each subcommand lives in `cmd/`; this file only parses and dispatches.

// Reports go through `out!`/`outln!` (`stdout.rs`), which a closed pipe
// cannot panic.
#![deny(clippy::print_stdout)]

#[macro_use]
mod stdout;
mod cmd;
mod prometheus;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dedup",
    version,
    about = "Inline deduplicating block device: identical chunks are stored once",
    long_about = "Inline deduplicating block device: identical chunks are stored once.\n\n\
        Create a device in a directory, serve it over NBD with nbdkit, put any filesystem on it.\n\
        Quick start:\n  dedup create ./dev --size 10G\n  dedup serve ./dev\n  dedup status ./dev\n\n\
        Backups (in progress):\n  dedup store init ./repo\n  dedup backup ./repo NAME DIR...\n  dedup restore ./repo NAME /restore\n  pg_dump db | dedup backup ./repo NAME --stdin\n  dedup restore ./repo NAME out.sql"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The passphrase of an encrypted backup repository, read from FILE
    /// (less one trailing newline). Otherwise it comes from
    /// DEDUP_PASSWORD, or from the file DEDUP_PASSWORD_FILE names.
    #[arg(long, global = true, value_name = "FILE")]
    password_file: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    Create(cmd::create::Args),
    Serve(cmd::serve::Args),
    Status(cmd::status::Args),
    Gc(cmd::gc::Args),
    Check(cmd::check::Args),
    Grow(cmd::grow::Args),
    Bench(cmd::bench::Args),
    BenchThin(cmd::bench_thin::Args),
    Replay(cmd::replay::Args),
    Analyze(cmd::analyze::Args),
    Trace(cmd::trace::Args),
    TlsPsk(cmd::tls::Args),
    Store(cmd::store::Args),
    Backup(cmd::backup::Args),
    Restore(cmd::restore::Args),
    List(cmd::list::Args),
    Delete(cmd::delete::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DEDUP_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    if let Some(path) = &cli.password_file {
        dedup_store::crypto::passphrase::set_password_file(path);
    }
    let result = match cli.command {
        Command::Create(a) => cmd::create::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Gc(a) => cmd::gc::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Grow(a) => cmd::grow::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::BenchThin(a) => cmd::bench_thin::run(a),
        Command::Replay(a) => cmd::replay::run(a),
        Command::Analyze(a) => cmd::analyze::run(a),
        Command::Trace(a) => cmd::trace::run(a),
        Command::TlsPsk(a) => cmd::tls::run(a),
        Command::Store(a) => cmd::store::run(a),
        Command::Backup(a) => cmd::backup::run(a),
        Command::Restore(a) => cmd::restore::run(a),
        Command::List(a) => cmd::list::run(a),
        Command::Delete(a) => cmd::delete::run(a),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dedup: error: {e:#}");
            ExitCode::from(cmd::shared::EXIT_FAILURE)
        }
    };
    // A report that could not be written whole fails the command (said on
    // stderr when it happened); a reader that went away does not.
    if stdout::failed() && code == ExitCode::SUCCESS {
        return ExitCode::from(cmd::shared::EXIT_FAILURE);
    }
    code
}
