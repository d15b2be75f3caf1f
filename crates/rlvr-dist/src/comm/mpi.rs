//! [`MpiComm`]: the collectives over MPI (rsmpi, `mpi` 0.8.2 without default features).

use std::time::{Duration, Instant};

use candle_core::Tensor;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use mpi::collective::SystemOperation;
use mpi::datatype::{Equivalence, PartitionMut};
use mpi::environment::Universe;
use mpi::request::{Request, Scope, StaticScope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{
    Communicator as _, CommunicatorCollectives as _, Destination as _, MatchedReceiveVec as _,
    Root as _, Source as _,
};
use mpi::Threading;

use super::{
    check_gather_shape, check_root, check_scatter_shape, timeout_from_env, Communicator, Op,
    TIMEOUT_VAR,
};
use crate::buf::{check_copyable, check_reducible, with_slice, HostVec, Slice, Wide};
use crate::{DistError, Result};

/// The exit code of a job aborted by a collective timeout (as coreutils `timeout`).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// The exit code of a job aborted because a rank panicked (Rust's panic exit code).
pub const PANIC_EXIT_CODE: i32 = 101;

/// How long a rank that timed out waits for its peers' answers before aborting.
pub const REPORT_GRACE: Duration = Duration::from_secs(3);

/// The environment variable that turns on the layout check before every collective (`1`).
pub const CHECK_VAR: &str = "RLVR_DIST_CHECK";

/// The collectives' names, indexed by the op code carried in failure reports.
const OPS: &[&str] = &[
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_reduce_f64",
    "all_gather_bytes",
    "broadcast_bytes",
    "barrier",
];

/// The tag of failure reports on the control communicator.
const REPORT_TAG: i32 = 0x7264;
const QUERY: u64 = 1;
const REPLY: u64 = 2;

/// The MPI communicator of one process (`MPI_COMM_WORLD`), initialised with
/// `MPI_THREAD_SERIALIZED`.
///
/// - Tensor collectives run on the tensor's own elements: CPU tensors in place (through
///   candle's `InplaceOp1`, with a scratch copy as MPI's send buffer since rsmpi has no
///   `MPI_IN_PLACE`), CUDA tensors staged through host memory. bf16 and f16 are reduced in f32
///   and rounded once; broadcasts and gathers move their bits unchanged.
/// - Counts above `i32::MAX` (MPI's `int`) are split into several calls of at most
///   [`MpiComm::with_max_count`] elements; the result is the same as one call's.
/// - Every collective is non-blocking underneath and polled, so it has a timeout
///   ([`TIMEOUT_VAR`], default 600 s). A rank that times out sends each peer a query, waits
///   [`REPORT_GRACE`] for answers (a rank polling any collective answers with the collective it
///   is in), prints one line to stderr naming the ranks that never arrived and those in another
///   collective, and aborts the job with `MPI_Abort` (exit code [`TIMEOUT_EXIT_CODE`]). A rank
///   that exits, or is killed, is reported by `mpirun`, which ends the job at once; a rank whose
///   thread panics while it holds the communicator aborts the job ([`PANIC_EXIT_CODE`]).
/// - With [`CHECK_VAR`]`=1` (or [`MpiComm::with_checks`]) every collective first all-gathers a
///   hash of its name, sequence number and layout, turning a mismatch into
///   [`DistError::Mismatch`] instead of a hang or garbage.
///
/// MPI can be initialised once per process: a second [`MpiComm::init`] fails, and dropping the
/// communicator finalises MPI for good.
pub struct MpiComm {
    world: SimpleCommunicator,
    /// A duplicate of the world for failure reports, so they never match a collective's traffic.
    ctl: SimpleCommunicator,
    rank: usize,
    size: usize,
    timeout: Option<Duration>,
    checks: bool,
    seq: u64,
    max_count: usize,
    /// Last: finalises MPI after the communicators are freed.
    _universe: Universe,
}

// SAFETY: rsmpi's handles are raw pointers to MPI objects, hence !Send. MPI was initialised with
// MPI_THREAD_SERIALIZED (checked in `init`), which allows MPI calls from any thread as long as
// no two run at once. Every method that calls MPI takes `&mut self` (`rank` and `world_size`
// return cached values), and `MpiComm` is not `Sync`, so moving it to another thread cannot
// make two MPI calls concurrent.
#[allow(unsafe_code)]
unsafe impl Send for MpiComm {}

impl Drop for MpiComm {
    /// A rank unwinding from a panic aborts the job at once: otherwise its peers would wait in
    /// their next collective until the timeout. (A normal drop finalises MPI.)
    fn drop(&mut self) {
        if std::thread::panicking() {
            super::say_whole(&format!(
                "rlvr-dist: rank {} of {} panicked (message above); aborting the job",
                self.rank, self.size
            ));
            self.world.abort(PANIC_EXIT_CODE);
        }
    }
}

fn system_op(op: Op) -> SystemOperation {
    match op {
        Op::Sum => SystemOperation::sum(),
        Op::Max => SystemOperation::max(),
        Op::Min => SystemOperation::min(),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).expect("chunked below i32::MAX")
}

/// FNV-1a, for layout signatures.
fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn op_code(op: &str) -> u64 {
    OPS.iter().position(|o| *o == op).unwrap_or(OPS.len()) as u64
}

fn op_name(code: u64) -> &'static str {
    OPS.get(code as usize).copied().unwrap_or("?")
}

fn list(ranks: &[usize]) -> String {
    if ranks.is_empty() {
        "none".into()
    } else {
        ranks
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl MpiComm {
    /// Initialises MPI and returns the world communicator, with the timeout of
    /// [`TIMEOUT_VAR`] and the checks of [`CHECK_VAR`].
    ///
    /// # Errors
    /// MPI already initialised in this process; an MPI library without
    /// `MPI_THREAD_SERIALIZED`; a bad [`TIMEOUT_VAR`] value.
    pub fn init() -> Result<Self> {
        let timeout = timeout_from_env()?;
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| {
                DistError::Mpi(
                    "MPI is already initialised in this process (one MpiComm per process)".into(),
                )
            })?;
        if threading < Threading::Serialized {
            return Err(DistError::Mpi(format!(
                "the MPI library provides {threading:?} threading; rlvr needs Serialized"
            )));
        }
        let world = universe.world();
        let ctl = world.duplicate();
        Ok(MpiComm {
            rank: world.rank() as usize,
            size: world.size() as usize,
            world,
            ctl,
            timeout,
            checks: std::env::var(CHECK_VAR).is_ok_and(|v| v == "1"),
            seq: 0,
            max_count: i32::MAX as usize,
            _universe: universe,
        })
    }

    /// Sets the collective timeout (`None`: wait forever, blocking in MPI).
    pub fn with_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Turns the layout check before every collective on or off (type docs).
    pub fn with_checks(mut self, on: bool) -> Self {
        self.checks = on;
        self
    }

    /// Caps the elements of one MPI call (default and maximum `i32::MAX`); tests use small caps
    /// to exercise the splitting.
    pub fn with_max_count(mut self, n: usize) -> Self {
        self.max_count = n.clamp(1, i32::MAX as usize);
        self
    }

    /// The MPI library's version string (`MPI_Get_library_version`).
    pub fn library_version() -> String {
        mpi::environment::library_version().unwrap_or_else(|_| "unknown".into())
    }

    /// Starts collective `op`, optionally checking that every rank agrees on `sig`.
    fn begin(&mut self, op: &'static str, sig: impl FnOnce() -> String) -> Result<u64> {
        let seq = self.seq;
        self.seq += 1;
        if self.checks {
            let sig = sig();
            let mine = [hash(&format!("{op} #{seq} {sig}"))];
            let mut all = vec![0u64; self.size];
            mpi::request::scope(|sc| {
                let req = self
                    .world
                    .immediate_all_gather_into(sc, &mine[..], &mut all[..]);
                self.complete(op, seq, req);
            });
            if let Some(r) = all.iter().position(|h| *h != mine[0]) {
                return Err(DistError::Mismatch {
                    op,
                    detail: format!(
                        "rank {r} called another collective or layout than rank {} ({op} #{seq} {sig})",
                        self.rank
                    ),
                });
            }
        }
        Ok(seq)
    }

    /// Waits for `req`, answering peers' failure queries; on timeout reports and aborts.
    fn complete<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        op: &'static str,
        seq: u64,
        mut req: Request<'a, D, S>,
    ) {
        let Some(timeout) = self.timeout else {
            req.wait_without_status();
            return;
        };
        let start = Instant::now();
        let mut next_probe = start;
        let mut polls = 0u32;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            let now = Instant::now();
            if now >= next_probe {
                self.answer_queries(op, seq, &mut Vec::new());
                next_probe = now + Duration::from_millis(10);
            }
            if now.duration_since(start) >= timeout {
                // The request stays pending: the job is aborted below, never returned to.
                std::mem::forget(req);
                self.fail(op, seq, timeout);
            }
            polls += 1;
            if polls < 64 {
                std::hint::spin_loop();
            } else if polls < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Sends `msg` to `to` without waiting (failure path only: the buffer and request leak).
    fn post(&self, to: usize, msg: [u64; 4]) {
        let buf: &'static [u64] = Box::leak(Box::new(msg));
        let req = self.ctl.process_at_rank(to as i32).immediate_send_with_tag(
            StaticScope,
            buf,
            REPORT_TAG,
        );
        std::mem::forget(req);
    }

    /// Answers pending failure queries with (`seq`, `op`), recording every report received
    /// (`(rank, seq, op code)`) in `seen`.
    fn answer_queries(&self, op: &'static str, seq: u64, seen: &mut Vec<(usize, u64, u64)>) {
        while let Some((msg, status)) = self
            .ctl
            .any_process()
            .immediate_matched_probe_with_tag(REPORT_TAG)
        {
            let from = status.source_rank() as usize;
            let (v, _) = (msg, status).matched_receive_vec::<u64>();
            if v.len() == 4 {
                seen.push((from, v[1], v[2]));
                if v[0] == QUERY {
                    self.post(from, [REPLY, seq, op_code(op), self.rank as u64]);
                }
            }
        }
    }

    /// Names the ranks that did not reach collective `seq` and aborts the job.
    fn fail(&self, op: &'static str, seq: u64, timeout: Duration) -> ! {
        for p in (0..self.size).filter(|p| *p != self.rank) {
            self.post(p, [QUERY, seq, op_code(op), self.rank as u64]);
        }
        let mut state: Vec<Option<(u64, u64)>> = vec![None; self.size];
        state[self.rank] = Some((seq, op_code(op)));
        let deadline = Instant::now() + REPORT_GRACE;
        let mut seen = Vec::new();
        while Instant::now() < deadline && state.iter().any(Option::is_none) {
            self.answer_queries(op, seq, &mut seen);
            for (r, s, o) in seen.drain(..) {
                state[r] = Some((s, o));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let here = (seq, op_code(op));
        let same: Vec<usize> = (0..self.size).filter(|r| state[*r] == Some(here)).collect();
        let silent: Vec<usize> = (0..self.size).filter(|r| state[*r].is_none()).collect();
        let other: Vec<String> = (0..self.size)
            .filter_map(|r| match state[r] {
                Some((s, o)) if (s, o) != here => Some(format!("rank {r} in {} #{s}", op_name(o))),
                _ => None,
            })
            .collect();
        let line = format!(
            "rlvr-dist: rank {} of {}: {op} (collective #{seq}) did not complete within {} s \
             ({TIMEOUT_VAR}); waiting for rank(s) {} (no answer within {} s: exited, hung, or \
             busy outside any collective); in this collective: rank(s) {}; in another \
             collective: {}; aborting the job",
            self.rank,
            self.size,
            timeout.as_secs_f64(),
            list(&silent),
            REPORT_GRACE.as_secs(),
            list(&same),
            if other.is_empty() {
                "none".into()
            } else {
                other.join(", ")
            },
        );
        super::say_whole(&line);
        self.world.abort(TIMEOUT_EXIT_CODE)
    }

    fn all_reduce_slice<T: Equivalence + Copy>(
        &self,
        op_name: &'static str,
        seq: u64,
        xs: &mut [T],
        op: Op,
    ) {
        for chunk in xs.chunks_mut(self.max_count) {
            let send = chunk.to_vec();
            mpi::request::scope(|sc| {
                let req = self
                    .world
                    .immediate_all_reduce_into(sc, &send[..], chunk, system_op(op));
                self.complete(op_name, seq, req);
            });
        }
    }

    fn all_reduce_wide(&self, op_name: &'static str, seq: u64, w: &mut Wide, op: Op) {
        match w {
            Wide::F32(v) => self.all_reduce_slice(op_name, seq, v, op),
            Wide::F64(v) => self.all_reduce_slice(op_name, seq, v, op),
        }
    }

    fn broadcast_slice<T: Equivalence>(
        &self,
        op_name: &'static str,
        seq: u64,
        xs: &mut [T],
        root: usize,
    ) {
        for chunk in xs.chunks_mut(self.max_count) {
            mpi::request::scope(|sc| {
                let req = self
                    .world
                    .process_at_rank(root as i32)
                    .immediate_broadcast_into(sc, chunk);
                self.complete(op_name, seq, req);
            });
        }
    }

    fn broadcast_any(&self, op_name: &'static str, seq: u64, s: Slice<'_>, root: usize) {
        match s {
            Slice::F32(v) => self.broadcast_slice(op_name, seq, v, root),
            Slice::F64(v) => self.broadcast_slice(op_name, seq, v, root),
            Slice::BF16(v) => self.broadcast_slice(op_name, seq, v.reinterpret_cast_mut(), root),
            Slice::F16(v) => self.broadcast_slice(op_name, seq, v.reinterpret_cast_mut(), root),
            Slice::U8(v) => self.broadcast_slice(op_name, seq, v, root),
            Slice::U32(v) => self.broadcast_slice(op_name, seq, v, root),
            Slice::I64(v) => self.broadcast_slice(op_name, seq, v, root),
        }
    }

    /// Every rank's `u64`s (the same count on every rank), in rank order.
    fn gather_u64(&self, op_name: &'static str, seq: u64, mine: &[u64]) -> Vec<u64> {
        let mut all = vec![0u64; mine.len() * self.size];
        mpi::request::scope(|sc| {
            let req = self.world.immediate_all_gather_into(sc, mine, &mut all[..]);
            self.complete(op_name, seq, req);
        });
        all
    }

    /// Every rank's elements, concatenated in rank order; `counts[r]` is rank r's length. Split
    /// into rounds so that no call carries more than `max_count` elements in all.
    fn gather_var<T: Equivalence + Copy + Default>(
        &self,
        op_name: &'static str,
        seq: u64,
        mine: &[T],
        counts: &[usize],
    ) -> Vec<T> {
        let total: usize = counts.iter().sum();
        let mut out = vec![T::default(); total];
        let offsets: Vec<usize> = counts
            .iter()
            .scan(0, |acc, c| {
                let o = *acc;
                *acc += c;
                Some(o)
            })
            .collect();
        let per = (self.max_count / self.size).max(1);
        let rounds = counts.iter().max().map_or(0, |m| m.div_ceil(per));
        for j in 0..rounds {
            let lo = j * per;
            let part: Vec<usize> = counts
                .iter()
                .map(|c| c.saturating_sub(lo).min(per))
                .collect();
            let displs: Vec<usize> = part
                .iter()
                .scan(0, |acc, c| {
                    let o = *acc;
                    *acc += c;
                    Some(o)
                })
                .collect();
            let mut recv = vec![T::default(); part.iter().sum()];
            let me = &mine[lo.min(mine.len())..(lo + part[self.rank]).min(mine.len())];
            let pc: Vec<i32> = part.iter().map(|c| count(*c)).collect();
            let pd: Vec<i32> = displs.iter().map(|d| count(*d)).collect();
            let mut partition = PartitionMut::new(&mut recv[..], &pc[..], &pd[..]);
            mpi::request::scope(|sc| {
                let req = self
                    .world
                    .immediate_all_gather_varcount_into(sc, me, &mut partition);
                self.complete(op_name, seq, req);
            });
            for r in 0..self.size {
                out[offsets[r] + lo..offsets[r] + lo + part[r]]
                    .copy_from_slice(&recv[displs[r]..displs[r] + part[r]]);
            }
        }
        out
    }

    fn gather_host(
        &self,
        op_name: &'static str,
        seq: u64,
        mine: &HostVec,
        counts: &[usize],
    ) -> HostVec {
        match mine {
            HostVec::F32(v) => HostVec::F32(self.gather_var(op_name, seq, v, counts)),
            HostVec::F64(v) => HostVec::F64(self.gather_var(op_name, seq, v, counts)),
            HostVec::BF16(v) => HostVec::BF16(
                self.gather_var(op_name, seq, v.reinterpret_cast(), counts)
                    .into_iter()
                    .map(bf16::from_bits)
                    .collect(),
            ),
            HostVec::F16(v) => HostVec::F16(
                self.gather_var(op_name, seq, v.reinterpret_cast(), counts)
                    .into_iter()
                    .map(f16::from_bits)
                    .collect(),
            ),
            HostVec::U8(v) => HostVec::U8(self.gather_var(op_name, seq, v, counts)),
            HostVec::U32(v) => HostVec::U32(self.gather_var(op_name, seq, v, counts)),
            HostVec::I64(v) => HostVec::I64(self.gather_var(op_name, seq, v, counts)),
        }
    }

    /// This rank's block of `block` elements of the reduction of `all` (W blocks), in rounds of
    /// at most `max_count` elements per call.
    fn reduce_scatter_slice<T: Equivalence + Copy + Default>(
        &self,
        seq: u64,
        all: &[T],
        block: usize,
        op: Op,
    ) -> Vec<T> {
        let per = (self.max_count / self.size).max(1);
        let mut out = Vec::with_capacity(block);
        let mut lo = 0;
        while lo < block {
            let c = per.min(block - lo);
            let mut send = Vec::with_capacity(c * self.size);
            for w in 0..self.size {
                send.extend_from_slice(&all[w * block + lo..w * block + lo + c]);
            }
            let mut recv = vec![T::default(); c];
            mpi::request::scope(|sc| {
                let req = self.world.immediate_reduce_scatter_block_into(
                    sc,
                    &send[..],
                    &mut recv[..],
                    system_op(op),
                );
                self.complete("reduce_scatter", seq, req);
            });
            out.extend_from_slice(&recv);
            lo += c;
        }
        out
    }
}

fn layout(t: &Tensor) -> String {
    format!("{:?}{:?}", t.dtype(), t.dims())
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }
    fn separate_processes(&self) -> bool {
        true
    }

    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        for b in bufs {
            check_reducible("all_reduce", b.dtype())?;
        }
        let seq = self.begin("all_reduce", || {
            format!(
                "{op:?} {}",
                bufs.iter().map(layout).collect::<Vec<_>>().join(",")
            )
        })?;
        for b in bufs {
            with_slice(b, "all_reduce", |mut s| {
                match &mut s {
                    Slice::F32(v) => self.all_reduce_slice("all_reduce", seq, v, op),
                    Slice::F64(v) => self.all_reduce_slice("all_reduce", seq, v, op),
                    _ => {
                        let mut w = s.widen();
                        self.all_reduce_wide("all_reduce", seq, &mut w, op);
                        s.narrow_from(&w);
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()> {
        check_root("broadcast", root, self.size)?;
        for b in bufs {
            check_copyable("broadcast", b.dtype())?;
        }
        let seq = self.begin("broadcast", || {
            format!(
                "root {root} {}",
                bufs.iter().map(layout).collect::<Vec<_>>().join(",")
            )
        })?;
        for b in bufs {
            with_slice(b, "broadcast", |s| {
                self.broadcast_any("broadcast", seq, s, root);
                Ok(())
            })?;
        }
        Ok(())
    }

    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        check_gather_shape(shard)?;
        check_copyable("all_gather", shard.dtype())?;
        let rest = shard.dims()[1..].to_vec();
        let sig = format!("{:?}[_, {rest:?}]", shard.dtype());
        let seq = self.begin("all_gather", || sig.clone())?;
        // Leading sizes and layout hashes: uneven splits are allowed, other layouts are not.
        let meta = self.gather_u64("all_gather", seq, &[shard.dims()[0] as u64, hash(&sig)]);
        if let Some(r) = (0..self.size).find(|r| meta[2 * r + 1] != hash(&sig)) {
            return Err(DistError::Mismatch {
                op: "all_gather",
                detail: format!(
                    "rank {r} passed another dtype or trailing shape than rank {} ({sig})",
                    self.rank
                ),
            });
        }
        let inner: usize = rest.iter().product();
        let rows: Vec<usize> = (0..self.size).map(|r| meta[2 * r] as usize).collect();
        let counts: Vec<usize> = rows.iter().map(|n| n * inner).collect();
        let mine = with_slice(shard, "all_gather", |s| Ok(s.to_vec()))?;
        let out = self.gather_host("all_gather", seq, &mine, &counts);
        let mut dims = vec![rows.iter().sum::<usize>()];
        dims.extend_from_slice(&rest);
        out.into_tensor(dims, shard.device())
    }

    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor> {
        let n = check_scatter_shape(flat, self.size)?;
        check_reducible("reduce_scatter", flat.dtype())?;
        let seq = self.begin("reduce_scatter", || format!("{op:?} {}", layout(flat)))?;
        let inner: usize = flat.dims()[1..].iter().product();
        let block = n * inner;
        let all = with_slice(flat, "reduce_scatter", |s| Ok(s.widen()))?;
        let mine = match &all {
            Wide::F32(v) => Wide::F32(self.reduce_scatter_slice(seq, v, block, op)),
            Wide::F64(v) => Wide::F64(self.reduce_scatter_slice(seq, v, block, op)),
        };
        let mut dims = flat.dims().to_vec();
        dims[0] = n;
        mine.narrow_to(flat.dtype(), 0..block)
            .into_tensor(dims, flat.device())
    }

    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()> {
        let seq = self.begin("all_reduce_f64", || format!("{op:?} f64[{}]", xs.len()))?;
        self.all_reduce_slice("all_reduce_f64", seq, xs, op);
        Ok(())
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.begin("all_gather_bytes", String::new)?;
        let lens = self.gather_u64("all_gather_bytes", seq, &[mine.len() as u64]);
        let counts: Vec<usize> = lens.iter().map(|n| *n as usize).collect();
        let flat = self.gather_var("all_gather_bytes", seq, mine, &counts);
        let mut out = Vec::with_capacity(self.size);
        let mut at = 0;
        for c in counts {
            out.push(flat[at..at + c].to_vec());
            at += c;
        }
        Ok(out)
    }

    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        check_root("broadcast_bytes", root, self.size)?;
        let seq = self.begin("broadcast_bytes", || format!("root {root}"))?;
        let mut len = [buf.len() as u64];
        self.broadcast_slice("broadcast_bytes", seq, &mut len, root);
        buf.resize(len[0] as usize, 0);
        self.broadcast_slice("broadcast_bytes", seq, &mut buf[..], root);
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let seq = self.begin("barrier", String::new)?;
        let req = self.world.immediate_barrier();
        self.complete("barrier", seq, req);
        Ok(())
    }
}
