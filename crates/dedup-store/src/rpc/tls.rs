//! TLS for the server's TCP connections (issue 38): every byte after the
//! TCP handshake is encrypted and authenticated by TLS 1.3 (rustls), so a
//! man in the middle can neither read a backup nor alter a frame.
//!
//! Who is who is still the pre-shared key's business (`auth.rs`): the
//! server shows a certificate it makes up at start (rcgen), which the
//! client takes without a CA, and both sides' key proofs cover the TLS
//! session's exported keying material (RFC 5705/8446 exporters). A man in
//! the middle runs two TLS sessions with two different exporters, so the
//! proofs one side makes never hold on the other: he is found at the
//! handshake, before a byte of a backup is sent. Without a key
//! (`--no-auth`) the channel is still encrypted, against reading, not
//! against a middle.
//!
//! The connection code reads and writes a stream from two threads (one
//! reads frames ahead while the other answers), which a TLS session cannot
//! be split between. So a pump thread owns the TCP socket and the session
//! and carries plain bytes to and from one end of a local socket pair; the
//! connection gets the other end. Both directions flow independently
//! (non-blocking sockets and `poll`), as they did on the TCP socket.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, Connection, DigitallySignedStruct, ServerConfig,
    ServerConnection, SignatureScheme,
};

/// What both sides hash into their key proofs: the TLS session's
/// exported keying material (zeros on a Unix socket, which has no TLS).
pub type Binding = [u8; 32];

const EXPORTER_LABEL: &[u8] = b"EXPORTER-dedup-store-key-proof";

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn tls_err(doing: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("TLS: {doing}: {e}"))
}

/// The server's TLS settings: TLS 1.3 only, and a certificate made up
/// now for this process (its key never leaves it).
pub fn server_config() -> io::Result<Arc<ServerConfig>> {
    let cert = rcgen::generate_simple_self_signed(vec!["dedup-store".to_string()])
        .map_err(|e| tls_err("making the server's certificate", e))?;
    let chain = vec![cert.cert.der().clone()];
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| tls_err("the server's key", e))?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err("the server's settings", e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls_err("the server's certificate", e))?;
    Ok(Arc::new(config))
}

/// The client's TLS settings: TLS 1.3 only, any certificate whose key
/// signed the handshake (who the server is, the key proofs say).
pub fn client_config() -> io::Result<Arc<ClientConfig>> {
    let provider = provider();
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| tls_err("the client's settings", e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(KeyProofsDecide(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Takes any server certificate, but checks that its key signed the
/// handshake: the server is authenticated by its key proof over the
/// session's exporter, not by a CA.
#[derive(Debug)]
struct KeyProofsDecide(Arc<CryptoProvider>);

impl ServerCertVerifier for KeyProofsDecide {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Run the client's side of TLS on `tcp`: the plain end of the pump and
/// the session's binding.
pub fn connect(tcp: TcpStream) -> io::Result<(UnixStream, Binding)> {
    let name = ServerName::try_from("dedup-store").expect("a valid DNS name");
    let conn = ClientConnection::new(client_config()?, name)
        .map_err(|e| tls_err("starting the session", e))?;
    start(tcp, conn.into())
}

/// Run the server's side of TLS on an accepted `tcp`.
pub fn accept(tcp: TcpStream, config: Arc<ServerConfig>) -> io::Result<(UnixStream, Binding)> {
    let conn = ServerConnection::new(config).map_err(|e| tls_err("starting the session", e))?;
    start(tcp, conn.into())
}

/// Handshake (bounded by `HANDSHAKE_TIMEOUT`), export the binding, and
/// hand the session to a pump thread.
fn start(mut tcp: TcpStream, mut conn: Connection) -> io::Result<(UnixStream, Binding)> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let (read_timeout, write_timeout) = (tcp.read_timeout()?, tcp.write_timeout()?);
    while conn.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                "TLS: the handshake took too long",
            ));
        }
        tcp.set_read_timeout(Some(left))?;
        tcp.set_write_timeout(Some(left))?;
        conn.complete_io(&mut tcp)
            .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
    }
    tcp.set_read_timeout(read_timeout)?;
    tcp.set_write_timeout(write_timeout)?;
    let binding = conn
        .export_keying_material([0u8; 32], EXPORTER_LABEL, None)
        .map_err(|e| tls_err("exporting the session's binding", e))?;
    let (ours, theirs) = UnixStream::pair()?;
    std::thread::Builder::new()
        .name("dedup-tls".into())
        .spawn(move || pump(tcp, conn, theirs))?;
    Ok((ours, binding))
}

/// Plain bytes waiting for the local end, at most: past it, TLS records
/// are left in the kernel until the connection reads.
const MOST_PENDING: usize = 1 << 20;

/// Carry bytes both ways between the TLS session on `tcp` and the local
/// socket `local` until both directions have ended or either fails;
/// then both sockets are shut.
fn pump(mut tcp: TcpStream, mut conn: Connection, mut local: UnixStream) {
    let _ = pump_until_done(&mut tcp, &mut conn, &mut local);
    let _ = tcp.shutdown(Shutdown::Both);
    let _ = local.shutdown(Shutdown::Both);
}

fn pump_until_done(
    tcp: &mut TcpStream,
    conn: &mut Connection,
    local: &mut UnixStream,
) -> io::Result<()> {
    tcp.set_nonblocking(true)?;
    local.set_nonblocking(true)?;
    let mut to_local: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // Each direction's end: the peer's close (TLS close_notify or EOF),
    // and the local end's EOF.
    let (mut peer_done, mut local_done) = (false, false);
    let mut local_shut = false;
    loop {
        // Plain bytes the session holds: those of the last records read,
        // and those that came with the handshake's last message (read
        // before this pump began, so no poll would announce them).
        // (After the peer's close_notify, what came before it is read
        // out first, then `Ok(0)`.)
        loop {
            match conn.reader().read(&mut buf) {
                Ok(0) => {
                    peer_done = true;
                    break;
                }
                Ok(k) => to_local.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // The peer closed the TCP connection without a
                // close_notify: the end, as far as it goes.
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                    peer_done = true;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if peer_done && to_local.is_empty() && !local_shut {
            local.shutdown(Shutdown::Write)?;
            local_shut = true;
        }
        if local_shut && local_done && !conn.wants_write() {
            return Ok(());
        }
        let mut fds = [
            libc::pollfd {
                fd: tcp.as_raw_fd(),
                events: 0,
                revents: 0,
            },
            libc::pollfd {
                fd: local.as_raw_fd(),
                events: 0,
                revents: 0,
            },
        ];
        if !peer_done && to_local.len() < MOST_PENDING {
            fds[0].events |= libc::POLLIN;
        }
        if conn.wants_write() {
            fds[0].events |= libc::POLLOUT;
        }
        if !local_done && !conn.wants_write() {
            fds[1].events |= libc::POLLIN;
        }
        if !to_local.is_empty() {
            fds[1].events |= libc::POLLOUT;
        }
        // A socket nothing is asked of is left out: poll would still
        // report its hangup, at once and forever (a busy loop).
        for fd in &mut fds {
            if fd.events == 0 {
                fd.fd = -1;
            }
        }
        // SAFETY: two valid pollfd structs, owned here, for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let ready = |i: usize, ev: i16| fds[i].revents & (ev | libc::POLLHUP | libc::POLLERR) != 0;
        if ready(0, libc::POLLIN) && fds[0].events & libc::POLLIN != 0 {
            match conn.read_tls(tcp) {
                Ok(0) => peer_done = true,
                Ok(_) => {
                    let state = conn
                        .process_new_packets()
                        .map_err(|e| tls_err("a record from the peer", e))?;
                    if state.peer_has_closed() {
                        peer_done = true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if ready(0, libc::POLLOUT) && conn.wants_write() {
            match conn.write_tls(tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if ready(1, libc::POLLOUT) && !to_local.is_empty() {
            match local.write(&to_local) {
                Ok(k) => {
                    to_local.drain(..k);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        if ready(1, libc::POLLIN) && fds[1].events & libc::POLLIN != 0 {
            match local.read(&mut buf) {
                Ok(0) => {
                    local_done = true;
                    conn.send_close_notify();
                }
                Ok(k) => conn.writer().write_all(&buf[..k])?,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}
