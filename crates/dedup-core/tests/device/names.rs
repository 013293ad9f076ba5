//! One name per thing in the engine's code (issue 36): the hash index's
//! memory is `index_memory`, as the `--index-memory` flag says, in every
//! identifier (its JSON keys stay what they were), and no placement is
//! called a backend (`backend` is the metadata seam's file, `backends/`
//! its stores, and a `--backend` name picks a store and a placement).

use std::path::{Path, PathBuf};

use dedup_core::backend::IndexFigures;
use dedup_core::backends::sparse;
use dedup_core::backends::BackendParams;
use dedup_core::fingerprint::HashAlgo;
use dedup_core::testrig::config;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// A line's code: no comment, no string literal.
fn code(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_string => {
                chars.next();
            }
            '"' => in_string = !in_string,
            '/' if !in_string && chars.peek() == Some(&'/') => break,
            _ if !in_string => out.push(c),
            _ => {}
        }
    }
    out
}

#[test]
fn the_index_memory_has_one_name_in_the_code() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        sources(&crate_dir.join(dir), &mut files);
    }
    let others = ["budget", "budget_bytes", "ram_index_bytes", "memory_budget"];
    let mut found = Vec::new();
    for f in &files {
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let words: Vec<String> = code(line)
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map(str::to_string)
                .collect();
            if others.iter().any(|o| words.iter().any(|w| w == o)) {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "other names for index_memory:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_index_memory_keeps_its_json_keys() {
    let figures = serde_json::to_value(IndexFigures {
        index_memory: 7,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(figures["budget_bytes"], 7, "{figures}");
    let cfg = config("sparse", 4096, 16, 16, HashAlgo::Blake3, false);
    let params = BackendParams {
        index_memory: 1 << 20,
        ..Default::default()
    };
    let sizing = serde_json::to_value(sparse::sizing(&cfg, &params)).unwrap();
    assert_eq!(sizing["ram_index_bytes"], 1 << 20, "{sizing}");
}

#[test]
fn a_placement_is_never_called_a_backend() {
    let placement = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/placement");
    let mut files = Vec::new();
    sources(&placement, &mut files);
    let named: Vec<_> = files
        .iter()
        .filter(|f| f.file_stem().is_some_and(|s| s == "backend"))
        .collect();
    assert!(named.is_empty(), "placements named backend: {named:?}");
}
