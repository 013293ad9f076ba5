//! A connection's frames, read ahead on a thread of their own once the
//! peer is in. While the connection's thread hashes and stores one batch,
//! the next comes off the socket, so the client's writes do not wait for
//! each batch to be stored before the socket drains. (Read inline, the
//! server's thread waited on the socket about 0.4 s of a unique GiB and
//! its compressors sat idle meanwhile.)

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError};
use std::thread::Scope;
use std::time::Duration;

use super::frame::read_frame;

/// A frame's body, `None` at a clean end, or why reading stopped.
type Frame = io::Result<Option<Vec<u8>>>;

pub(crate) enum Frames<R> {
    /// Read when asked, each with its own limit: the handshake's frames
    /// are smaller, and its reads keep their deadline.
    Inline(R),
    /// Read by a thread with one limit, at most one frame ahead of the
    /// one being read (two frames of RAM, `MAX_FRAME` each at worst).
    /// The thread's reads wait as long as the peer takes; a peer is idle
    /// when no frame came for `idle` since the connection last asked for
    /// one, so a peer that waits on a long answer is not idle.
    Ahead {
        frames: Receiver<Frame>,
        idle: Option<Duration>,
    },
    /// Between the two, only while the thread is started.
    Moving,
}

impl<R: Read + Send> Frames<R> {
    /// The next frame: read now if inline (up to `limit`), else the one
    /// the thread read (up to the limit it was given).
    pub(crate) fn next(&mut self, limit: usize) -> Frame {
        match self {
            Frames::Inline(r) => read_frame(r, limit),
            // The thread stops only after sending an end or an error, or
            // once nobody listens: nothing is lost by calling a closed
            // channel an end.
            Frames::Ahead { frames, idle: None } => frames.recv().unwrap_or(Ok(None)),
            Frames::Ahead {
                frames,
                idle: Some(t),
            } => match frames.recv_timeout(*t) {
                Ok(frame) => frame,
                Err(RecvTimeoutError::Disconnected) => Ok(None),
                Err(RecvTimeoutError::Timeout) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no request for {t:?}"),
                )),
            },
            Frames::Moving => Ok(None),
        }
    }

    /// The inline reader, to change its timeouts; none once read ahead.
    pub(crate) fn inline(&mut self) -> Option<&mut R> {
        match self {
            Frames::Inline(r) => Some(r),
            _ => None,
        }
    }

    /// Read ahead from now on, on a thread of `scope`, frames of up to
    /// `limit` bytes, the peer idle after `idle` without one; the reader's
    /// own reads must not time out. The thread ends at the stream's end or
    /// first error, or when `self` is dropped and the stream then shut
    /// down: whoever ends the connection must shut it down, or the scope
    /// waits for the peer to close. Nothing to do if already ahead; an
    /// error if no thread could be started (the reader is then gone: the
    /// connection must end).
    pub(crate) fn read_ahead<'s>(
        &mut self,
        scope: &'s Scope<'s, '_>,
        limit: usize,
        idle: Option<Duration>,
    ) -> io::Result<()>
    where
        R: 's,
    {
        if !matches!(self, Frames::Inline(_)) {
            return Ok(());
        }
        let Frames::Inline(mut r) = std::mem::replace(self, Frames::Moving) else {
            unreachable!("matched just above")
        };
        let (tx, rx) = sync_channel::<Frame>(1);
        std::thread::Builder::new()
            .name("dedup-read".into())
            .spawn_scoped(scope, move || loop {
                let frame = read_frame(&mut r, limit);
                let more = matches!(frame, Ok(Some(_)));
                if tx.send(frame).is_err() || !more {
                    return;
                }
            })?;
        *self = Frames::Ahead { frames: rx, idle };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::frame::write_frame;

    fn framed(msgs: &[&str]) -> Vec<u8> {
        let mut buf = Vec::new();
        for m in msgs {
            write_frame(&mut buf, m).unwrap();
        }
        buf
    }

    /// Frames read ahead come in order, then the end; a frame over the
    /// thread's limit is the error it reads, and nothing after it.
    #[test]
    fn frames_read_ahead_come_in_order_then_the_end_or_the_error() {
        let bytes = framed(&["one", "two", "three"]);
        std::thread::scope(|s| {
            let mut f = Frames::Inline(&bytes[..]);
            let first = f.next(100).unwrap().unwrap();
            assert_eq!(crate::rpc::frame::decode::<String>(&first).unwrap(), "one");
            f.read_ahead(s, 100, None).unwrap();
            assert!(f.inline().is_none(), "read ahead");
            f.read_ahead(s, 100, None).unwrap(); // a second time: nothing
            for want in ["two", "three"] {
                let body = f.next(0).unwrap().unwrap();
                assert_eq!(crate::rpc::frame::decode::<String>(&body).unwrap(), want);
            }
            assert!(f.next(0).unwrap().is_none());
            assert!(f.next(0).unwrap().is_none(), "after the end, still the end");
        });
        let big = framed(&["x".repeat(200).as_str(), "after"]);
        std::thread::scope(|s| {
            let mut f = Frames::Inline(&big[..]);
            f.read_ahead(s, 100, None).unwrap();
            let e = f.next(0).unwrap_err();
            assert!(e.to_string().contains("over the limit"), "{e}");
            assert!(f.next(0).unwrap().is_none());
        });
    }

    /// A connection that ends while the thread waits on the socket stops
    /// the thread by shutting the socket down (the scope would otherwise
    /// wait for the peer).
    #[test]
    fn shutting_the_socket_down_ends_the_thread() {
        use std::os::unix::net::UnixStream;
        let (ours, _peer) = UnixStream::pair().unwrap();
        let reading = ours.try_clone().unwrap();
        std::thread::scope(|s| {
            let mut f = Frames::Inline(reading);
            f.read_ahead(s, 100, None).unwrap();
            drop(f);
            ours.shutdown(std::net::Shutdown::Both).unwrap();
        });
    }
}
