//! dedup's own trace format: text, one request per line, so traces can be
//! read, grepped and diffed.
//!
//! ```text
//! # dedup-trace 1
//! <time_ns> <op> <offset> <length> [<block>,<block>,...]
//! ```
//! `op` is `R`, `W`, `T` (trim), `Z` (write zeroes) or `F` (flush); a
//! trailing `!` marks FUA (`W!`). Offsets and lengths are in bytes. A write
//! lists one entry per 4 KiB-aligned block its range touches: `0` for an
//! all-zero block, else 32 hex digits, the first 128 bits of the blake3 of
//! the block's bytes inside the range. Lines starting with `#` are
//! comments. Documented with the other formats in `dedup-core/FORMATS.md`.

use std::io::Write;

use crate::content::seed_of;
use crate::request::{Content, Op, Request, Seed, BLOCK, MAX_REQUEST};

pub const HEADER: &str = "# dedup-trace 1";

/// Write requests in the native format.
pub struct Writer<W: Write> {
    out: W,
}

impl<W: Write> Writer<W> {
    pub fn new(mut out: W) -> std::io::Result<Self> {
        writeln!(out, "{HEADER}")?;
        Ok(Writer { out })
    }

    pub fn write(&mut self, r: &Request) -> std::io::Result<()> {
        let op = match r.op {
            Op::Read => "R",
            Op::Write => "W",
            Op::Trim => "T",
            Op::Zero => "Z",
            Op::Flush => "F",
        };
        let bang = if r.fua { "!" } else { "" };
        write!(self.out, "{} {op}{bang} {} {}", r.time_ns, r.offset, r.len)?;
        let seeds = r.block_seeds();
        if r.op == Op::Write {
            self.out.write_all(b" ")?;
            for (i, s) in seeds.iter().enumerate() {
                if i > 0 {
                    self.out.write_all(b",")?;
                }
                match s {
                    None => self.out.write_all(b"0")?,
                    Some(s) => self.out.write_all(hex(s).as_bytes())?,
                }
            }
        }
        self.out.write_all(b"\n")
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

/// The per-block seeds of a write of `data` at `offset`, as a recorder
/// stores them.
pub fn seeds_of_write(offset: u64, data: &[u8]) -> Vec<Option<Seed>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        let pos = offset + at as u64;
        let room = (BLOCK - pos % BLOCK) as usize;
        let piece = &data[at..(at + room).min(data.len())];
        out.push(if piece.iter().all(|&b| b == 0) {
            None
        } else {
            Some(seed_of(piece))
        });
        at += piece.len();
    }
    out
}

/// A recorded write.
pub fn write_request(time_ns: u64, offset: u64, data: &[u8], fua: bool) -> Request {
    Request {
        time_ns,
        op: Op::Write,
        fua,
        offset,
        len: data.len() as u64,
        content: Content::PerBlock(seeds_of_write(offset, data)),
    }
}

pub fn hex(s: &Seed) -> String {
    s.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn parse_hex(s: &str) -> Option<Seed> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Parse one non-comment line.
pub fn parse_line(line: &str) -> Result<Request, String> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.len() < 4 {
        return Err(format!(
            "expected `time op offset length [blocks]`, found {} fields",
            f.len()
        ));
    }
    let num = |i: usize, what: &str| -> Result<u64, String> {
        f[i].parse::<u64>()
            .map_err(|_| format!("{what} `{}` is not a whole number", f[i]))
    };
    let time_ns = num(0, "time")?;
    let (op_s, fua) = match f[1].strip_suffix('!') {
        Some(s) => (s, true),
        None => (f[1], false),
    };
    let op = match op_s {
        "R" => Op::Read,
        "W" => Op::Write,
        "T" => Op::Trim,
        "Z" => Op::Zero,
        "F" => Op::Flush,
        other => return Err(format!("unknown operation `{other}` (R, W, T, Z or F)")),
    };
    if fua && matches!(op, Op::Read | Op::Flush) {
        return Err(format!(
            "`{}`: only writes, trims and zeroes take FUA",
            f[1]
        ));
    }
    let offset = num(2, "offset")?;
    let len = num(3, "length")?;
    if offset.checked_add(len).is_none() {
        return Err("offset + length overflows".into());
    }
    if len > MAX_REQUEST {
        return Err(format!("length {len} is over the {MAX_REQUEST}-byte limit"));
    }
    let mut r = Request {
        time_ns,
        op,
        fua,
        offset,
        len,
        content: Content::None,
    };
    match (op, f.len()) {
        (Op::Write, 5) => {
            let seeds = f[4]
                .split(',')
                .map(|b| match b {
                    "0" => Ok(None),
                    h => parse_hex(h)
                        .map(Some)
                        .ok_or_else(|| format!("block `{h}` is neither 0 nor 32 hex digits")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let want = r.blocks().count();
            if seeds.len() != want {
                return Err(format!(
                    "{} block entries for a write touching {want} blocks",
                    seeds.len()
                ));
            }
            r.content = Content::PerBlock(seeds);
        }
        (Op::Write, _) => return Err("a write needs its block list".into()),
        (_, 4) => {}
        _ => return Err(format!("{} fields where 4 are expected", f.len())),
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut zeros = data.clone();
        zeros[4096 - 100..8192 - 100].fill(0);
        let reqs = vec![
            write_request(5, 100, &data, false),
            write_request(6, 100, &zeros, true),
            Request {
                time_ns: 7,
                op: Op::Trim,
                fua: true,
                offset: 4096,
                len: 8192,
                content: Content::None,
            },
            Request {
                time_ns: 9,
                op: Op::Flush,
                fua: false,
                offset: 0,
                len: 0,
                content: Content::None,
            },
        ];
        let mut w = Writer::new(Vec::new()).unwrap();
        for r in &reqs {
            w.write(r).unwrap();
        }
        let text = String::from_utf8(w.into_inner()).unwrap();
        let back: Vec<Request> = text
            .lines()
            .skip(1)
            .map(|l| parse_line(l).unwrap())
            .collect();
        assert_eq!(back, reqs);
        // The zeroed block (4096..8192, inside the range) is recorded as 0.
        assert!(text.lines().nth(2).unwrap().contains(",0,"));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (line, says) in [
            ("1 W 0 4096", "block list"),
            ("1 X 0 4096", "unknown operation"),
            ("x W 0 4096 0", "time"),
            ("1 W 0 8192 0", "1 block entries for a write touching 2"),
            ("1 W 0 4096 abc", "32 hex"),
            ("1 R! 0 4096", "FUA"),
            ("1 R 0", "fields"),
            ("1 R 18446744073709551615 2", "overflows"),
            ("1 T 0 1099511627776", "limit"),
        ] {
            let e = parse_line(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
