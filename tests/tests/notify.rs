//! systemd's readiness protocol (`Type=notify`) as the real binaries speak it: the test
//! binds the datagram socket systemd would and passes it as `$NOTIFY_SOCKET`. `READY=1`
//! means enforcement is in place: when it arrives the program is on the interface and
//! the control socket answers. A daemon that fails to start never says it.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod common;

use std::{
    net::TcpStream,
    os::{linux::net::SocketAddrExt as _, unix::net::UnixDatagram},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{pki::Pki, Daemon, Lab, LIMITER};
use limiter_tests::binaries::LIMITER_ALLOCATOR;

/// The next datagram within `within`, or `None`.
fn next_message(socket: &UnixDatagram, within: Duration) -> Option<String> {
    socket.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    match socket.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("reading the notify socket: {e}"),
    }
}

/// Messages until one holds `key`, within `within`.
fn wait_for(socket: &UnixDatagram, key: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no {key} within {within:?}");
        if let Some(m) = next_message(socket, left) {
            if m.lines().any(|l| l == key) {
                return m;
            }
        }
    }
}

#[test]
fn ready_arrives_once_enforcing_and_serving_then_reloading_and_stopping() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n");
    let notify_path = lab.dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let child = Command::new(LIMITER)
        .args(["run", "--config"])
        .arg(&lab.config)
        .env("NOTIFY_SOCKET", &notify_path)
        .spawn()
        .expect("starting limiter run");
    let daemon = Daemon(child);
    let ready = wait_for(&notify, "READY=1", Duration::from_secs(30));
    // At the moment READY=1 arrives: the program is on the interface and the control
    // socket answers.
    let attached = lab.attached_program();
    let status = lab.limiter(&["status", "--json"]);
    assert!(
        attached.is_some(),
        "READY=1 before the program was attached"
    );
    assert!(
        status.status.success(),
        "READY=1 before the control socket answered: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        ready.contains("STATUS=enforcing 1 rules on") && ready.contains(&lab.pair.host),
        "{ready}"
    );
    // A reload (here one the checker refuses) is bracketed by RELOADING=1 and READY=1.
    lab.write_config("[[rules]]\nname = \"bad\"\ndst = \"198.18.0.3/32\"\nrate = 5\n");
    let out = lab.limiter(&["reload"]);
    assert!(!out.status.success(), "a bad config was reloaded");
    let reloading = wait_for(&notify, "RELOADING=1", Duration::from_secs(5));
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    wait_for(&notify, "READY=1", Duration::from_secs(5));

    daemon.signal(libc::SIGTERM);
    wait_for(&notify, "STOPPING=1", Duration::from_secs(10));
    daemon.stop();
}

#[test]
fn a_daemon_that_fails_to_start_never_says_ready() {
    let lab =
        Lab::new("[[rules]]\nname = \"web\"\ndst = \"198.18.0.2/32\"\nrate = 100\nburst = 10\n");
    // The abstract form (`@name`), as systemd may pass it.
    let name = format!("limiter-notify-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let notify = UnixDatagram::bind_addr(&addr).unwrap();
    let out = Command::new(LIMITER)
        .args(["run", "--iface", "limiter-none0", "--config"])
        .arg(&lab.config)
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .stderr(Stdio::piped())
        .output()
        .expect("running limiter run");
    assert!(
        !out.status.success(),
        "started on an interface that does not exist"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("limiter-none0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    notify.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut said = Vec::new();
    while let Ok(n) = notify.recv(&mut buf) {
        said.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    assert!(
        !said.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "a daemon that failed said READY=1: {said:?}"
    );
    assert!(lab.attached_program().is_none());
}

#[test]
fn the_allocator_is_ready_once_it_listens() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let port = common::free_port();
    let server = pki.pair("allocator");
    let config = dir.path().join("allocator.toml");
    let socket = dir.path().join("run/allocator.sock");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nmetrics = \"\"\ncontrol_socket = \"{}\"\n\
             [tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
             [[quotas]]\nrule = \"web\"\nrate = 1000\nburst = 100\n",
            socket.display(),
            pki.ca().display(),
            server.cert.display(),
            server.key.display()
        ),
    )
    .unwrap();
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let child = Command::new(LIMITER_ALLOCATOR.path())
        .args(["run", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify_path)
        .spawn()
        .expect("starting limiter-allocator");
    let allocator = Daemon(child);
    let ready = wait_for(&notify, "READY=1", Duration::from_secs(20));
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_ok(),
        "READY=1 before the gRPC port listened"
    );
    let list = Command::new(LIMITER_ALLOCATOR.path())
        .args(["quota", "list", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        list.status.success(),
        "READY=1 before the control socket answered: {}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(ready.contains(&format!("127.0.0.1:{port}")), "{ready}");
    allocator.signal(libc::SIGTERM);
    wait_for(&notify, "STOPPING=1", Duration::from_secs(10));
    allocator.stop();
}
