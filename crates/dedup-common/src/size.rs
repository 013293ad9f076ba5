//! Byte sizes as users type them (`4K`, `10G`, `1.5T`, `512`) and as we print them.
//! Suffixes are binary (K = 1024), as block-device tools use them.

use crate::error::{Error, Result};

const UNITS: [(char, u32); 5] = [('K', 10), ('M', 20), ('G', 30), ('T', 40), ('P', 50)];

/// Parse a size such as `4096`, `4K`, `4KiB`, `10G`, `1.5T` into bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = || {
        Error::InvalidArgument(format!(
            "invalid size {text:?}: expected a number with an optional K, M, G, T or P suffix (binary units), e.g. 4K or 10G"
        ))
    };
    let t = text.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (number, shift) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let upper = c.to_ascii_uppercase();
            let shift = UNITS
                .iter()
                .find(|(u, _)| *u == upper)
                .map(|(_, s)| *s)
                .ok_or_else(bad)?;
            (&t[..t.len() - 1], shift)
        }
        _ => (t, 0),
    };
    if number.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_shl(shift)
            .filter(|v| v >> shift == n)
            .ok_or_else(bad);
    }
    let f: f64 = number.parse().map_err(|_| bad())?;
    if !f.is_finite() || f < 0.0 {
        return Err(bad());
    }
    let bytes = f * (1u64 << shift) as f64;
    if bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(Error::InvalidArgument(format!(
            "invalid size {text:?}: not a whole number of bytes"
        )));
    }
    Ok(bytes as u64)
}

/// Format bytes for people: `4.0 KiB`, `10.0 GiB`, `512 B`.
pub fn format_size(bytes: u64) -> String {
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in ["KiB", "MiB", "GiB", "TiB", "PiB"] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert_eq!(parse_size("1.5K").unwrap(), 1536);
        assert_eq!(parse_size(" 8M ").unwrap(), 8 << 20);
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in ["", "K", "4X", "-1", "1.3", "abc", "99999999999P", "nan"] {
            assert!(parse_size(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn formats_sizes_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(4096), "4.0 KiB");
        assert_eq!(format_size(10 << 30), "10.0 GiB");
    }
}
