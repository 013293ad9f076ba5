//! Progress bars more than one command draws (on stderr, hidden where
//! the command says so).

use std::io::{self, IsTerminal};

/// A bar of bytes done out of a total set later (reading a trace).
pub fn bytes_bar(msg: &'static str) -> anyhow::Result<indicatif::ProgressBar> {
    Ok(indicatif::ProgressBar::new(0).with_message(msg).with_style(
        indicatif::ProgressStyle::with_template(
            "{msg:24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}, {eta} left",
        )?
        .progress_chars("=> "),
    ))
}

/// A spinner counting the bytes a backup here has read of backup `name`
/// (hidden for --json or when stderr is not a terminal).
pub fn backup_spinner(name: &str, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    spinner(
        "{spinner} backing up {msg}: {bytes} read, {bytes_per_sec}, {elapsed}",
        name,
        json,
    )
}

/// A spinner counting the stream bytes the server has taken of backup
/// `name`, sent or reused from the parent (hidden as `backup_spinner`).
pub fn server_backup_spinner(name: &str, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    spinner(
        "{spinner} backing up {msg} through the server: {bytes} taken, {bytes_per_sec}, {elapsed}",
        name,
        json,
    )
}

/// A bar of the blocks a backup of device `name` has walked out of
/// `blocks` (hidden as `backup_spinner`).
pub fn blocks_bar(name: &str, blocks: u64, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new(blocks).with_style(
        indicatif::ProgressStyle::with_template(
            "backing up {msg} [{bar:30}] {pos}/{len} blocks, {per_sec}, {eta} left",
        )?
        .progress_chars("=> "),
    );
    bar.set_message(name.to_string());
    hide_unless_drawn(&bar, json);
    Ok(bar)
}

/// A bar of the image bytes a restore by fingerprint of backup `name`
/// has compared, then written (the message says which; hidden as
/// `backup_spinner`).
pub fn restore_bar(name: &str, bytes: u64, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new(bytes).with_style(
        indicatif::ProgressStyle::with_template(&format!(
            "restoring {name}: {{msg}} [{{bar:30}}] {{bytes}}/{{total_bytes}}, {{bytes_per_sec}}, {{eta}} left"
        ))?
        .progress_chars("=> "),
    );
    bar.set_message("comparing");
    hide_unless_drawn(&bar, json);
    Ok(bar)
}

/// Hide `bar` for --json, or when stderr is not a terminal.
fn hide_unless_drawn(bar: &indicatif::ProgressBar, json: bool) {
    if json || !io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
}

fn spinner(template: &str, name: &str, json: bool) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = indicatif::ProgressBar::new_spinner()
        .with_style(indicatif::ProgressStyle::with_template(template)?);
    bar.set_message(name.to_string());
    hide_unless_drawn(&bar, json);
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Ok(bar)
}
