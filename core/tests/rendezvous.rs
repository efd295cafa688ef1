//! The launcher's rendezvous on loopback, one thread per rank, rank 0 on a free port: values
//! reach every rank; a wrong token, a missing rank, a departed rank or a bad address end in an
//! error that names the problem (on every rank involved), never a hang or a panic.

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lockstep_core::distributed::{Rendezvous, RendezvousConfig};

const TOKEN: &str = "job-42";
const SHORT: Duration = Duration::from_millis(800);

fn config(port: u16, rank: usize, world: usize, token: &str) -> RendezvousConfig {
    RendezvousConfig::new("127.0.0.1", port, rank, world, token).timeout(SHORT)
}

/// Rank 0 on a free port; returns it with that port.
fn rank0(world: usize) -> (Rendezvous, u16) {
    let r = Rendezvous::join(config(0, 0, world, TOKEN)).expect("rank 0 starts the rendezvous");
    let port = r.port();
    assert_ne!(port, 0);
    (r, port)
}

fn message<T>(result: lockstep_core::Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(msg: &str, needles: &[&str]) {
    println!("{msg}");
    for needle in needles {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
}

#[test]
fn every_rank_gets_what_rank_0_set() {
    let world = 4;
    let (mut zero, port) = rank0(world);
    let others: Vec<_> = (1..world)
        .map(|rank| {
            thread::spawn(move || {
                let mut r =
                    Rendezvous::join(config(port, rank, world, TOKEN).timeout(Duration::from_secs(20))).unwrap();
                let id = r.get("nccl-id").unwrap();
                r.set(&format!("hello/{rank}"), &[rank as u8]).unwrap();
                r.barrier("done").unwrap();
                id
            })
        })
        .collect();
    let id: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
    zero.set("nccl-id", &id).unwrap();
    for rank in 1..world {
        assert_eq!(zero.get(&format!("hello/{rank}")).unwrap(), vec![rank as u8]);
    }
    // A barrier before rank 0 drops its server, so every rank has read what it needed.
    zero.barrier("done").unwrap();
    for t in others {
        assert_eq!(t.join().unwrap(), id);
    }
}

#[test]
fn a_wrong_token_is_refused_with_a_clear_message_on_both_sides() {
    let (mut zero, port) = rank0(2);
    let intruder = thread::spawn(move || message(Rendezvous::join(config(port, 1, 2, "another-job"))));
    let on_rank0 = message(zero.barrier("start"));
    let on_rank1 = intruder.join().unwrap();
    assert_mentions(
        &on_rank1,
        &[
            "refused",
            &format!("127.0.0.1:{port}"),
            "token differs",
            "LOCKSTEP_RDZV_TOKEN",
        ],
    );
    assert_mentions(
        &on_rank0,
        &["timed out", "rank(s) [1]", "another job's token", "LOCKSTEP_RDZV_TOKEN"],
    );
}

#[test]
fn a_missing_rank_times_out_naming_it_on_every_waiting_rank() {
    let world = 3;
    let (mut zero, port) = rank0(world);
    let two = thread::spawn(move || {
        let mut r = Rendezvous::join(config(port, 2, world, TOKEN)).unwrap();
        message(r.barrier("start"))
    });
    let start = Instant::now();
    let on_rank0 = message(zero.barrier("start"));
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    for msg in [on_rank0, two.join().unwrap()] {
        assert_mentions(
            &msg,
            &[
                &format!("rendezvous on 127.0.0.1:{port} timed out after 0.8s"),
                "waiting for rank(s) [1]",
                "did every process start?",
                "WORLD_SIZE",
            ],
        );
    }
}

#[test]
fn a_missing_rank_0_times_out_naming_it() {
    // A port nobody listens on: bound, read back, released.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let msg = message(Rendezvous::join(config(port, 1, 2, TOKEN)));
    assert_mentions(
        &msg,
        &[
            &format!("127.0.0.1:{port}"),
            "timed out",
            "waiting for rank 0",
            "MASTER_ADDR",
        ],
    );
}

#[test]
fn a_rank_that_leaves_is_named_without_waiting_for_the_timeout() {
    let (mut zero, port) = rank0(2);
    let rendezvous = Rendezvous::join(config(port, 1, 2, TOKEN).timeout(Duration::from_secs(60))).unwrap();
    drop(rendezvous);
    let start = Instant::now();
    let msg = message(zero.barrier("start"));
    assert_mentions(&msg, &["rank(s) [1] left the rendezvous", "exited or failed"]);
    assert!(start.elapsed() < SHORT, "took {:?}", start.elapsed());
}

#[test]
fn a_rank_waiting_for_a_value_hears_when_rank_0_goes() {
    let (zero, port) = rank0(2);
    let (joined, wait) = mpsc::channel();
    let one = thread::spawn(move || {
        let mut r = Rendezvous::join(config(port, 1, 2, TOKEN).timeout(Duration::from_secs(60))).unwrap();
        joined.send(()).unwrap();
        message(r.get("nccl-id"))
    });
    wait.recv().unwrap();
    thread::sleep(Duration::from_millis(100));
    drop(zero);
    assert_mentions(&one.join().unwrap(), &["rank 0 closed the rendezvous", "nccl-id"]);
}

#[test]
fn disagreeing_world_sizes_and_duplicate_ranks_are_refused() {
    let (_zero, port) = rank0(2);
    let msg = message(Rendezvous::join(config(port, 1, 3, TOKEN)));
    assert_mentions(
        &msg,
        &["rank 1 expects 3 processes", "rank 0 expects 2", "--nproc-per-node"],
    );
    let _one = Rendezvous::join(config(port, 1, 2, TOKEN)).unwrap();
    let msg = message(Rendezvous::join(config(port, 1, 2, TOKEN)));
    assert_mentions(&msg, &["two processes have RANK=1"]);
    let msg = message(Rendezvous::join(config(port, 5, 2, TOKEN)));
    assert_mentions(&msg, &["rank 5 is out of range"]);
}

#[test]
fn bad_addresses_are_errors() {
    let msg = message(Rendezvous::join(
        RendezvousConfig::new("no such host", 29500, 1, 2, TOKEN).timeout(SHORT),
    ));
    assert_mentions(&msg, &["cannot resolve", "no such host:29500", "MASTER_ADDR"]);
    // An address of no interface here (TEST-NET-1): rank 0 cannot listen on it.
    let msg = message(Rendezvous::join(
        RendezvousConfig::new("192.0.2.1", 0, 0, 2, TOKEN).timeout(SHORT),
    ));
    assert_mentions(&msg, &["rank 0 cannot listen on 192.0.2.1:0", "MASTER_ADDR"]);
    // A port already taken.
    let (_zero, port) = rank0(2);
    let msg = message(Rendezvous::join(config(port, 0, 2, TOKEN)));
    assert_mentions(&msg, &["cannot listen", "MASTER_PORT"]);
}

#[test]
fn a_port_that_speaks_another_protocol_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = s.read(&mut buf);
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let msg = message(Rendezvous::join(config(port, 1, 2, TOKEN)));
    assert_mentions(&msg, &["does not speak Lockstep's rendezvous", "MASTER_PORT"]);
    server.join().unwrap();
}

/// This machine's address on its default route, when it has one (a UDP connect sends nothing).
fn non_loopback_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[test]
fn rank_0_listens_on_loopback_when_master_addr_is_loopback() {
    for host in ["127.0.0.1", "localhost"] {
        let zero = Rendezvous::join(RendezvousConfig::new(host, 0, 0, 2, TOKEN).timeout(SHORT)).unwrap();
        let addr = zero.listen_addr().expect("rank 0 serves the rendezvous");
        assert!(addr.ip().is_loopback(), "{host}: listening on {addr}");
        match non_loopback_address() {
            Some(ip) => {
                let outside = std::net::SocketAddr::new(ip, addr.port());
                let reached = std::net::TcpStream::connect_timeout(&outside, SHORT);
                assert!(reached.is_err(), "rank 0 on {host} is reachable from {outside}");
            }
            None => eprintln!("NOTE: no non-loopback address here; only the bound address was checked"),
        }
    }
}

#[test]
fn a_silent_stranger_does_not_stall_the_job() {
    let (mut zero, port) = rank0(2);
    let silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let one = thread::spawn(move || {
        let mut r = Rendezvous::join(config(port, 1, 2, TOKEN)).unwrap();
        r.barrier("start")
    });
    zero.barrier("start").unwrap();
    one.join().unwrap().unwrap();
    // Rank 0 hangs up on it at the handshake deadline (here the 0.8 s timeout).
    let mut silent = silent;
    silent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    assert!(
        std::io::Read::read_to_end(&mut silent, &mut rest).is_ok(),
        "the silent connection is still open"
    );
}

#[test]
fn a_gigabyte_sender_is_cut_off_after_a_few_kilobytes() {
    let (mut zero, port) = rank0(2);
    let flood = thread::spawn(move || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The magic word, then a token that claims to be a gigabyte long, then the gigabyte.
        let mut sent = 0usize;
        let mut frame = b"LKRV".to_vec();
        frame.extend_from_slice(&(1u64 << 30).to_le_bytes());
        let chunk = vec![b'x'; 1 << 20];
        let mut result = std::io::Write::write_all(&mut stream, &frame);
        while result.is_ok() && sent < 1 << 30 {
            result = std::io::Write::write_all(&mut stream, &chunk);
            sent += chunk.len();
        }
        (result.is_err(), sent)
    });
    let one = thread::spawn(move || {
        let mut r = Rendezvous::join(config(port, 1, 2, TOKEN)).unwrap();
        r.barrier("start")
    });
    zero.barrier("start").unwrap();
    one.join().unwrap().unwrap();
    let (cut_off, sent) = flood.join().unwrap();
    assert!(cut_off, "rank 0 read the whole gigabyte");
    // What the kernel's socket buffers took before rank 0 hung up: megabytes, not the gigabyte.
    assert!(sent < 64 << 20, "sent {} MiB before being cut off", sent >> 20);
}
