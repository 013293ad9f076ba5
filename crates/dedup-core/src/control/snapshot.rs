//! A backup of a served device through its control socket (issue 39):
//! `{"op":"snapshot"}` freezes the LBN map (`engine/snapshot.rs`) and
//! keeps the connection as a session, so the snapshot lives exactly as
//! long as the backup's process holds the socket: a backup that dies ends
//! it, and nothing outlives the server.
//!
//! Every reply is a JSON line, `{"ok":true,...,"bytes":N}` followed by N
//! bytes, or `{"ok":false,"error":..}`. The first (`SnapshotInfo` as
//! `result`) is followed by the tracking's flags, 64 regions to a
//! little-endian `u64`. Then the client sends JSON lines
//! (`SessionRequest`):
//! - `map`: one byte per block, 0 unmapped, 1 mapped with no fingerprint
//!   kept, 2 followed by its 32-byte fingerprint;
//! - `read`: the blocks' bytes;
//! - `end`: no bytes; with a mark, the device's tracking goes on from the
//!   freeze under it (the backup committed); the session then closes.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::{Request, MAX_REQUEST};
use crate::changes::Changes;
use crate::engine::{ChunkState, Device, SnapshotStart};
use crate::error::{Error, IoContext, Result};
use crate::fingerprint::{Fingerprint, HashAlgo, FINGERPRINT_BYTES};

/// Most blocks one `map` may ask for (33 MiB of reply at most).
pub const MAX_MAP_BLOCKS: u64 = 1 << 20;
/// Most bytes one `read` may ask for.
pub const MAX_READ_BYTES: u64 = 16 << 20;
/// Most tracking regions a device may have (512 TiB of 4 KiB chunks): a
/// client takes no more flags, whatever size a reply claims.
const MAX_FLAG_REGIONS: u64 = 1 << 31;

const UNMAPPED: u8 = 0;
const UNKNOWN: u8 = 1;
const KNOWN: u8 = 2;

/// What the server says when the snapshot starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub uuid: [u8; 16],
    pub chunk_size: u32,
    pub logical_size: u64,
    pub hash: HashAlgo,
    /// Whether `end` with a mark restarts the device's tracking.
    pub can_track: bool,
    /// The mark of the device's tracking at the freeze, if tracked (its
    /// flags follow the reply).
    pub changes_mark: Option<u64>,
    /// The flags' format (`Changes::FORMAT`). A server built before it
    /// sends none, and a dense bitmap of 1,024-chunk regions: a client
    /// reads those bytes and does not trust them (untracked, the backup
    /// walks everything), since a bitmap can happen to parse as pages and
    /// then say changed regions did not change.
    #[serde(default)]
    pub changes_format: Option<u32>,
}

/// How long a session waits for its client's next request (a backup's
/// commit runs between its last read and `end`), and for a reply to go.
const SESSION_IDLE: Duration = Duration::from_secs(3600);
const SESSION_SEND: Duration = Duration::from_secs(600);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum SessionRequest {
    Map { first: u64, count: u64 },
    Read { first: u64, count: u64 },
    End { mark: Option<u64> },
}

/// The server's side: run a session on `stream` until `end` or the
/// client goes away; the snapshot ends with it either way.
pub(super) fn serve(stream: &UnixStream, device: &Device) {
    let mut out = stream;
    let start = match device.snapshot_start() {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(out, "{}", refusal(&e));
            return;
        }
    };
    let id = start.id;
    let ended = run(stream, device, start);
    if let Err(e) = &ended {
        debug!("snapshot session: {e}");
    }
    if !matches!(ended, Ok(true)) {
        if let Err(e) = device.snapshot_end(id, None) {
            warn!("ending a snapshot: {e}");
        }
    }
}

/// The session's loop; `Ok(true)` once `end` ended the snapshot.
fn run(stream: &UnixStream, device: &Device, start: SnapshotStart) -> Result<bool> {
    let ctx = || "a snapshot session".to_string();
    stream.set_read_timeout(Some(SESSION_IDLE)).context(ctx)?;
    stream.set_write_timeout(Some(SESSION_SEND)).context(ctx)?;
    let cfg = device.config();
    let info = SnapshotInfo {
        uuid: cfg.uuid,
        chunk_size: cfg.chunk_size,
        logical_size: cfg.logical_size,
        hash: cfg.hash,
        can_track: start.can_track,
        changes_mark: start.changes.as_ref().map(|c| c.mark),
        changes_format: Some(Changes::FORMAT),
    };
    let flags: Vec<u8> = start
        .changes
        .as_ref()
        .map_or_else(Vec::new, |c| c.page_bytes());
    let mut out = stream;
    let first = serde_json::json!({"ok": true, "result": info, "bytes": flags.len()});
    writeln!(out, "{first}")
        .and_then(|()| out.write_all(&flags))
        .context(ctx)?;
    let mut reader = BufReader::new(stream);
    let cs = u64::from(info.chunk_size);
    // Reused from request to request: a read's 16 MiB at most, a map's
    // 33 MiB at most.
    let (mut read_buf, mut map_buf) = (Vec::new(), Vec::new());
    loop {
        let mut line = String::new();
        let n = Read::take(&mut reader, MAX_REQUEST)
            .read_line(&mut line)
            .context(ctx)?;
        if n == 0 {
            return Ok(false);
        }
        let req = match serde_json::from_str::<SessionRequest>(line.trim()) {
            Ok(r) => r,
            Err(e) => {
                let e = Error::InvalidArgument(format!("bad snapshot request: {e}"));
                let _ = writeln!(out, "{}", refusal(&e));
                return Err(e);
            }
        };
        let reply: Result<&[u8]> = match req {
            SessionRequest::Map { first, count } if count <= MAX_MAP_BLOCKS => {
                device.snapshot_map(first, count).map(|s| {
                    encode_states(&s, &mut map_buf);
                    &map_buf[..]
                })
            }
            SessionRequest::Read { first, count } if count.saturating_mul(cs) <= MAX_READ_BYTES => {
                read_buf.resize((count * cs) as usize, 0);
                device
                    .snapshot_read(first, &mut read_buf)
                    .map(|()| &read_buf[..])
            }
            SessionRequest::Map { .. } | SessionRequest::Read { .. } => Err(Error::InvalidArgument(
                format!("a snapshot request may cover at most {MAX_MAP_BLOCKS} blocks to map or {MAX_READ_BYTES} bytes to read"),
            )),
            SessionRequest::End { mark } => {
                let restarted = device.snapshot_end(start.id, mark)?;
                let body = serde_json::json!({"ok": true, "tracking": restarted, "bytes": 0});
                writeln!(out, "{body}").context(ctx)?;
                return Ok(true);
            }
        };
        match reply {
            Ok(bytes) => {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"ok": true, "bytes": bytes.len()})
                )
                .and_then(|()| out.write_all(bytes))
                .context(ctx)?;
            }
            Err(e) => writeln!(out, "{}", refusal(&e)).context(ctx)?,
        }
    }
}

/// The reply line of a request refused for `e`.
fn refusal(e: &Error) -> serde_json::Value {
    serde_json::json!({"ok": false, "error": e.to_string()})
}

/// `states` as a `map` reply's bytes, into `out` (cleared first).
fn encode_states(states: &[ChunkState], out: &mut Vec<u8>) {
    out.clear();
    for s in states {
        match s {
            ChunkState::Unmapped => out.push(UNMAPPED),
            ChunkState::Unknown => out.push(UNKNOWN),
            ChunkState::Known(fp) => {
                out.push(KNOWN);
                out.extend_from_slice(&fp.0);
            }
        }
    }
}

/// `count` block states from a `map` reply; anything else is an error.
pub fn decode_states(bytes: &[u8], count: u64) -> Result<Vec<ChunkState>> {
    let bad = |why: String| Error::corrupt("a snapshot's map reply", why);
    let mut out = Vec::with_capacity(count.min(MAX_MAP_BLOCKS) as usize);
    let mut rest = bytes;
    while let Some((&tag, tail)) = rest.split_first() {
        rest = tail;
        out.push(match tag {
            UNMAPPED => ChunkState::Unmapped,
            UNKNOWN => ChunkState::Unknown,
            KNOWN => {
                if rest.len() < FINGERPRINT_BYTES {
                    return Err(bad("it ends inside a fingerprint".into()));
                }
                let (fp, tail) = rest.split_at(FINGERPRINT_BYTES);
                rest = tail;
                let mut b = [0u8; FINGERPRINT_BYTES];
                b.copy_from_slice(fp);
                ChunkState::Known(Fingerprint(b))
            }
            t => return Err(bad(format!("block state {t} is not one this build knows"))),
        });
        if out.len() as u64 > count {
            break;
        }
    }
    if out.len() as u64 != count {
        return Err(bad(format!(
            "{} block states for {count} blocks",
            out.len()
        )));
    }
    Ok(out)
}

/// The client's side: a snapshot of a served device, held until `end`
/// or drop (which ends it without restarting the tracking).
pub struct SnapshotClient {
    reader: BufReader<UnixStream>,
    pub info: SnapshotInfo,
    /// The tracking's flags at the freeze, if tracked.
    changes: Option<Changes>,
}

impl SnapshotClient {
    /// Freeze the device served behind `socket`; `Ok(None)` if nobody
    /// answers there (the device is not served).
    pub fn start(socket: &Path) -> Result<Option<SnapshotClient>> {
        let Some(stream) = super::connect(socket)? else {
            return Ok(None);
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(3600)))
            .context(|| "setting a socket timeout".to_string())?;
        let mut reader = BufReader::new(stream);
        let line = serde_json::to_string(&Request::Snapshot).expect("a request encodes");
        send(&reader, &line)?;
        let v = reply_line(&mut reader)?;
        let info: SnapshotInfo = serde_json::from_value(v["result"].clone())
            .map_err(|e| Error::corrupt("a snapshot's first reply", e.to_string()))?;
        let bad = |why: String| Error::corrupt("a snapshot's first reply", why);
        if info.chunk_size == 0 || info.logical_size % u64::from(info.chunk_size) != 0 {
            return Err(bad(format!(
                "chunk size {} for {} bytes",
                info.chunk_size, info.logical_size
            )));
        }
        let chunks = info.logical_size / u64::from(info.chunk_size);
        if chunks.div_ceil(Changes::REGION_CHUNKS) > MAX_FLAG_REGIONS {
            return Err(bad(format!(
                "{} bytes of device, more than any device has",
                info.logical_size
            )));
        }
        let most = match info.changes_mark {
            Some(_) => Changes::most_bytes(chunks),
            None => 0,
        };
        // (An older server's bitmap is never longer than the pages.)
        let bytes = payload(&mut reader, &v, most)?;
        let changes = match (info.changes_mark, info.changes_format) {
            (Some(mark), Some(Changes::FORMAT)) => {
                Some(Changes::from_page_bytes(mark, &bytes, chunks).map_err(bad)?)
            }
            (Some(_), format) => {
                debug!(
                    "the server sends tracking flags of format {format:?}, not {}: untracked",
                    Changes::FORMAT
                );
                None
            }
            (None, _) => None,
        };
        Ok(Some(SnapshotClient {
            reader,
            info,
            changes,
        }))
    }

    /// What the device's tracking said at the freeze.
    pub fn changes(&self) -> Option<Changes> {
        self.changes.clone()
    }

    pub fn map(&mut self, first: u64, count: u64) -> Result<Vec<ChunkState>> {
        let bytes = self.ask(
            &SessionRequest::Map { first, count },
            count.saturating_mul(1 + FINGERPRINT_BYTES as u64),
        )?;
        decode_states(&bytes, count)
    }

    /// Fill `buf` (whole blocks) from block `first`, as at the freeze.
    pub fn read(&mut self, first: u64, buf: &mut [u8]) -> Result<()> {
        let cs = u64::from(self.info.chunk_size);
        let count = buf.len() as u64 / cs;
        let v = self.request(&SessionRequest::Read { first, count })?;
        let n = announced(&v, count * cs)?;
        if n != buf.len() {
            return Err(Error::corrupt(
                "a snapshot's read reply",
                format!("{n} bytes for {} asked", buf.len()),
            ));
        }
        // Straight into the caller's buffer: a first backup reads the
        // whole image through here.
        self.reader
            .read_exact(buf)
            .context(|| "reading a snapshot's reply".to_string())
    }

    /// End the snapshot; with `mark`, restart the device's tracking from
    /// the freeze. Returns whether it did.
    pub fn end(mut self, mark: Option<u64>) -> Result<bool> {
        let v = self.request(&SessionRequest::End { mark })?;
        Ok(v["tracking"] == serde_json::Value::Bool(true))
    }

    /// Send `req`; its reply line.
    fn request(&mut self, req: &SessionRequest) -> Result<serde_json::Value> {
        send(
            &self.reader,
            &serde_json::to_string(req).expect("a request encodes"),
        )?;
        reply_line(&mut self.reader)
    }

    /// Send `req`; the bytes of its reply, at most `most`.
    fn ask(&mut self, req: &SessionRequest, most: u64) -> Result<Vec<u8>> {
        let v = self.request(req)?;
        payload(&mut self.reader, &v, most)
    }
}

fn send(reader: &BufReader<UnixStream>, line: &str) -> Result<()> {
    let mut w = reader.get_ref();
    writeln!(w, "{line}").context(|| "sending to a device's server".to_string())
}

/// One reply line; an error reply becomes `Error::Remote`.
fn reply_line(reader: &mut BufReader<UnixStream>) -> Result<serde_json::Value> {
    let mut line = String::new();
    let n = Read::take(&mut *reader, MAX_REQUEST)
        .read_line(&mut line)
        .context(|| "reading a device server's reply".to_string())?;
    if n == 0 {
        return Err(Error::Remote(
            "the device's server closed the snapshot (it stopped?)".into(),
        ));
    }
    let v: serde_json::Value = serde_json::from_str(&line)
        .map_err(|e| Error::corrupt("a device server's reply", e.to_string()))?;
    if v["ok"] == serde_json::Value::Bool(true) {
        Ok(v)
    } else {
        Err(Error::Remote(
            v["error"].as_str().unwrap_or("no reason given").to_string(),
        ))
    }
}

/// The bytes a reply line announces, at most `most`.
fn announced(v: &serde_json::Value, most: u64) -> Result<usize> {
    let n = v["bytes"].as_u64().filter(|&n| n <= most).ok_or_else(|| {
        Error::corrupt(
            "a snapshot's reply",
            format!("{} bytes announced, at most {most} expected", v["bytes"]),
        )
    })?;
    Ok(n as usize)
}

/// The bytes a reply line announced, at most `most`.
fn payload(
    reader: &mut BufReader<UnixStream>,
    v: &serde_json::Value,
    most: u64,
) -> Result<Vec<u8>> {
    let n = announced(v, most)?;
    // Read, not allocated up front: memory follows the bytes that come,
    // whatever a reply claims.
    let mut bytes = Vec::new();
    Read::take(&mut *reader, n as u64)
        .read_to_end(&mut bytes)
        .context(|| "reading a snapshot's reply".to_string())?;
    if bytes.len() != n {
        return Err(Error::corrupt(
            "a snapshot's reply",
            format!("{n} bytes announced, {} came", bytes.len()),
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers one snapshot request with `info` and `flags`.
    fn fake_server(dir: &Path, info: serde_json::Value, flags: Vec<u8>) -> std::path::PathBuf {
        let path = dir.join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(&stream);
            let mut request = String::new();
            reader.read_line(&mut request).unwrap();
            let first = serde_json::json!({"ok": true, "result": info, "bytes": flags.len()});
            let mut out = &stream;
            writeln!(out, "{first}").unwrap();
            out.write_all(&flags).unwrap();
            // Held open until the client has read what it wants.
            let _ = reader.read_line(&mut request);
        });
        path
    }

    /// A device of 65 words of the old bitmap (1,024-chunk regions):
    /// 16.25 GiB of 4 KiB chunks, 17 page slots; its 520 bytes parse as a
    /// page whose index is the first word.
    fn older_reply(format: Option<u32>) -> (serde_json::Value, Vec<u8>) {
        let chunks: u64 = 65 * 64 * 1024;
        let mut words = vec![0u64; 65];
        words[0] = 1; // region 0 changed: the index of a page that parses
        words[40] = u64::MAX;
        let uuid = [0u8; 16];
        let info = serde_json::json!({
            "uuid": uuid, "chunk_size": 4096, "logical_size": chunks * 4096,
            "hash": "blake3", "can_track": true, "changes_mark": 7,
            "changes_format": format,
        });
        (info, words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    #[test]
    fn flags_from_a_server_that_names_no_format_are_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let (info, flags) = older_reply(None);
        // What it sends would parse as pages, saying region 40 * 64 did
        // not change.
        let chunks: u64 = 65 * 64 * 1024;
        let misread = Changes::from_page_bytes(7, &flags, chunks).unwrap();
        assert!(!misread.changed(40 * 64 * 1024, 64 * 1024));
        let client = SnapshotClient::start(&fake_server(dir.path(), info, flags))
            .unwrap()
            .unwrap();
        assert_eq!(client.changes(), None, "untracked: walk everything");
    }

    #[test]
    fn flags_in_this_format_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        let (info, _) = older_reply(Some(Changes::FORMAT));
        let chunks = 65 * 64 * 1024u64;
        let mut page = 1u64.to_le_bytes().to_vec();
        page.extend((0..64).flat_map(|i| u64::from(i == 3).to_le_bytes()));
        let want = Changes::from_page_bytes(7, &page, chunks).unwrap();
        let client = SnapshotClient::start(&fake_server(dir.path(), info, page))
            .unwrap()
            .unwrap();
        assert_eq!(client.changes(), Some(want));
    }

    #[test]
    fn states_round_trip_and_bad_replies_are_errors() {
        let fp = Fingerprint([7; FINGERPRINT_BYTES]);
        let states = vec![
            ChunkState::Unmapped,
            ChunkState::Known(fp),
            ChunkState::Unknown,
            ChunkState::Known(fp),
        ];
        let mut bytes = Vec::new();
        encode_states(&states, &mut bytes);
        assert_eq!(decode_states(&bytes, 4).unwrap(), states);
        // Short, long, cut inside a fingerprint, an unknown tag.
        assert!(decode_states(&bytes, 5).is_err());
        assert!(decode_states(&bytes, 3).is_err());
        assert!(decode_states(&bytes[..bytes.len() - 1], 4).is_err());
        let mut odd = bytes.clone();
        odd[0] = 9;
        assert!(decode_states(&odd, 4).is_err());
        for cut in 0..bytes.len() {
            let _ = decode_states(&bytes[..cut], 4);
        }
    }
}
