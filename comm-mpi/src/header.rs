//! The header every rank all-gathers before a collective's data: which collective, dtype,
//! length, root or reduce op, and whether its own arguments were valid. Every rank sees the same
//! table, so all of them go on, or all return an error naming the rank that differs.

use lockstep_core::backend::ReduceOp;
use lockstep_core::dtype::DType;

const OPS: [&str; 7] = [
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "barrier",
    "duplicate",
    "reduce",
];
pub(super) const HEADER: usize = 5;

/// What one rank is about to do; every rank must announce the same before any data moves.
pub(super) struct Call {
    pub(super) op: &'static str,
    pub(super) dtype: Option<DType>,
    /// The length every rank must agree on (the input's, or the broadcast buffer's).
    pub(super) len: usize,
    /// The broadcast's root, or the reduction's `op_code`.
    pub(super) aux: usize,
}

impl Call {
    pub(super) fn new(op: &'static str, dtype: DType, len: usize) -> Call {
        Call {
            op,
            dtype: Some(dtype),
            len,
            aux: 0,
        }
    }
    pub(super) fn bare(op: &'static str) -> Call {
        Call {
            op,
            dtype: None,
            len: 0,
            aux: 0,
        }
    }
    pub(super) fn encode(&self, valid: bool) -> [u64; HEADER] {
        let op = OPS.iter().position(|&o| o == self.op).unwrap_or(OPS.len());
        let dtype = self.dtype.map_or(0, dtype_code);
        [op as u64, dtype, self.len as u64, self.aux as u64, valid as u64]
    }
}

/// `dtype` as a number in headers (0 is "none").
pub(super) fn dtype_code(dtype: DType) -> u64 {
    DType::ALL.iter().position(|&x| x == dtype).map_or(0, |i| i as u64 + 1)
}

/// The dtype of `dtype_code`'s number.
pub(super) fn dtype_of(code: u64) -> Option<DType> {
    code.checked_sub(1).and_then(|i| DType::ALL.get(i as usize)).copied()
}

const REDUCE_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max];

pub(super) fn op_code(op: ReduceOp) -> usize {
    REDUCE_OPS.iter().position(|&o| o == op).unwrap_or(REDUCE_OPS.len())
}

/// `Call::aux` of a reduce to one root: the root and the op in one number.
pub(super) fn rooted_op_code(root: usize, op: ReduceOp) -> usize {
    root * (REDUCE_OPS.len() + 1) + op_code(op)
}

/// `Call::aux` in words, for the message that says how two ranks differ.
fn describe_aux(op: &str, aux: u64) -> String {
    let reduces = |code: u64| match REDUCE_OPS.get(code as usize) {
        Some(o) => format!("reduces with {o:?}"),
        None => format!("reduces with op {code}"),
    };
    match op {
        "broadcast" => format!("broadcasts from root {aux}"),
        "reduce" => {
            let codes = REDUCE_OPS.len() as u64 + 1;
            format!("{} to root {}", reduces(aux % codes), aux / codes)
        }
        _ => reduces(aux),
    }
}

fn decode_dtype(code: u64) -> String {
    dtype_of(code).map_or_else(|| "none".into(), |d| d.to_string())
}

/// Why rank `r`'s header `all[r]` differs from this rank's `mine`, for the first such rank.
pub(super) fn first_difference(op: &str, mine: &[u64; HEADER], all: &[u64]) -> Option<String> {
    all.chunks(HEADER).enumerate().find_map(|(r, theirs)| {
        if theirs[4] == 0 {
            Some(format!(
                "rank {r} passed invalid arguments to its {op} (its own error says which); no rank ran it"
            ))
        } else if theirs[0] != mine[0] {
            let other = OPS.get(theirs[0] as usize).copied().unwrap_or("an unknown collective");
            Some(format!(
                "rank {r} is in `{other}`, this rank in `{op}`: every rank must call the same collectives in the same order"
            ))
        } else if theirs[1] != mine[1] {
            Some(format!(
                "rank {r} passed dtype {}, this rank {}",
                decode_dtype(theirs[1]),
                decode_dtype(mine[1])
            ))
        } else if theirs[2] != mine[2] {
            Some(format!("rank {r} passed {} elements, this rank {}", theirs[2], mine[2]))
        } else if theirs[3] != mine[3] {
            Some(format!(
                "rank {r} {}, this rank {}",
                describe_aux(op, theirs[3]),
                describe_aux(op, mine[3])
            ))
        } else {
            None
        }
    })
}
