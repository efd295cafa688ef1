//! The rendezvous protocol on the wire: one request, one reply, over a TCP connection that each
//! rank keeps open. Every request carries the job token; every frame starts with a magic word,
//! so a connection to some other service fails with a clear error instead of a garbled one.

use std::io::{self, Read, Write};

const MAGIC: [u8; 4] = *b"LKRV";

/// The largest field accepted (an NCCL id is 128 bytes): a stray peer cannot make us allocate
/// gigabytes.
const MAX_FIELD: usize = 1 << 20;

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

pub struct Request {
    pub token: String,
    pub op: Op,
    pub rank: usize,
    pub key: String,
    pub value: Vec<u8>,
    pub number: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// Done; the value for a `Get`.
    Ok(Vec<u8>),
    /// Not allowed (wrong token, wrong world size, a rank taken twice): says why.
    Refused(String),
    /// Waited the whole timeout; the ranks still missing and what the server noticed meanwhile.
    TimedOut { missing: Vec<usize>, notes: String },
    /// Ranks the wait needs closed their connection (exited or failed).
    Gone(Vec<usize>),
    /// Rank 0 is shutting the rendezvous down.
    Closed,
}

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

pub fn read_request(r: &mut impl Read) -> io::Result<Request> {
    expect_magic(r)?;
    let token = get_string(r)?;
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
        key: get_string(r)?,
        value: get_bytes(r)?,
        number: get_u64(r)?,
    })
}

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

pub fn read_reply(r: &mut impl Read) -> io::Result<Reply> {
    expect_magic(r)?;
    let code = get_u8(r)?;
    let count = get_u64(r)? as usize;
    if count > MAX_FIELD {
        return Err(invalid(format!("{count} ranks in one reply")));
    }
    let ranks = (0..count)
        .map(|_| get_u64(r).map(|v| v as usize))
        .collect::<io::Result<Vec<_>>>()?;
    let bytes = get_bytes(r)?;
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

fn get_bytes(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let len = get_u64(r)? as usize;
    if len > MAX_FIELD {
        return Err(invalid(format!("a field of {len} bytes (at most {MAX_FIELD})")));
    }
    let mut bytes = vec![0u8; len];
    r.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn get_string(r: &mut impl Read) -> io::Result<String> {
    String::from_utf8(get_bytes(r)?).map_err(|_| invalid("a field that is not UTF-8".into()))
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
    }
}
