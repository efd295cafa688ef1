//! Rank 0's side of the rendezvous: a small key-value store and named barriers, one thread per
//! connected rank. It only ever holds a few small values (an NCCL id); tensors never pass here.
//!
//! A connection is a stranger until its first request, a `Hello` with the job token, is
//! answered: that request must arrive whole within the handshake deadline, at most
//! [`MAX_STRANGERS`] strangers are served at once, and whatever a stranger does wrong is
//! refused, logged, and ends its connection.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::wire::{self, Op, Reply, Request};

/// How long closing waits for replies already decided to reach their ranks.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// How often the accepting thread looks whether the server is closing.
const ACCEPT_POLL: Duration = Duration::from_millis(20);
/// The longest a connection may take to send its first request whole.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// The most connections served at once that have not checked in yet.
pub const MAX_STRANGERS: usize = 64;

/// Where the server reports what it refused (rank 0's stderr, or a test's buffer).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    world: usize,
    token: String,
    handshake: Duration,
    log: Log,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    joined: BTreeSet<usize>,
    /// Ranks whose connection closed.
    gone: BTreeSet<usize>,
    values: HashMap<String, Vec<u8>>,
    barriers: HashMap<String, BTreeSet<usize>>,
    /// What was refused, for the timeout message of the ranks that keep waiting.
    refused: Vec<String>,
    /// Every open connection by its number, to shut down when closing.
    streams: HashMap<u64, TcpStream>,
    /// The number of the next connection.
    next_stream: u64,
    /// Requests read and not yet answered.
    in_flight: usize,
    /// Connections that have not checked in yet.
    strangers: usize,
    closing: bool,
}

impl Server {
    /// Listens on the first of `addrs` that binds; a connection must send its first request
    /// within `handshake`.
    pub fn bind(addrs: &[SocketAddr], world: usize, token: &str, handshake: Duration, log: Log) -> io::Result<Server> {
        let listener = TcpListener::bind(addrs)?;
        let addr = listener.local_addr()?;
        // Polled, so that closing never waits for one more connection.
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            world,
            token: token.to_string(),
            handshake,
            log,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (shared, stop) = (shared.clone(), stop.clone());
            thread::Builder::new()
                .name("rendezvous".into())
                .spawn(move || accept(&listener, &shared, &stop))?
        };
        Ok(Server {
            shared,
            addr,
            stop,
            acceptor: Some(acceptor),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let mut state = self.shared.lock();
        state.closing = true;
        self.shared.changed.notify_all();
        // Waiters whose condition holds answer Ok, the others Closed; let those replies go out.
        let deadline = Instant::now() + CLOSE_GRACE;
        while state.in_flight > 0 && Instant::now() < deadline {
            state = self.shared.wait_until(state, deadline);
        }
        for (_, stream) in state.streams.drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        drop(state);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let Ok(kept) = stream.try_clone() else { continue };
                let mut state = shared.lock();
                if state.closing {
                    continue;
                }
                if state.strangers >= MAX_STRANGERS {
                    drop(state);
                    (shared.log)(&format!(
                        "closed a connection from {peer}: {MAX_STRANGERS} connections are already waiting to check in"
                    ));
                    continue;
                }
                state.strangers += 1;
                let id = state.next_stream;
                state.next_stream += 1;
                state.streams.insert(id, kept);
                drop(state);
                let shared = shared.clone();
                let _ = stream.set_nonblocking(false);
                // A failed spawn drops the stream: that rank sees the connection close.
                let _ = thread::Builder::new().name("rendezvous-peer".into()).spawn(move || {
                    serve(&shared, &stream, peer);
                    // Its clone in `streams` would keep the connection open.
                    shared.lock().streams.remove(&id);
                    let _ = stream.shutdown(Shutdown::Both);
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            // A connection reset before it was accepted, or out of descriptors for a moment.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Answers one rank's requests until it disconnects (or sends something that is not ours).
fn serve(shared: &Shared, mut stream: &TcpStream, peer: SocketAddr) {
    let mut rank = None;
    let first = wire::read_request(&mut Deadline::new(stream, shared.handshake));
    shared.lock().strangers -= 1;
    let mut next = match first {
        Ok(request) => Ok(request),
        Err(e) => {
            let why = match e.kind() {
                ErrorKind::UnexpectedEof => "it closed before sending a whole request".to_string(),
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    format!("it sent no whole request within {}s", shared.handshake.as_secs_f64())
                }
                _ => e.to_string(),
            };
            (shared.log)(&format!("closed a connection from {peer}: {why}"));
            return;
        }
    };
    while let Ok(request) = next {
        shared.lock().in_flight += 1;
        let reply = shared.answer(&request, peer, &mut rank);
        let sent = wire::write_reply(&mut stream, &reply).is_ok();
        shared.lock().in_flight -= 1;
        shared.changed.notify_all();
        if let Reply::Refused(why) = &reply {
            (shared.log)(&format!(
                "refused a connection from {peer} claiming rank {}: {why}",
                request.rank
            ));
            break;
        }
        if !sent {
            break;
        }
        next = wire::read_request(&mut stream);
    }
    if let Some(rank) = rank {
        let mut state = shared.lock();
        state.gone.insert(rank);
        state.joined.remove(&rank);
        shared.changed.notify_all();
    }
}

/// Reads from a stream until a deadline for the whole read, however the bytes trickle in.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl<'a> Deadline<'a> {
    fn new(stream: &'a TcpStream, limit: Duration) -> Deadline<'a> {
        Deadline {
            stream,
            until: Instant::now() + limit,
        }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let read = self.stream.read(buf);
        // A rank that has checked in may stay quiet for the whole run.
        self.stream.set_read_timeout(None)?;
        read
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_until<'a>(&self, state: MutexGuard<'a, State>, deadline: Instant) -> MutexGuard<'a, State> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.changed
            .wait_timeout(state, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    fn answer(&self, request: &Request, peer: SocketAddr, rank: &mut Option<usize>) -> Reply {
        if request.token != self.token {
            self.lock().refused.push(format!(
                "a process from {peer} claiming rank {} presented another job's token (check LOCKSTEP_RDZV_TOKEN)",
                request.rank
            ));
            return Reply::Refused(
                "this process's job token differs from rank 0's, so the two belong to different jobs: check \
                 LOCKSTEP_RDZV_TOKEN (give every node's `lockstep launch` the same --token) and that \
                 MASTER_ADDR/MASTER_PORT name this job's rank 0"
                    .into(),
            );
        }
        // A wait too long to represent is as good as forever (a year).
        let wait = Duration::from_millis(request.number).min(Duration::from_secs(365 * 24 * 3600));
        let deadline = Instant::now() + wait;
        match (request.op, *rank) {
            (Op::Hello, _) => self.hello(request, peer, rank),
            (_, None) => Reply::Refused("a request before checking in (not a Lockstep rank?)".into()),
            (Op::Set, Some(_)) => {
                self.lock().values.insert(request.key.clone(), request.value.clone());
                self.changed.notify_all();
                Reply::Ok(Vec::new())
            }
            (Op::Get, Some(_)) => self.get(&request.key, deadline),
            (Op::Barrier, Some(rank)) => self.barrier(&request.key, rank, deadline),
        }
    }

    fn hello(&self, request: &Request, peer: SocketAddr, rank: &mut Option<usize>) -> Reply {
        let mut state = self.lock();
        let claimed = request.rank;
        let refusal = if request.number as usize != self.world {
            Some(format!(
                "rank {claimed} expects {} processes (WORLD_SIZE) but rank 0 expects {}: give every node the \
                 same --nnodes and --nproc-per-node",
                request.number, self.world
            ))
        } else if claimed >= self.world {
            Some(format!("rank {claimed} is out of range for {} processes", self.world))
        } else if state.joined.contains(&claimed) {
            Some(format!(
                "rank {claimed} has already checked in: two processes have RANK={claimed} (check --node-rank \
                 on every node)"
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            state.refused.push(format!("a process from {peer} was refused: {why}"));
            return Reply::Refused(why);
        }
        state.joined.insert(claimed);
        state.gone.remove(&claimed);
        *rank = Some(claimed);
        self.changed.notify_all();
        Reply::Ok(Vec::new())
    }

    fn get(&self, key: &str, deadline: Instant) -> Reply {
        let mut state = self.lock();
        loop {
            if let Some(value) = state.values.get(key) {
                return Reply::Ok(value.clone());
            }
            if state.closing {
                return Reply::Closed;
            }
            if Instant::now() >= deadline {
                return Reply::TimedOut {
                    missing: Vec::new(),
                    notes: format!("nobody set `{key}`"),
                };
            }
            state = self.wait_until(state, deadline);
        }
    }

    fn barrier(&self, name: &str, rank: usize, deadline: Instant) -> Reply {
        let mut state = self.lock();
        state.barriers.entry(name.to_string()).or_default().insert(rank);
        self.changed.notify_all();
        loop {
            let arrived = &state.barriers[name];
            let missing: Vec<usize> = (0..self.world).filter(|r| !arrived.contains(r)).collect();
            if missing.is_empty() {
                return Reply::Ok(Vec::new());
            }
            let gone: Vec<usize> = missing.iter().copied().filter(|r| state.gone.contains(r)).collect();
            if !gone.is_empty() {
                return Reply::Gone(gone);
            }
            if state.closing {
                return Reply::Closed;
            }
            if Instant::now() >= deadline {
                return Reply::TimedOut {
                    missing,
                    notes: state.refused.join("; "),
                };
            }
            state = self.wait_until(state, deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A server for two ranks whose log lands in the returned buffer.
    fn logged_server(handshake: Duration) -> (Server, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let log: Log = {
            let lines = lines.clone();
            Arc::new(move |msg: &str| lines.lock().unwrap().push(msg.to_string()))
        };
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        (Server::bind(&[addr], 2, "right", handshake, log).unwrap(), lines)
    }

    /// Waits for the server to close `stream` (reading until EOF or a reset).
    fn closed_within(mut stream: TcpStream, limit: Duration) -> bool {
        stream.set_read_timeout(Some(limit)).unwrap();
        match stream.read_to_end(&mut Vec::new()) {
            Ok(_) => true,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        }
    }

    fn logged(lines: &Mutex<Vec<String>>, needle: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if lines.lock().unwrap().iter().any(|l| l.contains(needle)) {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("`{needle}` never logged; the log: {:?}", lines.lock().unwrap());
    }

    #[test]
    fn a_wrong_token_is_refused_and_logged_with_the_peer() {
        let (server, lines) = logged_server(Duration::from_secs(5));
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        let hello = Request {
            token: "wrong".into(),
            op: Op::Hello,
            rank: 1,
            key: String::new(),
            value: Vec::new(),
            number: 2,
        };
        wire::write_request(&mut stream, &hello).unwrap();
        assert!(matches!(wire::read_reply(&mut stream).unwrap(), Reply::Refused(_)));
        assert!(logged(&lines, "refused a connection from 127.0.0.1"));
        assert!(logged(&lines, "claiming rank 1"));
        assert!(closed_within(stream, Duration::from_secs(5)));
    }

    #[test]
    fn a_silent_connection_is_closed_and_logged_at_the_handshake_deadline() {
        let (server, lines) = logged_server(Duration::from_millis(300));
        let started = Instant::now();
        let stream = TcpStream::connect(server.local_addr()).unwrap();
        assert!(closed_within(stream, Duration::from_secs(5)));
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        assert!(logged(&lines, "sent no whole request within 0.3s"));
    }

    #[test]
    fn a_trickling_connection_cannot_outlast_the_handshake_deadline() {
        let (server, lines) = logged_server(Duration::from_millis(500));
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        let started = Instant::now();
        // One byte of the magic word every 100 ms: each read is quick, the whole is not.
        for byte in b"LKRV\x05\0\0\0\0\0\0\0righ".iter().cycle().take(40) {
            if stream.write_all(&[*byte]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        assert!(logged(&lines, "sent no whole request within 0.5s"));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn foreign_bytes_are_logged_and_strangers_are_capped() {
        let (server, lines) = logged_server(Duration::from_secs(5));
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(closed_within(stream, Duration::from_secs(5)));
        assert!(logged(&lines, "not a Lockstep rendezvous peer"));
        // Strangers that stay silent hold their slot until the deadline; one more is turned away.
        let silent: Vec<TcpStream> = (0..MAX_STRANGERS)
            .map(|_| TcpStream::connect(server.local_addr()).unwrap())
            .collect();
        let extra = TcpStream::connect(server.local_addr()).unwrap();
        assert!(logged(&lines, "connections are already waiting to check in"));
        assert!(closed_within(extra, Duration::from_secs(5)));
        drop(silent);
    }

    #[test]
    fn a_wait_of_u64_max_milliseconds_is_a_long_wait_not_a_panic() {
        let (server, _lines) = logged_server(Duration::from_secs(5));
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        let mut request = Request {
            token: "right".into(),
            op: Op::Hello,
            rank: 1,
            key: String::new(),
            value: Vec::new(),
            number: 2,
        };
        wire::write_request(&mut stream, &request).unwrap();
        assert_eq!(wire::read_reply(&mut stream).unwrap(), Reply::Ok(Vec::new()));
        (request.op, request.key, request.value, request.number) = (Op::Set, "k".into(), vec![7], 0);
        wire::write_request(&mut stream, &request).unwrap();
        assert_eq!(wire::read_reply(&mut stream).unwrap(), Reply::Ok(Vec::new()));
        (request.op, request.number) = (Op::Get, u64::MAX);
        wire::write_request(&mut stream, &request).unwrap();
        assert_eq!(wire::read_reply(&mut stream).unwrap(), Reply::Ok(vec![7]));
    }
}
