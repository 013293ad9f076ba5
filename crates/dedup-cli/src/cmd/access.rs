//! Who can reach a served device: which `--bind` addresses need TLS, the
//! TLS and read-only options handed to nbdkit (see nbdkit-tls(1)), and the
//! URIs clients connect with (libnbd's syntax, nbd_connect_uri(3)).

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};

use super::nbdkit::{uri_escape, uri_host, Listen};

/// nbdkit's `--tls`: off refuses TLS, allow lets each client choose,
/// require refuses every connection that does not start TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Off,
    Allow,
    Require,
}

/// What a TLS client proves itself with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// nbdkit's built-in certificate directories (/etc/pki/nbdkit, ...).
    Default,
    Psk {
        file: PathBuf,
        user: String,
    },
    Certificates(PathBuf),
}

/// How a device is exposed: TLS and whether clients may write.
#[derive(Clone, Debug)]
pub struct Access {
    pub tls: TlsMode,
    pub creds: Credentials,
    pub read_only: bool,
}

impl Access {
    /// From `dedup serve`'s flags. A key or certificates without `--tls`
    /// mean TLS is wanted, so they require it.
    pub fn new(
        tls: Option<TlsMode>,
        psk: Option<PathBuf>,
        certificates: Option<PathBuf>,
        read_only: bool,
    ) -> anyhow::Result<Access> {
        let creds = match (psk, certificates) {
            (Some(_), Some(_)) => {
                bail!("give either --tls-psk or --tls-certificates, not both")
            }
            (Some(file), None) => {
                let file = std::path::absolute(&file).context("resolving --tls-psk")?;
                let user = super::shared::psk::psk_username(&file)?;
                super::shared::psk::warn_if_shared(&file);
                Credentials::Psk { file, user }
            }
            (None, Some(dir)) => {
                let dir = std::path::absolute(&dir).context("resolving --tls-certificates")?;
                if !dir.is_dir() {
                    bail!(
                        "--tls-certificates {} is not a directory: give the directory holding ca-cert.pem, server-cert.pem and server-key.pem (see nbdkit-tls(1))",
                        dir.display()
                    );
                }
                Credentials::Certificates(dir)
            }
            (None, None) => Credentials::Default,
        };
        let tls = match (tls, &creds) {
            (Some(TlsMode::Off), Credentials::Psk { .. } | Credentials::Certificates(_)) => bail!(
                "--tls off and a TLS key or certificates contradict each other: drop --tls off (a key alone means --tls require)"
            ),
            (Some(mode), _) => mode,
            (None, Credentials::Default) => TlsMode::Off,
            (None, _) => TlsMode::Require,
        };
        Ok(Access {
            tls,
            creds,
            read_only,
        })
    }

    /// nbdkit's options for this (they go before the plugin).
    pub fn nbdkit_args(&self) -> Vec<OsString> {
        let mode = match self.tls {
            TlsMode::Off => "off",
            TlsMode::Allow => "on",
            TlsMode::Require => "require",
        };
        let mut args: Vec<OsString> = vec![format!("--tls={mode}").into()];
        if self.tls != TlsMode::Off {
            match &self.creds {
                Credentials::Default => {}
                Credentials::Psk { file, .. } => {
                    let mut a = OsString::from("--tls-psk=");
                    a.push(file);
                    args.push(a);
                }
                Credentials::Certificates(dir) => {
                    let mut a = OsString::from("--tls-certificates=");
                    a.push(dir);
                    args.push(a);
                }
            }
        }
        if self.read_only {
            // nbdkit then refuses writes, trims and zeroes itself (EPERM)
            // and tells clients the export is read-only.
            args.push("--readonly".into());
        }
        args
    }

    /// The URI for a TLS client: `nbds://` or `nbds+unix://`, with the PSK
    /// username in the authority and the key file as `tls-psk-file`
    /// (libnbd reads local files named in a URI only in tools that allow
    /// it, as nbdinfo, nbdcopy and nbdfuse do). With certificates the
    /// client finds its CA itself (libnbd: /etc/pki/libnbd, or
    /// `tls-certificates=DIR` added to the URI).
    pub fn tls_uri(&self, listen: &Listen) -> String {
        let (user, query) = match &self.creds {
            Credentials::Psk { file, user } => (
                format!("{}@", uri_escape(user)),
                format!("tls-psk-file={}", uri_escape(&file.to_string_lossy())),
            ),
            _ => (String::new(), String::new()),
        };
        match listen {
            Listen::Unix(sock) => {
                let amp = if query.is_empty() { "" } else { "&" };
                format!(
                    "nbds+unix://{user}/?socket={}{amp}{query}",
                    uri_escape(&sock.to_string_lossy())
                )
            }
            Listen::Tcp { bind, port } => {
                let q = if query.is_empty() { "" } else { "?" };
                format!("nbds://{user}{}:{port}/{q}{query}", uri_host(bind))
            }
        }
    }
}

/// qemu's way to the same export: TLS credentials as an `--object` and the
/// server in `--image-opts` (qemu does not read `nbds+unix://` URIs). It
/// reads a PSK from a directory, as the file `keys.psk`.
pub fn qemu_tls_command(access: &Access, listen: &Listen) -> String {
    let creds = match &access.creds {
        Credentials::Psk { file, user } => {
            let dir = match (file.file_name(), file.parent()) {
                (Some(name), Some(parent)) if name == "keys.psk" => parent.display().to_string(),
                _ => "KEYDIR".to_string(),
            };
            format!("tls-creds-psk,id=tls0,endpoint=client,dir={dir},username={user}")
        }
        _ => "tls-creds-x509,id=tls0,endpoint=client,dir=CADIR".to_string(),
    };
    let server = match listen {
        Listen::Unix(sock) => format!("server.type=unix,server.path={}", sock.display()),
        Listen::Tcp { bind, port } => {
            format!("server.type=inet,server.host={bind},server.port={port}")
        }
    };
    format!("qemu-img info --object {creds} --image-opts driver=nbd,{server},tls-creds=tls0")
}

/// Addresses only this machine can connect to (any local user can, though).
/// Host names other than `localhost` count as reachable from outside: what
/// they resolve to can change.
pub fn is_loopback(bind: &str) -> bool {
    if bind.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = bind
        .strip_prefix('[')
        .and_then(|b| b.strip_suffix(']'))
        .unwrap_or(bind);
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback(),
        Ok(IpAddr::V6(a)) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|m| m.is_loopback()),
        Err(_) => false,
    }
}

/// Refuse to serve plain NBD where other machines can connect: NBD has no
/// password, so anyone who reaches the port can read and overwrite the
/// whole device. TLS with `require`, or an explicit `--insecure`, lifts it.
pub fn check_exposure(listen: &Listen, tls: TlsMode, insecure: bool) -> anyhow::Result<()> {
    let Listen::Tcp { bind, port } = listen else {
        return Ok(());
    };
    if is_loopback(bind) || tls == TlsMode::Require || insecure {
        return Ok(());
    }
    let why = if tls == TlsMode::Allow {
        "with --tls allow a client may still connect without TLS, and NBD has no password"
    } else {
        "NBD without TLS has no password"
    };
    bail!(
        "--bind {bind} would let every machine that reaches port {port} read and overwrite the whole device ({why}). \
         Require TLS: make a key with `dedup tls-psk KEYFILE` and serve with --tls require --tls-psk KEYFILE \
         (clients need a copy of KEYFILE). Or, on a network you trust entirely, add --insecure. \
         To serve this machine only, use the Unix socket (the default) or --bind 127.0.0.1."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_are_told_from_the_rest() {
        for a in [
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "localhost",
            "LocalHost",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_loopback(a), "{a} is loopback");
        }
        for a in [
            "0.0.0.0",
            "::",
            "[::]",
            "10.0.0.1",
            "192.168.1.5",
            "::ffff:10.0.0.1",
            "myhost",
            "localhost.example.com",
            "",
        ] {
            assert!(!is_loopback(a), "{a} is not loopback");
        }
    }

    fn tcp(bind: &str) -> Listen {
        Listen::Tcp {
            bind: bind.into(),
            port: 10809,
        }
    }

    #[test]
    fn a_reachable_address_needs_tls_required_or_insecure() {
        let err = check_exposure(&tcp("0.0.0.0"), TlsMode::Off, false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("--tls require") && msg.contains("--insecure"),
            "{msg}"
        );
        let err = check_exposure(&tcp("0.0.0.0"), TlsMode::Allow, false).unwrap_err();
        assert!(err.to_string().contains("--tls allow"), "{err}");
        check_exposure(&tcp("0.0.0.0"), TlsMode::Require, false).unwrap();
        check_exposure(&tcp("0.0.0.0"), TlsMode::Off, true).unwrap();
        check_exposure(&tcp("127.0.0.1"), TlsMode::Off, false).unwrap();
        check_exposure(&Listen::Unix("/x/nbd.sock".into()), TlsMode::Off, false).unwrap();
    }

    fn psk_access() -> Access {
        Access {
            tls: TlsMode::Require,
            creds: Credentials::Psk {
                file: "/k/my key.psk".into(),
                user: "alice".into(),
            },
            read_only: false,
        }
    }

    #[test]
    fn tls_uris_carry_the_username_and_key_file_as_libnbd_reads_them() {
        let a = psk_access();
        assert_eq!(
            a.tls_uri(&Listen::Unix("/d/nbd.sock".into())),
            "nbds+unix://alice@/?socket=/d/nbd.sock&tls-psk-file=/k/my%20key.psk"
        );
        assert_eq!(
            a.tls_uri(&tcp("::1")),
            "nbds://alice@[::1]:10809/?tls-psk-file=/k/my%20key.psk"
        );
        let certs = Access {
            creds: Credentials::Certificates("/pki".into()),
            ..psk_access()
        };
        assert_eq!(certs.tls_uri(&tcp("10.0.0.1")), "nbds://10.0.0.1:10809/");
        assert_eq!(
            certs.tls_uri(&Listen::Unix("/d/nbd.sock".into())),
            "nbds+unix:///?socket=/d/nbd.sock"
        );
    }

    #[test]
    fn qemu_gets_its_own_credentials_object() {
        let a = psk_access();
        assert_eq!(
            qemu_tls_command(&a, &Listen::Unix("/d/nbd.sock".into())),
            "qemu-img info --object tls-creds-psk,id=tls0,endpoint=client,dir=KEYDIR,username=alice \
             --image-opts driver=nbd,server.type=unix,server.path=/d/nbd.sock,tls-creds=tls0"
        );
        let named = Access {
            creds: Credentials::Psk {
                file: "/etc/dedup/keys.psk".into(),
                user: "alice".into(),
            },
            ..psk_access()
        };
        assert!(qemu_tls_command(&named, &tcp("10.0.0.1")).contains(
            "dir=/etc/dedup,username=alice --image-opts driver=nbd,server.type=inet,server.host=10.0.0.1,server.port=10809,"
        ));
    }

    #[test]
    fn nbdkit_gets_the_tls_mode_its_credentials_and_readonly() {
        let args = |a: &Access| -> Vec<String> {
            a.nbdkit_args()
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            args(&Access {
                read_only: true,
                ..psk_access()
            }),
            ["--tls=require", "--tls-psk=/k/my key.psk", "--readonly"]
        );
        let off = Access {
            tls: TlsMode::Off,
            creds: Credentials::Default,
            read_only: false,
        };
        assert_eq!(args(&off), ["--tls=off"]);
    }

    #[test]
    fn a_key_without_tls_means_require_and_with_tls_off_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let psk = tmp.path().join("k.psk");
        std::fs::write(&psk, format!("bob:{}\n", "ab".repeat(32))).unwrap();
        let a = Access::new(None, Some(psk.clone()), None, false).unwrap();
        assert_eq!(a.tls, TlsMode::Require);
        assert!(matches!(&a.creds, Credentials::Psk { user, .. } if user == "bob"));
        let err = Access::new(Some(TlsMode::Off), Some(psk.clone()), None, false).unwrap_err();
        assert!(err.to_string().contains("--tls off"), "{err}");
        assert_eq!(
            Access::new(None, None, None, false).unwrap().tls,
            TlsMode::Off
        );
        let err = Access::new(None, Some(psk), Some(tmp.path().into()), false).unwrap_err();
        assert!(err.to_string().contains("not both"), "{err}");
    }
}
