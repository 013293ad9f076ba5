//! Reading a trace of either format, line by line, with line numbers in
//! every complaint.

use std::io::{BufRead, Read};

use crate::request::Request;
use crate::{fiu, native};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Native,
    Fiu,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ParseError {
    #[error("line {line}: {message}")]
    Line { line: u64, message: String },
    #[error("reading the trace: {0}")]
    Io(String),
}

/// Requests of a trace in order. Malformed lines are skipped and counted
/// (the first few kept for the report) unless `strict`, which ends the
/// trace with the first one's error.
pub struct TraceReader<R: BufRead> {
    input: R,
    line_no: u64,
    format: Option<Format>,
    strict: bool,
    /// FIU timestamps are absolute: made relative to the first request.
    first_time: Option<u64>,
    pub skipped: u64,
    pub first_skipped: Vec<String>,
    done: bool,
    buf: Vec<u8>,
}

const KEEP_SKIPPED: usize = 20;

/// The longest line read (a 64 MiB write lists 16,384 blocks of 33 bytes:
/// about 540 KB); a longer one is malformed, and a file without newlines
/// is not read whole into memory.
const MAX_LINE: u64 = 1 << 20;

/// A recorder that could not write its whole trace says so on this line.
pub const INCOMPLETE: &str = "# dedup-trace incomplete";

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R, strict: bool) -> Self {
        TraceReader {
            input,
            line_no: 0,
            format: None,
            strict,
            first_time: None,
            skipped: 0,
            first_skipped: Vec::new(),
            done: false,
            buf: Vec::new(),
        }
    }

    /// The format, once the first line has been read.
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    fn bad(&mut self, message: String) -> Option<Result<Request, ParseError>> {
        let e = ParseError::Line {
            line: self.line_no,
            message,
        };
        if self.strict {
            self.done = true;
            return Some(Err(e));
        }
        self.skipped += 1;
        if self.first_skipped.len() < KEEP_SKIPPED {
            self.first_skipped.push(e.to_string());
        }
        None
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Request, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.buf.clear();
            let n = match (&mut self.input)
                .take(MAX_LINE)
                .read_until(b'\n', &mut self.buf)
            {
                Ok(n) => n,
                Err(e) => {
                    self.done = true;
                    return Some(Err(ParseError::Io(e.to_string())));
                }
            };
            if n == 0 {
                self.done = true;
                break;
            }
            self.line_no += 1;
            if n as u64 == MAX_LINE && self.buf.last() != Some(&b'\n') {
                // Skip the rest of the overlong line.
                loop {
                    let mut rest = Vec::new();
                    match (&mut self.input)
                        .take(MAX_LINE)
                        .read_until(b'\n', &mut rest)
                    {
                        Ok(m) if m as u64 == MAX_LINE && rest.last() != Some(&b'\n') => continue,
                        _ => break,
                    }
                }
                if let Some(e) =
                    self.bad(format!("longer than {MAX_LINE} bytes (is this a trace?)"))
                {
                    return Some(e);
                }
                continue;
            }
            let Ok(line) = std::str::from_utf8(&self.buf) else {
                if let Some(e) = self.bad("not text (invalid UTF-8)".into()) {
                    return Some(e);
                }
                continue;
            };
            let line = line.trim().to_string();
            if let Some(why) = line.strip_prefix(INCOMPLETE) {
                // Refused even when lenient: requests are missing here.
                self.done = true;
                return Some(Err(ParseError::Line {
                    line: self.line_no,
                    message: format!(
                        "the recording is incomplete from here on ({}): requests are missing",
                        why.trim_start_matches(':').trim()
                    ),
                }));
            }
            if self.format.is_none() && !line.is_empty() {
                self.format = Some(if line.starts_with(native::HEADER) {
                    Format::Native
                } else {
                    Format::Fiu
                });
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let parsed = match self.format {
                Some(Format::Native) => native::parse_line(&line),
                _ => fiu::parse_line(&line),
            };
            match parsed {
                Ok(mut r) => {
                    if self.format == Some(Format::Fiu) {
                        let t0 = *self.first_time.get_or_insert(r.time_ns);
                        r.time_ns = r.time_ns.saturating_sub(t0);
                    }
                    return Some(Ok(r));
                }
                Err(m) => {
                    if let Some(e) = self.bad(m) {
                        return Some(e);
                    }
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD5: &str = "531e779ca0ab2d3be6d2f9fca2d2f5e1";

    #[test]
    fn fiu_lines_get_relative_times_and_bad_lines_are_counted() {
        let text = format!(
            "1000 1 p 0 8 W 8 0 {MD5}\nnonsense\n1500 1 p 8 8 R 8 0 {MD5}\n\n# note\n1 2 p 3 8 Q 6 0 {MD5}\n"
        );
        let mut r = TraceReader::new(text.as_bytes(), false);
        let got: Vec<Request> = r.by_ref().map(|x| x.unwrap()).collect();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].time_ns, got[1].time_ns), (0, 500));
        assert_eq!(r.skipped, 2);
        assert!(
            r.first_skipped[0].starts_with("line 2:"),
            "{:?}",
            r.first_skipped
        );
        assert!(
            r.first_skipped[1].starts_with("line 6:"),
            "{:?}",
            r.first_skipped
        );
        assert_eq!(r.format(), Some(Format::Fiu));
    }

    #[test]
    fn strict_stops_at_the_first_bad_line() {
        let text = "# dedup-trace 1\n0 F 0 0\n5 W 0 4096\n6 F 0 0\n";
        let got: Vec<_> = TraceReader::new(text.as_bytes(), true).collect();
        assert_eq!(got.len(), 2);
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.starts_with("line 3:"), "{e}");
    }

    #[test]
    fn an_overlong_line_is_skipped_and_an_incomplete_recording_refused() {
        let mut bytes = b"# dedup-trace 1\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'7', 3 << 20));
        bytes.extend_from_slice(b"\n0 F 0 0\n# dedup-trace incomplete: disk full\n1 F 0 0\n");
        let mut r = TraceReader::new(&bytes[..], false);
        let got: Vec<_> = r.by_ref().collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].is_ok());
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.starts_with("line 4:") && e.contains("disk full"), "{e}");
        assert_eq!(r.skipped, 1);
        assert!(
            r.first_skipped[0].contains("longer than"),
            "{:?}",
            r.first_skipped
        );
    }

    #[test]
    fn invalid_utf8_is_a_bad_line_not_the_end() {
        let mut bytes = b"# dedup-trace 1\n".to_vec();
        bytes.extend_from_slice(b"\xff\xfe\n0 F 0 0\n");
        let mut r = TraceReader::new(&bytes[..], false);
        let got: Vec<_> = r.by_ref().collect();
        assert_eq!(got.len(), 1);
        assert_eq!(r.skipped, 1);
    }
}
