//! The test harness's own traffic tools, held to what every other test assumes of them:
//! a receiver counts the frames of its own interface and of no other.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use limiter_tests::{
    netns::{ifindex, spawn_in_netns, VethPair},
    scenario::{is_ipv4_to, udp_to_host, HOST_V4},
    traffic::{send, PacketSocket, Receiver, SendPlan},
};

/// Every test file uses the same addresses on a pair of its own, and CI's lanes run files
/// side by side, so a receiver started on one pair while another pair carries a flood to
/// the same address must count nothing of it. It could: the receiving socket took in
/// every interface's frames from `socket(2)` until `bind(2)` narrowed it to one, and in
/// CI `daemon`'s kill-switch test read one frame received where its rule had dropped all
/// 50 sent. Opened up to 5,000 times here (4 s at most) during a flood on the other pair,
/// no socket may hold a frame of another interface; a receiver there must count the flood
/// (the control).
#[test]
fn a_receiving_socket_takes_in_no_frame_of_another_interface() {
    let ours = VethPair::new(1).unwrap();
    let theirs = VethPair::new(1).unwrap();
    let ours_index = ours.host_ifindex().unwrap();
    let flooding = Arc::new(AtomicBool::new(true));
    let frame = udp_to_host(&theirs, 9, 64);
    let peer = theirs.peer.clone();
    let still = Arc::clone(&flooding);
    // Bounded: at most 10 s, or until the sockets below are done.
    let flood = spawn_in_netns(&theirs.ns, move || {
        let socket = PacketSocket::bind(ifindex(&peer)?, false)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sent = 0;
        while still.load(Ordering::Relaxed) && Instant::now() < deadline {
            let plan = SendPlan {
                frames: vec![frame.clone()],
                rate: Some(100_000),
                count: 5_000,
                duration: Duration::from_millis(50),
                cpu: None,
            };
            sent += send(&socket, &plan)?.sent;
        }
        anyhow::Ok(sent)
    })
    .unwrap();

    let control = Receiver::start(theirs.host_ifindex().unwrap(), |f| is_ipv4_to(f, HOST_V4))
        .unwrap()
        .finish(Duration::from_millis(100))
        .unwrap();

    let mut buf = vec![0u8; 2048];
    let mut strays = 0u64;
    let mut ours_seen = 0u64;
    let mut opened = 0;
    let opening = Instant::now();
    // Bounded in time too: with the protocol given at socket(2), each bind waited for an
    // RCU grace period (≈ 25 ms here), and the flood stops after 10 s.
    while opened < 5_000 && opening.elapsed() < Duration::from_secs(4) {
        let socket = PacketSocket::bind(ours_index, true).unwrap();
        opened += 1;
        while let Some(f) = socket.recv(&mut buf, libc::MSG_DONTWAIT).unwrap() {
            if f.ifindex == ours_index {
                ours_seen += 1;
            } else {
                strays += 1;
            }
        }
    }
    flooding.store(false, Ordering::Relaxed);
    eprintln!(
        "{opened} sockets in {:.1} s: {strays} frames of other interfaces, {ours_seen} of their own",
        opening.elapsed().as_secs_f64()
    );
    let sent = flood.join().unwrap().unwrap().unwrap();
    assert!(
        control.matched > 0,
        "the flood did not reach {}: nothing to tell apart ({sent} frames sent)",
        theirs.host
    );
    assert_eq!(
        strays, 0,
        "{opened} sockets bound to {} took in {strays} frames of other interfaces \
         ({sent} frames flooded on {}); of their own: {ours_seen}",
        ours.host, theirs.host
    );
}
