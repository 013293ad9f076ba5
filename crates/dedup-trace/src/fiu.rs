//! The FIU / SNIA IOTTA block trace format Dmdedup §4.2.2 replays:
//! `timestamp pid process lba size op major minor md5`, timestamp in
//! nanoseconds, lba and size in 512-byte sectors, op `W` or `R`, and the
//! md5 of the request's data. The process name may hold spaces, so the
//! line is split from both ends.

use crate::native::parse_hex;
use crate::request::{Content, Op, Request, MAX_REQUEST};

const SECTOR: u64 = 512;

/// Parse one line; `time_ns` is the trace's own timestamp (the reader
/// makes it relative to the first request).
pub fn parse_line(line: &str) -> Result<Request, String> {
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    if f.len() < 9 {
        return Err(format!(
            "expected `timestamp pid process lba size op major minor md5`, found {} fields",
            f.len()
        ));
    }
    let n = f.len();
    let num = |s: &str, what: &str| -> Result<u64, String> {
        s.parse::<u64>()
            .map_err(|_| format!("{what} `{s}` is not a whole number"))
    };
    let time_ns = num(f[0], "timestamp")?;
    let lba = num(f[n - 6], "lba")?;
    let sectors = num(f[n - 5], "size")?;
    let op = match f[n - 4] {
        "W" | "w" => Op::Write,
        "R" | "r" => Op::Read,
        other => return Err(format!("operation `{other}` is neither W nor R")),
    };
    let md5 =
        parse_hex(f[n - 1]).ok_or_else(|| format!("md5 `{}` is not 32 hex digits", f[n - 1]))?;
    if sectors == 0 {
        return Err("size 0".into());
    }
    let offset = lba
        .checked_mul(SECTOR)
        .ok_or_else(|| format!("lba {lba} is beyond any device"))?;
    let len = sectors
        .checked_mul(SECTOR)
        .filter(|l| offset.checked_add(*l).is_some())
        .ok_or_else(|| format!("size {sectors} is beyond any device"))?;
    if len > MAX_REQUEST {
        return Err(format!(
            "size {sectors} sectors is over the {MAX_REQUEST}-byte limit"
        ));
    }
    Ok(Request {
        time_ns,
        op,
        fua: false,
        offset,
        len,
        content: match op {
            Op::Write => Content::Whole(md5),
            _ => Content::None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_papers_lines() {
        let r = parse_line(
            "89966527788578 4893 syslogd 904265560 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1",
        )
        .unwrap();
        assert_eq!(r.op, Op::Write);
        assert_eq!(r.offset, 904265560 * 512);
        assert_eq!(r.len, 4096);
        assert!(matches!(r.content, Content::Whole(_)));
        let r = parse_line("1 2 kworker/u8:2 my proc 16 8 R 8 0 531e779ca0ab2d3be6d2f9fca2d2f5e1")
            .unwrap();
        assert_eq!((r.op, r.offset), (Op::Read, 16 * 512));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        for (line, says) in [
            (
                "1 2 p 3 8 X 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1",
                "neither W nor R",
            ),
            ("1 2 p 3 8 W 6 0 zz", "md5"),
            ("1 2 p x 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1", "lba"),
            ("1 2 p 3 0 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1", "size 0"),
            ("1 2 p 3 8 W", "fields"),
            (
                "1 2 p 3 4000000000 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1",
                "limit",
            ),
            (
                "1 2 p 36028797018963968 8 W 6 0 531e779ca0ab2d3be6d2f9fca2d2f5e1",
                "beyond",
            ),
        ] {
            let e = parse_line(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
