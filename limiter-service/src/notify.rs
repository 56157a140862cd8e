//! systemd's readiness protocol (`Type=notify`, sd_notify(3)), without libsystemd: one
//! datagram of `KEY=VALUE` lines to the socket named by `$NOTIFY_SOCKET`, a path or, with
//! a leading `@`, a name in the abstract namespace.
//!
//! Both binaries read the variable once, first thing, and remove it from the
//! environment: a child they start must not speak for them. Outside systemd the variable
//! is unset and every message is dropped. A failed send is logged and otherwise ignored:
//! systemd then times the start out, which is the truth (it could not be told).

use std::{
    ffi::OsStr,
    io,
    os::{
        linux::net::SocketAddrExt as _,
        unix::{
            ffi::OsStrExt as _,
            net::{SocketAddr, UnixDatagram},
        },
    },
    path::PathBuf,
};

/// The environment variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Where `$NOTIFY_SOCKET` says messages go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A socket file.
    Path(PathBuf),
    /// A name in the abstract namespace (`@name` in the variable; no leading NUL here).
    Abstract(Vec<u8>),
}

/// Why `$NOTIFY_SOCKET` names nothing this module can send to.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("NOTIFY_SOCKET is empty")]
    Empty,
    #[error(
        "NOTIFY_SOCKET={0:?} is neither an absolute path nor an abstract name (@name); \
         vsock addresses are not supported"
    )]
    Unsupported(String),
}

/// Reads `$NOTIFY_SOCKET`'s value.
pub fn parse_address(value: &OsStr) -> Result<Address, AddressError> {
    let bytes = value.as_bytes();
    match bytes.first() {
        None => Err(AddressError::Empty),
        Some(b'/') => Ok(Address::Path(PathBuf::from(value))),
        Some(b'@') if bytes.len() > 1 => Ok(Address::Abstract(bytes[1..].to_vec())),
        _ => Err(AddressError::Unsupported(
            value.to_string_lossy().into_owned(),
        )),
    }
}

/// One readiness message: `READY=1`, `STATUS=...` and so on, one per line. A value's
/// own newlines would start a new assignment, so they become spaces.
pub fn message(fields: &[(&str, &str)]) -> String {
    let mut text = String::new();
    for (key, value) in fields {
        text.push_str(key);
        text.push('=');
        text.extend(value.chars().map(|c| if c == '\n' { ' ' } else { c }));
        text.push('\n');
    }
    text
}

/// The service manager's ear, if there is one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` and removes it from the environment. Call it before the
    /// process starts a thread (the environment is not thread-safe to change).
    pub fn from_env() -> Notifier {
        let Some(value) = std::env::var_os(NOTIFY_SOCKET) else {
            return Notifier::none();
        };
        // Children (none today) must not inherit the right to speak for this process.
        std::env::remove_var(NOTIFY_SOCKET);
        let connected = parse_address(&value)
            .map_err(|e| e.to_string())
            .and_then(|address| {
                Notifier::connect(&address).map_err(|e| format!("NOTIFY_SOCKET={value:?}: {e}"))
            });
        connected.unwrap_or_else(|e| {
            tracing::warn!("readiness notifications disabled: {e}");
            Notifier::none()
        })
    }

    /// A notifier that drops every message (not started by a service manager).
    pub fn none() -> Notifier {
        Notifier { target: None }
    }

    /// A notifier that sends to `address`.
    pub fn connect(address: &Address) -> io::Result<Notifier> {
        let addr = match address {
            Address::Path(path) => SocketAddr::from_pathname(path)?,
            Address::Abstract(name) => SocketAddr::from_abstract_name(name)?,
        };
        let socket = UnixDatagram::unbound()?;
        Ok(Notifier {
            target: Some((socket, addr)),
        })
    }

    /// Whether a service manager listens.
    pub fn is_active(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `fields` as one datagram; a failure is logged, never fatal.
    pub fn notify(&self, fields: &[(&str, &str)]) {
        let Some((socket, addr)) = &self.target else {
            return;
        };
        let text = message(fields);
        if let Err(e) = socket.send_to_addr(text.as_bytes(), addr) {
            tracing::warn!("telling the service manager {:?}: {e}", text.trim_end());
        }
    }

    /// `READY=1`: the service does what it is for (the daemon: every interface
    /// enforced and the control socket answering).
    pub fn ready(&self, status: &str) {
        self.notify(&[("READY", "1"), ("STATUS", status)]);
    }

    /// `RELOADING=1` (with the `MONOTONIC_USEC` systemd 253 and later want); follow it
    /// with [`Notifier::ready`] when the reload is done, applied or refused.
    pub fn reloading(&self) {
        let now = monotonic_usec().to_string();
        self.notify(&[
            ("RELOADING", "1"),
            ("MONOTONIC_USEC", &now),
            ("STATUS", "reloading the configuration"),
        ]);
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.notify(&[("STOPPING", "1"), ("STATUS", "stopping")]);
    }

    /// `STATUS=...` alone.
    pub fn status(&self, status: &str) {
        self.notify(&[("STATUS", status)]);
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares `MONOTONIC_USEC` with.
fn monotonic_usec() -> u64 {
    limiter_fleet::clock::monotonic_ns() / 1_000
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::{os::unix::net::UnixDatagram, time::Duration};

    use super::*;

    #[test]
    fn addresses_are_paths_or_abstract_names() {
        assert_eq!(
            parse_address(OsStr::new("/run/systemd/notify")),
            Ok(Address::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            parse_address(OsStr::new("@/org/freedesktop/systemd1/notify/42")),
            Ok(Address::Abstract(
                b"/org/freedesktop/systemd1/notify/42".to_vec()
            ))
        );
        assert_eq!(parse_address(OsStr::new("")), Err(AddressError::Empty));
        for bad in ["@", "relative/path", "vsock:2:1234"] {
            assert!(
                matches!(
                    parse_address(OsStr::new(bad)),
                    Err(AddressError::Unsupported(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_value_cannot_smuggle_an_assignment() {
        assert_eq!(
            message(&[("READY", "1"), ("STATUS", "a\nREADY=0")]),
            "READY=1\nSTATUS=a READY=0\n"
        );
    }

    fn received(socket: &UnixDatagram) -> String {
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_to_a_socket_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::connect(&Address::Path(path)).unwrap();
        notifier.ready("serving");
        assert_eq!(received(&listener), "READY=1\nSTATUS=serving\n");
        notifier.reloading();
        let reloading = received(&listener);
        assert!(
            reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
            "{reloading}"
        );
        notifier.stopping();
        assert!(received(&listener).starts_with("STOPPING=1\n"));
    }

    #[test]
    fn sends_to_an_abstract_name() {
        let name = format!("limiter-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let value = format!("@{name}");
        let notifier = Notifier::connect(&parse_address(OsStr::new(&value)).unwrap()).unwrap();
        notifier.ready("serving");
        assert_eq!(received(&listener), "READY=1\nSTATUS=serving\n");
    }

    /// The only test here that touches the environment (tests run on threads).
    #[test]
    fn from_env_takes_the_variable_out_of_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        std::env::set_var(NOTIFY_SOCKET, &path);
        let notifier = Notifier::from_env();
        assert_eq!(
            std::env::var_os(NOTIFY_SOCKET),
            None,
            "a child would inherit it"
        );
        notifier.ready("serving");
        assert_eq!(received(&listener), "READY=1\nSTATUS=serving\n");
    }

    #[test]
    fn without_a_manager_nothing_is_sent() {
        let notifier = Notifier::none();
        assert!(!notifier.is_active());
        notifier.ready("serving");
    }
}
