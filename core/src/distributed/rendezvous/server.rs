//! Rank 0's side of the rendezvous: a small key-value store and named barriers, one thread per
//! connected rank. It only ever holds a few small values (an NCCL id); tensors never pass here.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, ErrorKind};
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

pub struct Server {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    world: usize,
    token: String,
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
    /// Every accepted connection, to shut down when closing.
    streams: Vec<TcpStream>,
    /// Requests read and not yet answered.
    in_flight: usize,
    closing: bool,
}

impl Server {
    pub fn bind(addrs: &[SocketAddr], world: usize, token: &str) -> io::Result<Server> {
        let listener = TcpListener::bind(addrs)?;
        let addr = listener.local_addr()?;
        // Polled, so that closing never waits for one more connection.
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            world,
            token: token.to_string(),
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
        for stream in state.streams.drain(..) {
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
                state.streams.push(kept);
                drop(state);
                let shared = shared.clone();
                let _ = stream.set_nonblocking(false);
                // A failed spawn drops the stream: that rank sees the connection close.
                let _ = thread::Builder::new()
                    .name("rendezvous-peer".into())
                    .spawn(move || serve(&shared, stream, peer));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            // A connection reset before it was accepted, or out of descriptors for a moment.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Answers one rank's requests until it disconnects (or sends something that is not ours).
fn serve(shared: &Shared, mut stream: TcpStream, peer: SocketAddr) {
    let mut rank = None;
    while let Ok(request) = wire::read_request(&mut stream) {
        shared.lock().in_flight += 1;
        let reply = shared.answer(&request, peer, &mut rank);
        let sent = wire::write_reply(&mut stream, &reply).is_ok();
        shared.lock().in_flight -= 1;
        shared.changed.notify_all();
        if !sent || matches!(reply, Reply::Refused(_)) {
            break;
        }
    }
    if let Some(rank) = rank {
        let mut state = shared.lock();
        state.gone.insert(rank);
        state.joined.remove(&rank);
        shared.changed.notify_all();
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
        let deadline = Instant::now() + Duration::from_millis(request.number);
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
