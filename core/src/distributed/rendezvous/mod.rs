//! The launcher's rendezvous: how the processes of one job find each other before their
//! collectives exist. Rank 0 serves a small key-value store on MASTER_ADDR:MASTER_PORT; every
//! rank (rank 0 too) connects, checks in with the job token, and can `set`/`get` small values
//! (the NCCL id rank 0 made) and wait at named barriers. Tensors never go through here: the
//! collectives run on NCCL or MPI.
//!
//! Every wait has a deadline, and a wait that runs out names what it waited for: the ranks that
//! never arrived, or rank 0's address when nobody answers there.

mod server;
#[doc(hidden)]
pub mod wire;

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

use server::Server;
use wire::{Op, Reply, Request};

/// The default for every wait (torchrun's rendezvous waits 600 s for a node to join; the
/// ranks of one job normally start within seconds of each other).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// How often a rank retries connecting to rank 0 while it may still be starting.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

/// Extra time a rank gives rank 0 to answer beyond the wait itself, before calling it lost.
const REPLY_MARGIN: Duration = Duration::from_secs(10);

/// Where and as whom a process joins the rendezvous (torchrun's MASTER_ADDR, MASTER_PORT, RANK,
/// WORLD_SIZE), and how long it waits.
#[derive(Clone, Debug)]
pub struct RendezvousConfig {
    /// Rank 0's host (MASTER_ADDR): rank 0 listens there, the others connect there.
    pub host: String,
    /// MASTER_PORT; 0 lets rank 0 pick a free port (read it back with `Rendezvous::port`).
    pub port: u16,
    /// This process's rank, 0 to `world_size - 1`; rank 0 serves the rendezvous (RANK).
    pub rank: usize,
    /// Number of processes in the job, across all nodes (WORLD_SIZE).
    pub world_size: usize,
    /// The same on every rank of a job, so a process of another job is refused.
    pub token: String,
    /// The limit on connecting and on each wait.
    pub timeout: Duration,
}

impl RendezvousConfig {
    /// A config with the default 300-second timeout ([`DEFAULT_TIMEOUT`]).
    pub fn new(host: &str, port: u16, rank: usize, world_size: usize, token: &str) -> RendezvousConfig {
        RendezvousConfig {
            host: host.to_string(),
            port,
            rank,
            world_size,
            token: token.to_string(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Replaces the limit on connecting and on each wait.
    pub fn timeout(mut self, timeout: Duration) -> RendezvousConfig {
        self.timeout = timeout;
        self
    }
}

/// One rank's membership in the rendezvous; on rank 0 it also serves it. Rank 0's server stops
/// when its `Rendezvous` is dropped, so end with a `barrier` that every rank passes after its
/// last `get`.
pub struct Rendezvous {
    config: RendezvousConfig,
    /// `host:port` as the messages name it (the port rank 0 actually bound).
    endpoint: String,
    // Declared before `server`: this rank's own connection closes before its server stops.
    stream: TcpStream,
    server: Option<Server>,
}

impl Rendezvous {
    /// Rank 0 starts the server; every rank connects (retrying until the timeout while rank 0
    /// may still be starting) and checks in. Does not wait for the others: see `barrier`.
    pub fn join(config: RendezvousConfig) -> Result<Rendezvous> {
        let rank = config.rank;
        let fail = |msg: String| Error::Collective {
            op: "rendezvous",
            rank,
            msg,
        };
        if config.world_size == 0 || rank >= config.world_size {
            return Err(fail(format!(
                "rank {rank} is out of range for {} processes: check RANK and WORLD_SIZE",
                config.world_size
            )));
        }
        let named = format!("{}:{}", config.host, config.port);
        let addrs: Vec<SocketAddr> = (config.host.as_str(), config.port)
            .to_socket_addrs()
            .map_err(|e| {
                fail(format!(
                    "cannot resolve the rendezvous address {named} ({e}): set MASTER_ADDR (or --master-addr) to rank \
                     0's host name or IP address"
                ))
            })?
            .collect();
        let (server, targets) = if rank == 0 {
            let handshake = config.timeout.min(server::HANDSHAKE_DEADLINE);
            let log: server::Log = Arc::new(|msg: &str| eprintln!("lockstep rendezvous (rank 0): {msg}"));
            let server = Server::bind(&addrs, config.world_size, &config.token, handshake, log).map_err(|e| {
                fail(format!(
                    "rank 0 cannot listen on {named} for the rendezvous ({e}): if another job uses the port, pick \
                     another MASTER_PORT (--master-port); MASTER_ADDR must be an address of rank 0's machine"
                ))
            })?;
            let bound = server.local_addr();
            (Some(server), vec![bound])
        } else {
            (None, addrs)
        };
        let endpoint = match &server {
            Some(s) => format!("{}:{}", config.host, s.local_addr().port()),
            None => named,
        };
        let stream = connect(&targets, &endpoint, config.timeout).map_err(&fail)?;
        stream
            .set_read_timeout(Some(config.timeout + REPLY_MARGIN))
            .map_err(|e| fail(format!("rendezvous socket: {e}")))?;
        let mut rendezvous = Rendezvous {
            config,
            endpoint,
            stream,
            server,
        };
        rendezvous.call(Op::Hello, "", &[])?;
        Ok(rendezvous)
    }

    /// `host:port` of the rendezvous (with the port rank 0 bound).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The port rank 0 listens on (useful when the configured port was 0).
    pub fn port(&self) -> u16 {
        self.server.as_ref().map_or(self.config.port, |s| s.local_addr().port())
    }

    /// The address rank 0's server listens on (`None` on the other ranks): MASTER_ADDR's, so
    /// loopback unless MASTER_ADDR names another address of this machine.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(Server::local_addr)
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.config.rank
    }

    /// Number of processes in the job.
    pub fn world_size(&self) -> usize {
        self.config.world_size
    }

    /// Stores `value` under `key` for every rank to `get`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.call(Op::Set, key, value).map(drop)
    }

    /// The value under `key`, waiting for some rank to `set` it.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        self.call(Op::Get, key, &[])
    }

    /// Waits until every rank has arrived at the barrier `name` (use each name once).
    pub fn barrier(&mut self, name: &str) -> Result<()> {
        self.call(Op::Barrier, name, &[]).map(drop)
    }

    fn error(&self, msg: String) -> Error {
        Error::Collective {
            op: "rendezvous",
            rank: self.config.rank,
            msg,
        }
    }

    fn call(&mut self, op: Op, key: &str, value: &[u8]) -> Result<Vec<u8>> {
        let request = Request {
            token: self.config.token.clone(),
            op,
            rank: self.config.rank,
            key: key.to_string(),
            value: value.to_vec(),
            number: match op {
                Op::Hello => self.config.world_size as u64,
                _ => self.config.timeout.as_millis() as u64,
            },
        };
        let reply = wire::write_request(&mut self.stream, &request).and_then(|()| wire::read_reply(&mut self.stream));
        let reply = reply.map_err(|e| self.error(self.lost(&e)))?;
        let (endpoint, waited) = (&self.endpoint, seconds(self.config.timeout));
        match reply {
            Reply::Ok(value) => Ok(value),
            Reply::Refused(why) => Err(self.error(format!("refused by the rendezvous at {endpoint}: {why}"))),
            Reply::TimedOut { missing, notes } if op == Op::Barrier => {
                let notes = if notes.is_empty() {
                    String::new()
                } else {
                    format!("; meanwhile {notes}")
                };
                Err(self.error(format!(
                    "rendezvous on {endpoint} timed out after {waited} waiting for rank(s) {missing:?}: did every \
                     process start? check --nproc-per-node/--nnodes (WORLD_SIZE){notes}"
                )))
            }
            Reply::TimedOut { notes, .. } => Err(self.error(format!(
                "rendezvous on {endpoint} timed out after {waited} waiting for `{key}` ({notes}): did rank 0 fail? \
                 see its output"
            ))),
            Reply::Gone(ranks) => Err(self.error(format!(
                "rank(s) {ranks:?} left the rendezvous on {endpoint} before `{key}`: they exited or failed; see their \
                 output"
            ))),
            Reply::Closed => Err(self.error(format!(
                "rank 0 closed the rendezvous on {endpoint} while this rank waited for `{key}`: did rank 0 fail? see \
                 its output"
            ))),
        }
    }

    /// What a broken connection to rank 0 most likely means.
    fn lost(&self, e: &io::Error) -> String {
        let endpoint = &self.endpoint;
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                "rank 0 at {endpoint} stopped answering the rendezvous (no reply within {}): is it hung?",
                seconds(self.config.timeout + REPLY_MARGIN)
            ),
            io::ErrorKind::InvalidData => {
                format!("{endpoint} does not speak Lockstep's rendezvous ({e}): is MASTER_PORT another service's port?")
            }
            _ => format!("lost the connection to the rendezvous at {endpoint} ({e}): did rank 0 exit? see its output"),
        }
    }
}

/// Connects to the first reachable of `targets`, retrying while rank 0 may still be starting.
fn connect(targets: &[SocketAddr], endpoint: &str, timeout: Duration) -> std::result::Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut last = None;
        for target in targets {
            let left = deadline.saturating_duration_since(Instant::now()).max(CONNECT_RETRY);
            match TcpStream::connect_timeout(target, left) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() >= deadline {
            let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            return Err(format!(
                "rendezvous on {endpoint} timed out after {} waiting for rank 0 (last attempt: {why}): did rank 0 \
                 start? MASTER_ADDR/MASTER_PORT (--master-addr/--master-port) must name rank 0's machine and port",
                seconds(timeout)
            ));
        }
        thread::sleep(CONNECT_RETRY);
    }
}

/// `30s`, `0.5s`.
fn seconds(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}
