//! contrib/systemd's unit files: they exist, every command they run as
//! `dedup` is a real subcommand with real options (checked against this
//! build's `--help`), and the attach units are tied to the server's life.

use std::path::{Path, PathBuf};
use std::process::Command;

const UNITS: &[&str] = &[
    "dedup@.service",
    "dedup-attach@.service",
    "dedup-fuse@.service",
    "srv-data.mount",
    "dedup-store@.service",
    "dedup-store-gc@.service",
    "dedup-store-gc@.timer",
];

fn unit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd")
}

fn read(unit: &str) -> String {
    let path = unit_dir().join(unit);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `Key=value` settings, continuation lines and comments aside (the units
/// use neither continuations nor repeated keys that matter here).
fn settings(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .collect()
}

/// `dedup SUB... --help`: what this build says about SUB, or None if clap
/// refuses SUB.
fn help(sub: &[&str]) -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_dedup"))
        .args(sub)
        .arg("--help")
        .output()
        .expect("running dedup");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn every_dedup_command_in_the_units_is_a_real_subcommand_and_option() {
    let mut checked = 0;
    for unit in UNITS {
        let text = read(unit);
        for (key, value) in settings(&text) {
            if !key.starts_with("Exec") {
                continue;
            }
            // systemd's prefixes (-, @, :, +, !) say how to run, not what.
            let words: Vec<&str> = value
                .trim_start_matches(['-', '@', ':', '+', '!'])
                .split_whitespace()
                .collect();
            if !words.first().is_some_and(|w| w.ends_with("/dedup")) {
                continue;
            }
            let first = *words.get(1).unwrap_or_else(|| panic!("{unit}: {value}"));
            // A command group (`dedup store serve`): the options are its
            // subcommand's.
            let group = words
                .get(2)
                .filter(|w| !w.starts_with('-'))
                .and_then(|w| Some((format!("{first} {w}"), help(&[first, w])?)));
            let (sub, text) = group.unwrap_or_else(|| {
                let text = help(&[first])
                    .unwrap_or_else(|| panic!("{unit}: `dedup {first}` is no subcommand"));
                (first.to_string(), text)
            });
            for opt in words.iter().filter(|w| w.starts_with("--")) {
                let name = opt.split('=').next().unwrap_or(opt);
                assert!(text.contains(name), "{unit}: dedup {sub} has no {name}");
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no unit runs dedup");
    assert!(
        help(&["no-such-subcommand"]).is_none(),
        "the check would pass anything"
    );
    assert!(
        !help(&["store"]).unwrap().contains("--max-connections")
            && help(&["store", "serve"])
                .unwrap()
                .contains("--max-connections"),
        "a group's own help would not show its subcommands' options"
    );
}

#[test]
fn the_server_runs_dedup_serve_on_the_instance_directory() {
    let text = read("dedup@.service");
    let s = settings(&text);
    assert!(s.contains(&("ExecStart", "/usr/local/bin/dedup serve %f")));
    assert!(
        s.contains(&("ReadWritePaths", "%f")),
        "ProtectSystem=strict needs it"
    );
    assert!(s.contains(&("KillSignal", "SIGTERM")));
}

#[test]
fn attach_units_live_and_die_with_the_server() {
    for unit in ["dedup-attach@.service", "dedup-fuse@.service"] {
        let text = read(unit);
        let s = settings(&text);
        for key in ["BindsTo", "After"] {
            assert!(s.contains(&(key, "dedup@%i.service")), "{unit}: {key}");
        }
        assert!(
            s.iter().any(|(k, _)| *k == "ExecStop"),
            "{unit}: no ExecStop"
        );
    }
    let text = read("dedup-attach@.service");
    let attach = settings(&text);
    assert!(attach.contains(&("EnvironmentFile", "/etc/dedup/%i.env")));
    assert!(attach.contains(&("ExecStop", "nbd-client -d ${NBD_DEVICE}")));
}

#[test]
fn the_example_mount_needs_the_attached_device_but_not_the_boot_it() {
    let text = read("srv-data.mount");
    let s = settings(&text);
    assert!(s.contains(&("Requires", "dedup-attach@srv-dedup-a.service")));
    assert!(s.contains(&("After", "dedup-attach@srv-dedup-a.service")));
    let options = s.iter().find(|(k, _)| *k == "Options").expect("Options=").1;
    assert!(options.split(',').any(|o| o == "nofail"));
}

#[test]
fn the_backup_server_serves_the_instance_repository_on_a_private_socket_and_gc_goes_through_it() {
    let text = read("dedup-store@.service");
    let s = settings(&text);
    let sock = "/run/dedup-store/%i.sock";
    assert!(s.contains(&(
        "ExecStart",
        "/usr/local/bin/dedup store serve %f --socket /run/dedup-store/%i.sock"
    )));
    assert!(s.contains(&("RuntimeDirectory", "dedup-store")));
    assert!(s.contains(&("RuntimeDirectoryMode", "0700")));
    assert!(s.contains(&("ReadWritePaths", "%f")));
    assert!(s.contains(&("KillSignal", "SIGTERM")));

    let text = read("dedup-store-gc@.service");
    let gc = settings(&text);
    for key in ["Requires", "After"] {
        assert!(gc.contains(&(key, "dedup-store@%i.service")), "gc: {key}");
    }
    let exec = gc
        .iter()
        .find(|(k, _)| *k == "ExecStart")
        .expect("ExecStart=")
        .1;
    assert!(exec.contains(&format!("--server unix:{sock}")), "{exec}");
    assert!(exec.ends_with(" gc"), "{exec}");

    let text = read("dedup-store-gc@.timer");
    let timer = settings(&text);
    assert!(timer.iter().any(|(k, _)| *k == "OnCalendar"));
    assert!(timer.contains(&("Persistent", "true")));
}
