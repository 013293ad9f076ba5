//! A connection over either transport, and the listener that yields them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};

use super::tls::Binding;
use std::time::{Duration, Instant};

use super::protocol::Endpoint;

/// The send buffer a client asks for on a Unix socket (the kernel grants
/// up to `net.core.wmem_max`): an append of 2 MiB crossed the default
/// 208 KiB in about ten sleeps and wake-ups of each side, 24,500 context
/// switches for a GiB where 4 MiB take 11,500. A refusal is harmless.
const SEND_BUFFER: usize = 4 << 20;

pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// Connect, giving up on a TCP host that does not answer within
    /// `timeout` (`None`: the kernel's own limit, about two minutes).
    /// TCP is TLS (`tls.rs`): the stream is the plain end of its pump,
    /// with the session's binding; a Unix socket's binding is zeros.
    pub(crate) fn connect(
        to: &Endpoint,
        timeout: Option<Duration>,
    ) -> io::Result<(Stream, Binding)> {
        let tcp = Stream::connect_plain(to, timeout)?;
        match tcp {
            Stream::Tcp(s) => {
                let (plain, binding) = super::tls::connect(s)?;
                Ok((Stream::Unix(plain), binding))
            }
            unix => Ok((unix, [0; 32])),
        }
    }

    /// `connect` without TLS.
    fn connect_plain(to: &Endpoint, timeout: Option<Duration>) -> io::Result<Stream> {
        match to {
            Endpoint::Unix(p) => {
                let s = UnixStream::connect(p)?;
                let _ = socket2::SockRef::from(&s).set_send_buffer_size(SEND_BUFFER);
                Ok(Stream::Unix(s))
            }
            Endpoint::Tcp(a) => {
                let s = match timeout {
                    Some(t) => TcpStream::connect_timeout(a, t)?,
                    None => TcpStream::connect(a)?,
                };
                // Small requests (lookups) must not wait for Nagle.
                s.set_nodelay(true)?;
                keep_alive(&s);
                Ok(Stream::Tcp(s))
            }
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(s) => s.try_clone().map(Stream::Unix),
            Stream::Tcp(s) => s.try_clone().map(Stream::Tcp),
        }
    }

    /// Fail a read or a write that waits longer than `timeout` (`None`:
    /// wait for ever), on this stream and every clone of it.
    pub(crate) fn set_timeouts(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }

    /// Fail a read that waits longer than `timeout` (`None`: for ever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(timeout),
            Stream::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    /// Fail a write that waits longer than `timeout` (`None`: for ever).
    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(timeout),
            Stream::Tcp(s) => s.set_write_timeout(timeout),
        }
    }

    /// Close both directions: a thread blocked reading or writing it
    /// returns at once.
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// TCP keepalive probes after a minute of silence, every 10 s, 6 of them:
/// an idle peer whose host died or whose network went away is noticed in
/// about two minutes (the kernel's default waits two hours), and the
/// blocked read on it fails, so a server frees the slot and a client
/// reports the loss. Keepalive does not probe while sent data waits for
/// its acknowledgement; `USER_TIMEOUT` covers that case. A peer that is
/// alive but silent is the job of the timeouts.
pub(crate) const KEEPALIVE: (Duration, Duration, u32) =
    (Duration::from_secs(60), Duration::from_secs(10), 6);

/// How long data sent may go unacknowledged before the kernel drops the
/// connection (`TCP_USER_TIMEOUT`), as long as keepalive takes to give up.
pub(crate) const USER_TIMEOUT: Duration = Duration::from_secs(120);

/// Best effort: a socket that refuses the options still serves, as
/// before they were set, rather than failing the connection.
fn keep_alive(s: &TcpStream) {
    let (time, interval, retries) = KEEPALIVE;
    let k = socket2::TcpKeepalive::new()
        .with_time(time)
        .with_interval(interval)
        .with_retries(retries);
    let r = socket2::SockRef::from(s);
    let _ = r.set_tcp_keepalive(&k);
    let _ = r.set_tcp_user_timeout(Some(USER_TIMEOUT));
}

pub(crate) enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Make `accept` return `WouldBlock` rather than wait, so the accept
    /// loop can look at its stop flag (a blocked accept cannot be woken
    /// portably, least of all once its socket file is gone).
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    /// A connection, in blocking mode whatever the listener's mode.
    pub(crate) fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Unix(l) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                Ok(Stream::Unix(s))
            }
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nonblocking(false)?;
                s.set_nodelay(true)?;
                keep_alive(&s);
                Ok(Stream::Tcp(s))
            }
        }
    }
}

/// A stream whose reads fail once a deadline has passed, however the bytes
/// trickle in: a read timeout alone bounds each wait, so a peer sending a
/// byte every few seconds could keep a handshake going for hours. Without
/// a deadline (`lift`), reads go straight to the stream.
pub(crate) struct Deadlined {
    stream: Stream,
    deadline: Option<Instant>,
}

impl Deadlined {
    pub(crate) fn new(stream: Stream, deadline: Option<Instant>) -> Deadlined {
        Deadlined { stream, deadline }
    }

    /// No deadline from now on; reads and writes time out after `timeout`
    /// as `Stream::set_timeouts` says.
    pub(crate) fn lift(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.deadline = None;
        self.stream.set_timeouts(timeout)
    }

    /// No deadline, and reads that wait as long as the peer takes (for a
    /// reader whose caller times the peer out itself); writes keep their
    /// timeout.
    pub(crate) fn untimed_reads(&mut self) -> io::Result<()> {
        self.deadline = None;
        self.stream.set_read_timeout(None)
    }
}

impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the deadline for this connection passed",
                ));
            }
            self.stream.set_read_timeout(Some(left))?;
        }
        self.stream.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ends of a TCP connection probe a silent peer as `KEEPALIVE`
    /// says and drop one that acknowledges nothing for `USER_TIMEOUT`; a
    /// Unix socket has no such thing and needs none.
    #[test]
    fn tcp_connections_keep_alive_on_both_ends() {
        let listener = Listener::Tcp(TcpListener::bind("127.0.0.1:0").unwrap());
        let Listener::Tcp(l) = &listener else {
            unreachable!()
        };
        let to = Endpoint::Tcp(l.local_addr().unwrap());
        let client = Stream::connect_plain(&to, Some(Duration::from_secs(5))).unwrap();
        let server = listener.accept().unwrap();
        let (time, interval, retries) = KEEPALIVE;
        for s in [&client, &server] {
            let Stream::Tcp(s) = s else { unreachable!() };
            let r = socket2::SockRef::from(s);
            assert!(r.keepalive().unwrap());
            assert_eq!(r.tcp_keepalive_time().unwrap(), time);
            assert_eq!(r.tcp_keepalive_interval().unwrap(), interval);
            assert_eq!(r.tcp_keepalive_retries().unwrap(), retries);
            assert_eq!(r.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
        }
    }
}
