//! Frames: a 4-byte big-endian length, then one postcard-encoded message.
//! The length is checked against the reader's limit before the body is
//! allocated, so a peer cannot make us allocate more than one frame.

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Read one frame's body; `None` at a clean end of stream (before a frame).
pub(crate) fn read_frame(r: &mut impl Read, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes is over the limit of {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Encode `msg` and write it as one frame (not flushed). The body is
/// encoded straight into `w` (a buffered writer) after its length is
/// counted: an append of 8 MiB was first encoded into a vector of its
/// own, one more copy of every byte sent and a fresh 8 MiB of memory to
/// fault in, per frame.
pub(crate) fn write_frame(w: &mut impl Write, msg: &impl Serialize) -> io::Result<()> {
    let len = postcard::experimental::serialized_size(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let len = u32::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message over 4 GiB"))?;
    w.write_all(&len.to_be_bytes())?;
    let mut out = Out {
        w,
        written: 0,
        failed: None,
    };
    let encoded = postcard::serialize_with_flavor::<_, _, ()>(msg, &mut out);
    match (out.failed, encoded) {
        // The writer's own error (a timeout, a closed peer), not postcard's
        // stand-in for it.
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(io::Error::other(format!("encoding a message: {e}"))),
        // Counted and written by the same encoder: a difference is a bug
        // here, and the peer would read garbage after it.
        (None, Ok(())) if out.written != len as usize => Err(io::Error::other(format!(
            "a message encoded to {} bytes after counting {len}",
            out.written
        ))),
        (None, Ok(())) => Ok(()),
    }
}

/// postcard's output into a writer, keeping the writer's error (postcard's
/// own flavor for this turns every error into "buffer full").
struct Out<'w, W: Write> {
    w: &'w mut W,
    written: usize,
    failed: Option<io::Error>,
}

impl<W: Write> postcard::ser_flavors::Flavor for &mut Out<'_, W> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match self.w.write_all(data) {
            Ok(()) => {
                self.written += data.len();
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e);
                Err(postcard::Error::SerializeBufferFull)
            }
        }
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Decode a frame's body as `T`, which must use all of it.
pub(crate) fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    match postcard::take_from_bytes::<T>(body) {
        Ok((v, [])) => Ok(v),
        Ok((_, rest)) => Err(format!("{} bytes after the message", rest.len())),
        Err(e) => Err(format!("undecodable message: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_ones_are_refused_before_allocating() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &(7u64, "x".to_string())).unwrap();
        let body = read_frame(&mut &buf[..], 100).unwrap().unwrap();
        assert_eq!(decode::<(u64, String)>(&body).unwrap(), (7, "x".into()));
        assert!(read_frame(&mut &[][..], 100).unwrap().is_none());
        let huge = u32::MAX.to_be_bytes();
        let e = read_frame(&mut &huge[..], 100).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        assert!(read_frame(&mut &[0u8, 0][..], 100).is_err(), "a cut length");
    }

    /// A frame is its length, then exactly postcard's encoding; a writer
    /// failing part-way fails the frame with the writer's own error (a
    /// client tells a timeout from a closed peer by it).
    #[test]
    fn a_frame_is_postcards_encoding_and_a_writers_error_is_kept() {
        let msg = (3u64, vec![7u8; 300_000], "tail".to_string());
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        let body = postcard::to_allocvec(&msg).unwrap();
        assert_eq!(buf[..4], (body.len() as u32).to_be_bytes());
        assert_eq!(buf[4..], body[..]);

        struct Stalls(usize);
        impl Write for Stalls {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                let n = b.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        for room in [0, 3, 4, 5, 1000, 299_999] {
            let e = write_frame(&mut Stalls(room), &msg).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "room {room}: {e}");
        }
    }
}
