//! The launchers of an MPI job on several machines. MPI's processes are all started by one
//! mpirun, through MPI's remote shell (`plm_rsh_agent`, ssh by default), so node 0's launcher
//! runs it and must first learn where the other machines are: their launchers connect to it at
//! `--master-addr:--master-port`, present the job token, and then wait for the job's end. Each
//! link carries a heartbeat both ways: a machine that falls silent (its link cut, its power
//! gone) ends the job at the collective timeout, named, instead of leaving mpirun waiting on it.
//!
//! The wire is lines of text: `join NODE NPROC COMMAND-DIGEST TOKEN` from node N, then
//! `welcome` or `refused WHY` from node 0; `alive` every second both ways; `note TEXT` and at
//! last `end ok` or `end failed WHY` from node 0.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Context;
use lockstep_core::distributed::rendezvous::DEFAULT_TIMEOUT as MEET_TIMEOUT;
use lockstep_flags::launch::Args;
use sha2::{Digest, Sha256};

/// How often each side says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a join line may take once connected (a stranger that says nothing is dropped).
const HANDSHAKE: Duration = Duration::from_secs(10);

/// What every machine must agree on: the command its ranks run.
pub fn command_digest(command: &[String]) -> String {
    let digest = Sha256::digest(command.join("\0").as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// Node 0's view of the others.
pub struct Cluster {
    others: Vec<Member>,
}

struct Member {
    node: usize,
    address: IpAddr,
    link: Link,
}

impl Cluster {
    /// Node 0: waits (up to the rendezvous timeout) until every other node's launcher has
    /// joined with the job token, the same --nproc-per-node and the same command.
    pub fn gather(args: &Args) -> anyhow::Result<Cluster> {
        let at = format!("{}:{}", args.master_addr, args.master_port);
        let listener = TcpListener::bind(&at).with_context(|| {
            format!(
                "cannot listen on {at} for the other machines' launchers: --master-addr must be this machine's \
                 (node 0's) address, and --master-port a free port"
            )
        })?;
        listener.set_nonblocking(true)?;
        eprintln_whole!(
            "lockstep launch (node 0 of {}): waiting on {at} for the launchers of nodes 1 to {}",
            args.nnodes,
            args.nnodes - 1
        );
        let deadline = Instant::now() + MEET_TIMEOUT;
        let mut others: Vec<Member> = Vec::new();
        while others.len() + 1 < args.nnodes {
            let (stream, from) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let missing: Vec<String> = (1..args.nnodes)
                        .filter(|n| !others.iter().any(|m| m.node == *n))
                        .map(|n| n.to_string())
                        .collect();
                    anyhow::ensure!(
                        Instant::now() < deadline,
                        "node(s) {} did not join within {} s: start `lockstep launch --nnodes {} --node-rank N \
                         --master-addr {} --master-port {} --token …` on each of them",
                        missing.join(", "),
                        MEET_TIMEOUT.as_secs(),
                        args.nnodes,
                        args.master_addr,
                        args.master_port
                    );
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => return Err(e).context("accepting another machine's launcher"),
            };
            // A stranger or a launcher of another job is turned away; the wait goes on.
            match admit(stream, from, args, &others) {
                Ok(member) => {
                    eprintln_whole!("lockstep launch: node {} joined from {}", member.node, member.address);
                    others.push(member);
                }
                Err(why) => eprintln_whole!("lockstep launch: refused a launcher from {from}: {why}"),
            }
        }
        others.sort_by_key(|m| m.node);
        for member in &others {
            member.link.send("welcome");
        }
        Ok(Cluster { others })
    }

    /// mpirun's `--host`: each machine's address with its slots, node 0 (`--master-addr`) first.
    pub fn hosts(&self, args: &Args) -> String {
        std::iter::once(args.master_addr.clone())
            .chain(self.others.iter().map(|m| m.address.to_string()))
            .map(|host| format!("{host}:{}", args.nproc_per_node))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The first node not heard from for `silence`, described; None while all are there.
    pub fn lost(&self, silence: Duration) -> Option<String> {
        self.others.iter().find_map(|m| {
            m.link
                .lost(silence)
                .map(|why| format!("lost node {} ({}): {why}", m.node, m.address))
        })
    }

    /// After a failed run: the node that is gone, if one is. A machine whose link was cut may
    /// fail the run (its ranks' collective timeout) before its silence reaches `silence`, so
    /// here a few missed heartbeats are enough.
    pub fn gone_after_failure(&self) -> Option<String> {
        let missed = 3 * HEARTBEAT;
        thread::sleep(missed);
        self.lost(missed)
    }

    /// Tells every other node's launcher `text` (it prints it).
    pub fn tell(&self, text: &str) {
        for member in &self.others {
            member.link.send(&format!("note {}", one_line(text)));
        }
    }

    /// Tells every other node how the job ended.
    pub fn finish(&self, ended: &anyhow::Result<()>) {
        let line = match ended {
            Ok(()) => "end ok".to_string(),
            Err(e) => format!("end failed {}", one_line(&format!("{e:#}"))),
        };
        for member in &self.others {
            member.link.send(&line);
        }
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

/// Reads node N's join line and checks it against this launcher's flags.
fn admit(stream: TcpStream, from: SocketAddr, args: &Args, others: &[Member]) -> anyhow::Result<Member> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(HANDSHAKE))?;
    let mut line = String::new();
    BufReader::new(stream.try_clone()?).read_line(&mut line)?;
    let refuse = |why: String| {
        let _ = (&stream).write_all(format!("refused {}\n", one_line(&why)).as_bytes());
        anyhow::anyhow!(why)
    };
    let mut fields = line.trim_end_matches('\n').splitn(5, ' ');
    let (Some("join"), Some(node), Some(nproc), Some(digest), Some(token)) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(refuse("not a lockstep launcher's join".into()));
    };
    if Some(token) != args.token.as_deref() {
        return Err(refuse("a different --token: it belongs to another job".into()));
    }
    let node: usize = node.parse().map_err(|_| refuse(format!("bad node rank {node:?}")))?;
    if node == 0 || node >= args.nnodes || others.iter().any(|m| m.node == node) {
        return Err(refuse(format!(
            "--node-rank {node} is not free among 1..{} (each machine its own rank, node 0 is this one)",
            args.nnodes
        )));
    }
    if nproc != args.nproc_per_node.to_string() {
        return Err(refuse(format!(
            "--nproc-per-node {nproc} there, {} on node 0: every machine runs as many",
            args.nproc_per_node
        )));
    }
    if digest != command_digest(&args.command) {
        return Err(refuse(
            "its command after -- differs from node 0's: every machine must run the same one".into(),
        ));
    }
    stream.set_read_timeout(None)?;
    Ok(Member {
        node,
        address: from.ip(),
        link: Link::open(stream)?,
    })
}

/// Node N > 0: joins node 0's launcher and waits for the job's end, which it returns. Its
/// ranks are started by node 0's mpirun, so this launcher starts nothing itself.
pub fn follow(args: &Args, silence: Duration) -> anyhow::Result<()> {
    let at = format!("{}:{}", args.master_addr, args.master_port);
    let stream = connect(&at)?;
    let token = args.token.as_deref().unwrap_or_default();
    (&stream).write_all(
        format!(
            "join {} {} {} {token}\n",
            args.node_rank,
            args.nproc_per_node,
            command_digest(&args.command)
        )
        .as_bytes(),
    )?;
    let link = Link::open(stream.try_clone()?)?;
    eprintln_whole!(
        "lockstep launch (node {} of {}): joined node 0 at {at}; its mpirun starts this machine's {} rank(s) \
         through MPI's remote shell (ssh, or the agent in OMPI_MCA_plm_rsh_agent)",
        args.node_rank,
        args.nnodes,
        args.nproc_per_node
    );
    loop {
        if let Some(line) = link.next_line(HEARTBEAT) {
            match line.split_once(' ').unwrap_or((&line, "")) {
                ("welcome", _) => eprintln_whole!("lockstep launch: every machine has joined; the job starts"),
                ("note", text) => eprintln_whole!("lockstep launch (from node 0): {text}"),
                ("end", "ok") => return Ok(()),
                ("end", why) => anyhow::bail!("the job failed on node 0: {}", why.trim_start_matches("failed ")),
                ("refused", why) => anyhow::bail!("node 0's launcher refused this one: {why}"),
                _ => {}
            }
        }
        if let Some(why) = link.lost(silence) {
            anyhow::bail!("lost node 0 ({at}): {why}; this machine's ranks end at their collective timeout");
        }
    }
}

/// Connects to node 0's launcher, retrying while it is not listening yet.
fn connect(at: &str) -> anyhow::Result<TcpStream> {
    let deadline = Instant::now() + MEET_TIMEOUT;
    loop {
        let addresses: Vec<SocketAddr> = at
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve --master-addr in {at}"))?
            .collect();
        let tried = addresses
            .iter()
            .map(|a| TcpStream::connect_timeout(a, HANDSHAKE))
            .find_map(Result::ok);
        if let Some(stream) = tried {
            return Ok(stream);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "node 0's launcher did not answer at {at} within {} s: start it (`lockstep launch --node-rank 0 …`), and \
             check that this machine reaches that address and port",
            MEET_TIMEOUT.as_secs()
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// One launcher-to-launcher connection: a heartbeat sent every second, lines read into a queue,
/// and the time the other side was last heard from.
struct Link {
    writer: Arc<Mutex<TcpStream>>,
    heard: Arc<Mutex<Instant>>,
    lines: Mutex<std::sync::mpsc::Receiver<String>>,
    closed: Arc<AtomicBool>,
}

impl Link {
    fn open(stream: TcpStream) -> anyhow::Result<Link> {
        // A write to a machine that is gone must not block the heartbeat for long.
        stream.set_write_timeout(Some(HEARTBEAT))?;
        let writer = Arc::new(Mutex::new(stream.try_clone()?));
        let heard = Arc::new(Mutex::new(Instant::now()));
        let closed = Arc::new(AtomicBool::new(false));
        let (sender, lines) = std::sync::mpsc::channel();
        let reader = BufReader::new(stream);
        let (reader_heard, reader_closed) = (heard.clone(), closed.clone());
        thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                *reader_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                if line != "alive" && sender.send(line).is_err() {
                    break;
                }
            }
            reader_closed.store(true, Ordering::SeqCst);
        });
        let (beat_writer, beat_closed) = (writer.clone(), closed.clone());
        thread::spawn(move || {
            while !beat_closed.load(Ordering::SeqCst) {
                let sent = beat_writer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .write_all(b"alive\n");
                // A timed-out write is a slow link, which `lost` judges; a broken one is gone.
                if sent
                    .as_ref()
                    .is_err_and(|e| e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut)
                {
                    break;
                }
                thread::sleep(HEARTBEAT);
            }
        });
        Ok(Link {
            writer,
            heard,
            lines: Mutex::new(lines),
            closed,
        })
    }

    fn send(&self, line: &str) {
        let _ = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(format!("{line}\n").as_bytes());
    }

    /// The next line other than a heartbeat, waiting up to `wait`.
    fn next_line(&self, wait: Duration) -> Option<String> {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recv_timeout(wait)
            .ok()
    }

    fn lost(&self, silence: Duration) -> Option<String> {
        if self.closed.load(Ordering::SeqCst) {
            return Some("its launcher closed the connection (it ended or was killed)".into());
        }
        let quiet = self.heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
        (quiet >= silence).then(|| {
            format!(
                "nothing heard from its launcher for {} s: its link is down or the machine is gone",
                quiet.as_secs()
            )
        })
    }
}

impl Drop for Link {
    /// Ends the heartbeat and the reader with the connection.
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(node: usize, port: u16, token: &str) -> Args {
        Args::parse_from([
            "launch",
            "--nnodes",
            "2",
            "--node-rank",
            &node.to_string(),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port.to_string(),
            "--token",
            token,
            "--",
            "train",
            "--device",
            "cpu",
        ])
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    #[test]
    fn the_other_launcher_joins_learns_the_end_and_node_0_lists_both_hosts() {
        let port = free_port();
        let follower = thread::spawn(move || follow(&args(1, port, "T"), Duration::from_secs(30)));
        let cluster = Cluster::gather(&args(0, port, "T")).unwrap();
        assert_eq!(cluster.hosts(&args(0, port, "T")), "127.0.0.1:2,127.0.0.1:2");
        assert!(cluster.lost(Duration::from_secs(30)).is_none());
        cluster.finish(&Err(anyhow::anyhow!("rank 3 died\nbadly")));
        let ended = follower.join().unwrap().unwrap_err().to_string();
        assert!(ended.contains("rank 3 died badly"), "{ended}");
    }

    #[test]
    fn a_launcher_of_another_job_is_refused_and_told_why() {
        let port = free_port();
        let stranger = thread::spawn(move || follow(&args(1, port, "other"), Duration::from_secs(30)));
        let node0 = thread::spawn(move || Cluster::gather(&args(0, port, "T")));
        let refused = stranger.join().unwrap().unwrap_err().to_string();
        assert!(refused.contains("refused") && refused.contains("--token"), "{refused}");
        // Node 0 still waits for its own node 1.
        let joined = thread::spawn(move || follow(&args(1, port, "T"), Duration::from_secs(30)));
        let cluster = node0.join().unwrap().unwrap();
        cluster.finish(&Ok(()));
        joined.join().unwrap().unwrap();
    }

    #[test]
    fn a_silent_node_is_reported_lost() {
        let port = free_port();
        let listener = thread::spawn(move || Cluster::gather(&args(0, port, "T")));
        // A fake node 1 that joins and then never speaks again.
        let stream = connect(&format!("127.0.0.1:{port}")).unwrap();
        let digest = command_digest(&args(1, port, "T").command);
        (&stream)
            .write_all(format!("join 1 2 {digest} T\n").as_bytes())
            .unwrap();
        let cluster = listener.join().unwrap().unwrap();
        thread::sleep(Duration::from_millis(2500));
        let lost = cluster.lost(Duration::from_secs(2)).expect("node 1 is silent");
        assert!(lost.starts_with("lost node 1 (127.0.0.1): nothing heard"), "{lost}");
        drop(stream);
    }
}
