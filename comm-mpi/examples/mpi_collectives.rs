//! Every `MpiCommunicator` collective on the CPU device, checked on every rank against values
//! computed here (as core/tests/communicator.rs does for `LocalCommunicator`). Build and run:
//!
//! ```sh
//! cargo build -p lockstep-mpi --features mpi --example mpi_collectives
//! OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
//!     mpirun -np 4 --oversubscribe --bind-to none target/debug/examples/mpi_collectives
//! ```
//!
//! Each rank prints `rank R ok` and exits 0, or prints what differed and exits 1. With
//! `--die-before-collective abort|exit`, rank 1 dies (abort, or exit code 3) while the others
//! wait in an all-reduce: the launcher must end the job (comm-mpi/tests/mpi.rs checks it does).

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use lockstep_core::backend::{Backend, BufferRef, Communicator, ReduceOp};
use lockstep_core::{DType, Device, HostVec, Layout, Result};
use lockstep_mpi::{MpiCommunicator, MpiSession};

const DTYPES: [DType; 6] = [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::U32];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let die = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => None,
        ["--die-before-collective", how @ ("abort" | "exit")] => Some(how.to_string()),
        _ => {
            eprintln!("usage: mpi_collectives [--die-before-collective abort|exit]");
            return ExitCode::from(2);
        }
    };
    let (session, world): (MpiSession, MpiCommunicator) = match MpiCommunicator::init(Device::cpu().backend().clone()) {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("mpi_collectives: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rank = world.rank();
    let mut checks = Checks::new(&world);
    match die {
        Some(how) => checks.die_before_collective(&how),
        None => checks.run_all(),
    }
    let failures = checks.failures;
    drop(world);
    // MPI_Finalize before the process ends (returning from main, not std::process::exit).
    drop(session);
    if failures.is_empty() {
        println!("rank {rank} ok");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            println!("rank {rank}: FAILED {f}");
        }
        println!("rank {rank} failed {} check(s)", failures.len());
        ExitCode::FAILURE
    }
}

struct Checks<'a> {
    comm: &'a MpiCommunicator,
    backend: Arc<dyn Backend>,
    rank: usize,
    world: usize,
    failures: Vec<String>,
}

/// Rank r's element i: small values whose maximum comes from different ranks for different
/// elements, with halves for floats (exact in every float dtype, so sums are exact too).
fn contribution(rank: usize, len: usize, dtype: DType) -> Vec<f64> {
    let step = if dtype.is_float() { 0.5 } else { 1.0 };
    (0..len)
        .map(|i| ((rank * 5 + i * 3) % 7) as f64 + step * rank as f64)
        .collect()
}

/// Elementwise sum, mean and max over every rank's contribution, computed here; `from_f64`
/// rounds floats once and truncates integers, as integer Mean does.
fn expected(world: usize, len: usize, dtype: DType, op: ReduceOp) -> HostVec {
    let all: Vec<Vec<f64>> = (0..world).map(|r| contribution(r, len, dtype)).collect();
    let values: Vec<f64> = (0..len)
        .map(|i| {
            let column = all.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Mean => column.sum::<f64>() / world as f64,
                ReduceOp::Max => column.fold(f64::MIN, f64::max),
            }
        })
        .collect();
    HostVec::from_f64(dtype, &values)
}

/// The raw bytes, so that equality means identical bits (0.0 and -0.0 differ).
fn bits(v: &HostVec) -> Vec<u8> {
    lockstep_core::map_host_vec!(v, v => bytemuck::cast_slice(v.as_slice()).to_vec())
}

impl<'a> Checks<'a> {
    fn new(comm: &'a MpiCommunicator) -> Self {
        Checks {
            comm,
            backend: comm.backend().clone(),
            rank: comm.rank(),
            world: comm.world_size(),
            failures: Vec::new(),
        }
    }

    fn buffer(&self, host: &HostVec) -> BufferRef {
        self.backend
            .from_host(host)
            .expect("the CPU backend takes any host vector")
    }

    fn read(&self, buf: &BufferRef) -> HostVec {
        self.backend
            .to_host(buf, &Layout::contiguous([buf.len()]))
            .expect("the CPU backend reads any buffer")
    }

    /// Records a failure unless `got` succeeded and left `buf` equal to `want`.
    fn check(&mut self, what: String, got: Result<()>, buf: &BufferRef, want: &HostVec) {
        match got {
            Err(e) => self.failures.push(format!("{what}: {e}")),
            Ok(()) => {
                let have = self.read(buf);
                if have != *want {
                    self.failures.push(format!("{what}: expected {want:?}, got {have:?}"));
                }
            }
        }
    }

    /// Records a failure unless `got` is an error whose message contains every one of `needles`.
    fn check_error(&mut self, what: &str, got: Result<()>, needles: &[&str]) {
        match got {
            Ok(()) => self.failures.push(format!("{what}: succeeded, expected an error")),
            Err(e) => {
                let msg = e.to_string();
                if let Some(n) = needles.iter().find(|n| !msg.contains(*n)) {
                    self.failures.push(format!("{what}: error lacks {n:?}: {msg}"));
                }
            }
        }
    }

    fn run_all(&mut self) {
        for dtype in DTYPES {
            self.all_reduce(dtype, 7);
            self.broadcast(dtype);
            self.all_gather(dtype);
            self.reduce_scatter(dtype);
            self.reduce_to_each_root(dtype);
            self.identical_bits(dtype);
        }
        self.all_reduce(DType::F32, 0);
        self.all_reduce(DType::F32, 1000);
        self.wide_integers();
        if let Err(e) = self.comm.barrier() {
            self.failures.push(format!("barrier: {e}"));
        }
        // Mismatches and messages need a second rank.
        if self.world > 1 {
            self.errors_reach_every_rank();
            self.point_to_point();
        }
        self.duplicates_on_two_threads();
        self.time_a_large_all_reduce();
    }

    /// Pairs (0, 1), (2, 3), …: the even rank sends then receives, the odd one the other way
    /// round, every dtype, in order; then a message larger than the receiver's buffer.
    fn point_to_point(&mut self) {
        let partner = self.rank ^ 1;
        if partner >= self.world {
            return;
        }
        let even = self.rank.is_multiple_of(2);
        for dtype in DTYPES {
            let mine = self.buffer(&HostVec::from_f64(dtype, &contribution(self.rank, 6, dtype)));
            let into = self.backend.zeros(dtype, 6).expect("zeros");
            let (first, second) = if even {
                (self.comm.send(&mine, partner), self.comm.recv(&into, partner))
            } else {
                let got = self.comm.recv(&into, partner);
                (got, self.comm.send(&mine, partner))
            };
            if let Err(e) = first.and(second) {
                self.failures.push(format!("send/recv {dtype}: {e}"));
                continue;
            }
            let want = HostVec::from_f64(dtype, &contribution(partner, 6, dtype));
            self.check(format!("recv {dtype} from {partner}"), Ok(()), &into, &want);
        }
        let two = self.buffer(&HostVec::F32(vec![1.0, 2.0]));
        if even {
            if let Err(e) = self.comm.send(&two, partner) {
                self.failures.push(format!("send of 2 elements: {e}"));
            }
        } else {
            let three = self.backend.zeros(DType::F32, 3).expect("zeros");
            let got = self.comm.recv(&three, partner);
            self.check_error(
                "recv into a larger buffer",
                got,
                &["sent 2 f32 elements", "holds 3 f32"],
            );
        }
        let got = self.comm.send(&two, self.rank);
        self.check_error("send to itself", got, &["is not another rank"]);
    }

    /// 7 elements: not a multiple of 2 or 4 ranks, so the padded chunks are exercised.
    fn all_reduce(&mut self, dtype: DType, len: usize) {
        let mine = HostVec::from_f64(dtype, &contribution(self.rank, len, dtype));
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let buf = self.buffer(&mine);
            let got = self.comm.all_reduce(&buf, op);
            let want = expected(self.world, len, dtype, op);
            self.check(format!("all_reduce {op:?} {dtype} x{len}"), got, &buf, &want);
        }
    }

    /// From the last rank, not rank 0.
    fn broadcast(&mut self, dtype: DType) {
        let root = self.world - 1;
        let buf = self.buffer(&HostVec::from_f64(dtype, &contribution(self.rank, 5, dtype)));
        let got = self.comm.broadcast(&buf, root);
        let want = HostVec::from_f64(dtype, &contribution(root, 5, dtype));
        self.check(format!("broadcast {dtype} from {root}"), got, &buf, &want);
    }

    fn all_gather(&mut self, dtype: DType) {
        let len = 3;
        let input = self.buffer(&HostVec::from_f64(dtype, &contribution(self.rank, len, dtype)));
        let output = self.backend.zeros(dtype, len * self.world).expect("zeros");
        let got = self.comm.all_gather(&input, &output);
        let in_rank_order: Vec<f64> = (0..self.world).flat_map(|r| contribution(r, len, dtype)).collect();
        let want = HostVec::from_f64(dtype, &in_rank_order);
        self.check(format!("all_gather {dtype}"), got, &output, &want);
    }

    /// Rank r's input element i is 10r + i (+ 0.5 for floats); rank r keeps chunk r of the reduction.
    fn reduce_scatter(&mut self, dtype: DType) {
        let chunk = 3;
        let half = if dtype.is_float() { 0.5 } else { 0.0 };
        let world = self.world;
        let input_of = |r: usize| -> Vec<f64> { (0..chunk * world).map(|i| (10 * r + i) as f64 + half).collect() };
        let input = self.buffer(&HostVec::from_f64(dtype, &input_of(self.rank)));
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let output = self.backend.zeros(dtype, chunk).expect("zeros");
            let got = self.comm.reduce_scatter(&input, &output, op);
            let want: Vec<f64> = (0..chunk)
                .map(|j| {
                    let column = (0..self.world).map(|q| input_of(q)[self.rank * chunk + j]);
                    match op {
                        ReduceOp::Sum => column.sum(),
                        ReduceOp::Mean => column.sum::<f64>() / self.world as f64,
                        ReduceOp::Max => column.fold(f64::MIN, f64::max),
                    }
                })
                .collect();
            let want = HostVec::from_f64(dtype, &want);
            self.check(format!("reduce_scatter {op:?} {dtype}"), got, &output, &want);
        }
    }

    /// `reduce` to each root in turn gives that root the bits `all_reduce` gives every rank
    /// (inexact values, so a different order of sums would show); a root past the group is
    /// refused on every rank.
    fn reduce_to_each_root(&mut self, dtype: DType) {
        let len = 11;
        let mine: Vec<f64> = (0..len)
            .map(|i| (self.rank + 1) as f64 / 3.0 + i as f64 * 0.1)
            .collect();
        let everywhere = self.buffer(&HostVec::from_f64(dtype, &mine));
        if let Err(e) = self.comm.all_reduce(&everywhere, ReduceOp::Mean) {
            self.failures.push(format!("reduce {dtype}: all_reduce: {e}"));
            return;
        }
        let want = self.read(&everywhere);
        for root in 0..self.world {
            let buf = self.buffer(&HostVec::from_f64(dtype, &mine));
            let got = self.comm.reduce(&buf, root, ReduceOp::Mean);
            if self.rank == root {
                self.check(format!("reduce Mean {dtype} to root {root}"), got, &buf, &want);
            } else if let Err(e) = got {
                self.failures.push(format!("reduce Mean {dtype} to root {root}: {e}"));
            }
        }
        let buf = self.buffer(&HostVec::from_f64(dtype, &mine));
        let root = self.world;
        let got = self.comm.reduce(&buf, root, ReduceOp::Sum);
        self.check_error(&format!("reduce {dtype} to root {root}"), got, &["reduce", "root"]);
    }

    /// Inexact values (thirds, tenths): every rank must still end with the same bits, and
    /// close to the exact mean.
    fn identical_bits(&mut self, dtype: DType) {
        let len = 1001;
        let exact: Vec<Vec<f64>> = (0..self.world)
            .map(|r| (0..len).map(|i| (r + 1) as f64 / 3.0 + i as f64 * 0.1).collect())
            .collect();
        let buf = self.buffer(&HostVec::from_f64(dtype, &exact[self.rank]));
        if let Err(e) = self.comm.all_reduce(&buf, ReduceOp::Mean) {
            self.failures.push(format!("identical bits {dtype}: all_reduce: {e}"));
            return;
        }
        let mine = self.read(&buf);
        let gathered = self.backend.zeros(dtype, len * self.world).expect("zeros");
        if let Err(e) = self.comm.all_gather(&buf, &gathered) {
            self.failures.push(format!("identical bits {dtype}: all_gather: {e}"));
            return;
        }
        let all = bits(&self.read(&gathered));
        for (r, theirs) in all.chunks(all.len() / self.world).enumerate() {
            if theirs != bits(&mine) {
                self.failures.push(format!(
                    "identical bits {dtype}: rank {r}'s mean differs from this rank's"
                ));
            }
        }
        let tolerance = match dtype {
            DType::F16 | DType::BF16 => 1e-2,
            DType::F32 => 1e-6,
            DType::F64 => 1e-12,
            // Integers truncate every contribution and the mean: only the bits are compared.
            DType::I64 | DType::U32 => return,
        };
        for (i, got) in mine.to_f64_vec().iter().enumerate() {
            let want: f64 = exact.iter().map(|v| v[i]).sum::<f64>() / self.world as f64;
            if (got - want).abs() > tolerance * want.abs().max(1.0) {
                self.failures.push(format!(
                    "identical bits {dtype}: element {i} is {got}, exact mean {want}"
                ));
                break;
            }
        }
    }

    /// i64 and u32 reduce natively: values beyond f64's 53 bits and near u32's top stay exact.
    fn wide_integers(&mut self) {
        let r = self.rank as i64;
        let ranks: i64 = (0..self.world as i64).sum();
        let buf = self.buffer(&HostVec::I64(vec![(1 << 60) + r, -(1 << 55) - 3 * r]));
        let got = self.comm.all_reduce(&buf, ReduceOp::Sum);
        let w = self.world as i64;
        let want = HostVec::I64(vec![w * (1 << 60) + ranks, -w * (1 << 55) - 3 * ranks]);
        self.check("all_reduce Sum i64 beyond 2^53".into(), got, &buf, &want);
        let buf = self.buffer(&HostVec::U32(vec![(1 << 29) + self.rank as u32]));
        let got = self.comm.all_reduce(&buf, ReduceOp::Sum);
        let want = HostVec::U32(vec![(self.world as u32) * (1 << 29) + ranks as u32]);
        self.check("all_reduce Sum u32 near 2^31".into(), got, &buf, &want);
    }

    /// A mistake on one rank is an error on every rank (no hang), and the next collective works.
    fn errors_reach_every_rank(&mut self) {
        let one = |c: &Self| c.buffer(&HostVec::F32(vec![1.0]));
        // A wrong all_gather output on rank 1 only.
        let out_len = if self.rank == 1 { self.world + 1 } else { self.world };
        let out = self.backend.zeros(DType::F32, out_len).expect("zeros");
        let got = self.comm.all_gather(&one(self), &out);
        self.check_error("all_gather, rank 1's output too small", got, &["all_gather", "rank 1"]);
        // A root out of range.
        let got = self.comm.broadcast(&one(self), self.world);
        self.check_error("broadcast from a root out of range", got, &["broadcast", "root"]);
        // Lengths, dtypes and reduce ops that differ between ranks.
        let len = if self.rank == 0 { 3 } else { 4 };
        let got = self
            .comm
            .all_reduce(&self.buffer(&HostVec::F32(vec![1.0; len])), ReduceOp::Sum);
        self.check_error("all_reduce of different lengths", got, &["all_reduce", "elements"]);
        let dtype = if self.rank == 1 { DType::F16 } else { DType::F32 };
        let got = self
            .comm
            .all_reduce(&self.buffer(&HostVec::from_f64(dtype, &[1.0])), ReduceOp::Sum);
        self.check_error("all_reduce of different dtypes", got, &["f16", "f32"]);
        let op = if self.rank == 0 { ReduceOp::Sum } else { ReduceOp::Max };
        let got = self.comm.all_reduce(&one(self), op);
        self.check_error("all_reduce with different ops", got, &["Sum", "Max"]);
        // Different collectives at the same point.
        let got = if self.rank == 0 {
            self.comm.barrier()
        } else {
            self.comm.all_reduce(&one(self), ReduceOp::Sum)
        };
        self.check_error("barrier against all_reduce", got, &["same collectives"]);
        // Still in step afterwards.
        let buf = one(self);
        let got = self.comm.all_reduce(&buf, ReduceOp::Sum);
        self.check(
            "all_reduce after the errors".into(),
            got,
            &buf,
            &HostVec::F32(vec![self.world as f32]),
        );
    }

    /// Two duplicates driven by two threads at once, with different lengths and values: any
    /// crossing of their traffic shows as a length error or a wrong sum.
    fn duplicates_on_two_threads(&mut self) {
        let (a, b) = match (self.comm.duplicate(), self.comm.duplicate()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                let errors = [a.err(), b.err()].into_iter().flatten();
                self.failures.extend(errors.map(|e| format!("duplicate: {e}")));
                return;
            }
        };
        if (a.rank(), a.world_size()) != (self.rank, self.world) {
            self.failures
                .push(format!("duplicate: rank/world {:?}", (a.rank(), a.world_size())));
        }
        let world = self.world as f64;
        let ranks: f64 = (0..self.world).map(|r| r as f64).sum();
        let drive = |comm: &MpiCommunicator, len: usize, base: f64| -> Vec<String> {
            let backend = comm.backend();
            let mut failures = Vec::new();
            for step in 0..200 {
                let mine: Vec<f64> = (0..len)
                    .map(|i| base + (step * len + i) as f64 + comm.rank() as f64)
                    .collect();
                let buf = backend.from_host(&HostVec::F32(mine.iter().map(|&x| x as f32).collect()));
                let buf = buf.expect("from_host");
                if let Err(e) = comm.all_reduce(&buf, ReduceOp::Sum) {
                    failures.push(format!("thread base {base}, step {step}: {e}"));
                    break;
                }
                let got = backend.to_host(&buf, &Layout::contiguous([len])).expect("to_host");
                let want: Vec<f64> = mine.iter().map(|x| (x - comm.rank() as f64) * world + ranks).collect();
                if got.to_f64_vec() != want {
                    failures.push(format!(
                        "thread base {base}, step {step}: expected {want:?}, got {got:?}"
                    ));
                    break;
                }
            }
            failures
        };
        let (fa, fb) = thread::scope(|s| {
            let ta = s.spawn(|| drive(&a, 5, 0.0));
            let tb = s.spawn(|| drive(&b, 9, 100_000.0));
            (ta.join(), tb.join())
        });
        for f in [fa, fb] {
            match f {
                Ok(f) => self
                    .failures
                    .extend(f.into_iter().map(|f| format!("duplicates on two threads: {f}"))),
                Err(_) => self
                    .failures
                    .push("duplicates on two threads: a thread panicked".into()),
            }
        }
    }

    /// Not a check: the cost of 1M f32 on this machine, for the record.
    fn time_a_large_all_reduce(&mut self) {
        let buf = self.buffer(&HostVec::F32(vec![1.0; 1 << 20]));
        let start = Instant::now();
        match self.comm.all_reduce(&buf, ReduceOp::Mean) {
            Ok(()) if self.rank == 0 => println!(
                "rank 0: all_reduce Mean of 1M f32 over {} ranks took {:.1} ms",
                self.world,
                start.elapsed().as_secs_f64() * 1e3
            ),
            Ok(()) => {}
            Err(e) => self.failures.push(format!("all_reduce of 1M f32: {e}")),
        }
    }

    /// Rank 1 dies once everyone is in the job; the others block in an all-reduce that can
    /// only end by the launcher killing them.
    fn die_before_collective(&mut self, how: &str) {
        if let Err(e) = self.comm.barrier() {
            self.failures.push(format!("barrier: {e}"));
            return;
        }
        if self.rank == 1 {
            // No rank number in this line: the test looks for the launcher naming the rank.
            println!("dying now ({how})");
            if how == "abort" {
                std::process::abort();
            }
            std::process::exit(3);
        }
        let buf = self.buffer(&HostVec::F32(vec![1.0]));
        let got = self.comm.all_reduce(&buf, ReduceOp::Sum);
        self.failures
            .push(format!("all_reduce returned ({got:?}) although rank 1 died before it"));
    }
}
