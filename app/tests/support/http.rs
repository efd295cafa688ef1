//! A tiny HTTP/1.1 server for download tests: listens on 127.0.0.1 only, answers GETs from a fixed
//! table (404 otherwise), one request per connection, and stops when asked, after a bounded
//! number of requests, or after a deadline, whichever comes first.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the server sends for one path.
#[derive(Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The Content-Length to announce; more than `body.len()` simulates a connection that drops.
    pub declared_len: usize,
}

impl Reply {
    pub fn ok(body: Vec<u8>) -> Reply {
        Reply {
            status: 200,
            declared_len: body.len(),
            body,
        }
    }
}

pub struct Server {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<String>>>,
}

const MAX_REQUESTS: usize = 16;
const DEADLINE: Duration = Duration::from_secs(60);

impl Server {
    pub fn start(routes: HashMap<String, Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("the bound address").port();
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(listener, routes, flag));
        Server {
            port,
            stop,
            thread: Some(thread),
        }
    }
    /// The base URL, e.g. `http://127.0.0.1:PORT/mnist/`.
    pub fn url(&self, dir: &str) -> String {
        format!("http://127.0.0.1:{}/{dir}", self.port)
    }
    /// Stops the server and returns the paths it was asked for, in order.
    pub fn stop(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("the server thread"))
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: TcpListener, routes: HashMap<String, Reply>, stop: Arc<AtomicBool>) -> Vec<String> {
    let started = Instant::now();
    let mut seen = Vec::new();
    while seen.len() < MAX_REQUESTS && started.elapsed() < DEADLINE && !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(path) = answer(stream, &routes) {
                    seen.push(path);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break,
        }
    }
    seen
}

/// Reads one request head (bounded) and writes the reply; returns the requested path.
fn answer(mut stream: TcpStream, routes: &HashMap<String, Reply>) -> Option<String> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let path = text.lines().next()?.split_whitespace().nth(1)?.to_string();
    let not_found = Reply {
        status: 404,
        body: b"not found".to_vec(),
        declared_len: 9,
    };
    let reply = routes.get(&path).unwrap_or(&not_found);
    let reason = if reply.status == 200 { "OK" } else { "Not Found" };
    let header = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reply.status, reply.declared_len
    );
    let _ = stream
        .write_all(header.as_bytes())
        .and_then(|_| stream.write_all(&reply.body))
        .and_then(|_| stream.flush());
    Some(path)
}
