//! `dedup backup --server`: back a stream up through `dedup store serve`
//! with the pipelined client (cut and hashed here, only new segments
//! sent).

use std::io::{self, IsTerminal};
use std::process::ExitCode;
use std::time::Instant;

use dedup_core::size::format_size;
use dedup_store::rpc::{BackupOptions, Client, Endpoint};
use serde::Serialize;

use super::backup::mb_per_sec;
use super::print_json;
use super::store::ReportJson;

#[derive(Serialize)]
struct Report {
    name: String,
    group: String,
    server: String,
    #[serde(flatten)]
    report: ReportJson,
    seconds: f64,
    mb_per_sec: f64,
}

pub fn run(server: &Endpoint, name: &str, group: &str, json: bool) -> anyhow::Result<ExitCode> {
    let client = Client::connect(server)?;
    let bar = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template(
        "{spinner} backing up {msg} through the server: {bytes} sent, {bytes_per_sec}, {elapsed}",
    )?);
    bar.set_message(name.to_string());
    if json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let start = Instant::now();
    let b = client.backup_stream(
        name,
        group,
        io::BufReader::with_capacity(1 << 20, io::stdin()),
        None,
        &BackupOptions::default(),
        &|n| bar.set_position(n),
    );
    bar.finish_and_clear();
    let b = b?;
    let r = b.report;
    let seconds = start.elapsed().as_secs_f64();
    let report = Report {
        name: b.name,
        group: b.group,
        server: server.to_string(),
        report: r.into(),
        seconds,
        mb_per_sec: mb_per_sec(r.bytes_in, seconds),
    };
    if json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "Backed up {} through {} (group {}): {} in, {} new ({} written), {} segments new, {} duplicate; {:.1} s, {:.1} MB/s.",
        report.name,
        server,
        report.group,
        format_size(r.bytes_in),
        format_size(r.bytes_new),
        format_size(r.bytes_written),
        r.segments_new,
        r.segments_duplicate,
        seconds,
        report.mb_per_sec
    );
    Ok(ExitCode::SUCCESS)
}
