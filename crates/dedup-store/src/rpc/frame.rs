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

/// Encode `msg` and write it as one frame (not flushed).
pub(crate) fn write_frame(w: &mut impl Write, msg: &impl Serialize) -> io::Result<()> {
    let body = postcard::to_allocvec(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message over 4 GiB"))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&body)
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
}
