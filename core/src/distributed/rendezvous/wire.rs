//! The rendezvous protocol on the wire: one request, one reply, over a TCP connection that each
//! rank keeps open. Every request carries the job token; every frame starts with a magic word,
//! so a connection to some other service fails with a clear error instead of a garbled one.
//!
//! A request is `LKRV`, the token, the operation (one byte), the rank (u64), the key, the value
//! and a number (u64); a reply is `LKRV`, a code (one byte), a list of ranks and a byte field.
//! Integers are little-endian; a byte field is its length (u64) and its bytes. Every field has a
//! small upper bound, checked before anything is allocated, so a peer that is not a rank can
//! make a reader allocate at most a few kilobytes before it is refused (the token comes first).
//! The four operations only store, read and wait on small values in memory: nothing a peer
//! sends can make a rank open a file or run anything.

use std::io::{self, Read, Write};

const MAGIC: [u8; 4] = *b"LKRV";

/// The longest job token accepted (the launcher's are 32 characters).
pub const MAX_TOKEN: usize = 1 << 10;
/// The longest key accepted (keys are names such as `nccl-id/0`).
pub const MAX_KEY: usize = 1 << 10;
/// The largest value or message accepted (an NCCL id is 128 bytes).
pub const MAX_VALUE: usize = 64 << 10;
/// The most ranks one reply names.
pub const MAX_RANKS: usize = 1 << 16;

/// What a rank asks rank 0's server to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Checks in: `number` is the world size this rank expects.
    Hello = 1,
    /// Stores `value` under `key`.
    Set = 2,
    /// Waits up to `number` milliseconds for `key`.
    Get = 3,
    /// Arrives at barrier `key`, then waits up to `number` milliseconds for every rank.
    Barrier = 4,
}

/// One request of a rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The job token, checked before anything else.
    pub token: String,
    /// What is asked.
    pub op: Op,
    /// The sender's rank.
    pub rank: usize,
    /// The key of a `Set` or `Get`, or the barrier's name.
    pub key: String,
    /// The value of a `Set`.
    pub value: Vec<u8>,
    /// The world size of a `Hello`; the wait in milliseconds of a `Get` or `Barrier`.
    pub number: u64,
}

/// Rank 0's answer to one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Done; the value for a `Get`.
    Ok(Vec<u8>),
    /// Not allowed (wrong token, wrong world size, a rank taken twice): says why.
    Refused(String),
    /// Waited the whole timeout; the ranks still missing and what the server noticed meanwhile.
    TimedOut {
        /// Ranks that never arrived.
        missing: Vec<usize>,
        /// What was refused meanwhile.
        notes: String,
    },
    /// Ranks the wait needs closed their connection (exited or failed).
    Gone(Vec<usize>),
    /// Rank 0 is shutting the rendezvous down.
    Closed,
}

/// Writes one request as one frame.
pub fn write_request(w: &mut impl Write, r: &Request) -> io::Result<()> {
    let mut frame = MAGIC.to_vec();
    put_bytes(&mut frame, r.token.as_bytes());
    frame.push(r.op as u8);
    frame.extend_from_slice(&(r.rank as u64).to_le_bytes());
    put_bytes(&mut frame, r.key.as_bytes());
    put_bytes(&mut frame, &r.value);
    frame.extend_from_slice(&r.number.to_le_bytes());
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one request; `InvalidData` for anything that is not one (or exceeds a bound).
pub fn read_request(r: &mut impl Read) -> io::Result<Request> {
    expect_magic(r)?;
    let token = get_string(r, MAX_TOKEN)?;
    let op = match get_u8(r)? {
        1 => Op::Hello,
        2 => Op::Set,
        3 => Op::Get,
        4 => Op::Barrier,
        other => return Err(invalid(format!("unknown operation {other}"))),
    };
    let rank = usize::try_from(get_u64(r)?).map_err(|_| invalid("rank out of range".into()))?;
    Ok(Request {
        token,
        op,
        rank,
        key: get_string(r, MAX_KEY)?,
        value: get_bytes(r, MAX_VALUE)?,
        number: get_u64(r)?,
    })
}

/// Writes one reply as one frame.
pub fn write_reply(w: &mut impl Write, reply: &Reply) -> io::Result<()> {
    let (code, ranks, bytes): (u8, &[usize], &[u8]) = match reply {
        Reply::Ok(value) => (0, &[], value),
        Reply::Refused(why) => (1, &[], why.as_bytes()),
        Reply::TimedOut { missing, notes } => (2, missing, notes.as_bytes()),
        Reply::Gone(ranks) => (3, ranks, &[]),
        Reply::Closed => (4, &[], &[]),
    };
    let mut frame = MAGIC.to_vec();
    frame.push(code);
    frame.extend_from_slice(&(ranks.len() as u64).to_le_bytes());
    for &rank in ranks {
        frame.extend_from_slice(&(rank as u64).to_le_bytes());
    }
    put_bytes(&mut frame, bytes);
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one reply; `InvalidData` for anything that is not one (or exceeds a bound).
pub fn read_reply(r: &mut impl Read) -> io::Result<Reply> {
    expect_magic(r)?;
    let code = get_u8(r)?;
    let count = get_u64(r)?;
    if count > MAX_RANKS as u64 {
        return Err(invalid(format!("{count} ranks in one reply")));
    }
    let ranks = (0..count)
        .map(|_| get_u64(r).map(|v| v as usize))
        .collect::<io::Result<Vec<_>>>()?;
    let bytes = get_bytes(r, MAX_VALUE)?;
    let text = || String::from_utf8_lossy(&bytes).into_owned();
    Ok(match code {
        0 => Reply::Ok(bytes),
        1 => Reply::Refused(text()),
        2 => Reply::TimedOut {
            missing: ranks,
            notes: text(),
        },
        3 => Reply::Gone(ranks),
        4 => Reply::Closed,
        other => return Err(invalid(format!("unknown reply {other}"))),
    })
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn expect_magic(r: &mut impl Read) -> io::Result<()> {
    let mut magic = [0u8; 4];
    r.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(invalid("not a Lockstep rendezvous peer (unexpected bytes)".into()));
    }
    Ok(())
}

fn put_bytes(frame: &mut Vec<u8>, bytes: &[u8]) {
    frame.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    frame.extend_from_slice(bytes);
}

fn get_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

fn get_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn get_bytes(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let len = get_u64(r)?;
    if len > max as u64 {
        return Err(invalid(format!("a field of {len} bytes (at most {max})")));
    }
    let mut bytes = vec![0u8; len as usize];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn get_string(r: &mut impl Read, max: usize) -> io::Result<String> {
    String::from_utf8(get_bytes(r, max)?).map_err(|_| invalid("a field that is not UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_survive_the_round_trip() {
        let request = Request {
            token: "t0k".into(),
            op: Op::Barrier,
            rank: 3,
            key: "start".into(),
            value: vec![1, 2, 3],
            number: 1500,
        };
        let mut bytes = Vec::new();
        write_request(&mut bytes, &request).unwrap();
        let back = read_request(&mut &bytes[..]).unwrap();
        assert_eq!(
            (back.token, back.op, back.rank, back.key, back.value, back.number),
            (
                "t0k".to_string(),
                Op::Barrier,
                3,
                "start".to_string(),
                vec![1, 2, 3],
                1500
            )
        );
        for reply in [
            Reply::Ok(vec![9; 128]),
            Reply::Refused("why".into()),
            Reply::TimedOut {
                missing: vec![1, 3],
                notes: "n".into(),
            },
            Reply::Gone(vec![2]),
            Reply::Closed,
        ] {
            let mut bytes = Vec::new();
            write_reply(&mut bytes, &reply).unwrap();
            assert_eq!(read_reply(&mut &bytes[..]).unwrap(), reply);
        }
    }

    #[test]
    fn foreign_bytes_and_huge_fields_are_errors() {
        let err = read_reply(&mut &b"HTTP/1.1 400 Bad Request\r\n"[..]).unwrap_err();
        assert!(err.to_string().contains("not a Lockstep rendezvous"), "{err}");
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_request(&mut &frame[..]).is_err());
        // A token just over its bound is refused before its bytes are read.
        let mut frame = MAGIC.to_vec();
        frame.extend_from_slice(&(MAX_TOKEN as u64 + 1).to_le_bytes());
        let err = read_request(&mut &frame[..]).unwrap_err();
        assert!(err.to_string().contains("at most 1024"), "{err}");
    }
}
