//! The [`Communicator`] trait and its implementations.
//!
//! | implementation | when | engine |
//! |---|---|---|
//! | [`LocalComm`] | one process (the default) | none: every collective is the identity |
//! | [`ThreadComm`] | tests only (never offered to users) | N threads of one process, `std::sync` |
//! | `MpiComm` (feature `mpi`) | `mpirun` / `srun --mpi=pmix` launches | rsmpi over the system MPI |
//! | `NcclComm` (feature `nccl`) | ranks on GPUs ([`Backend`]) | NCCL for device tensors, over one of the above for host values |
//!
//! [`init`] picks one of the first three from a [`Launch`]; [`init_on`] adds NCCL for a CUDA device.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::Tensor;

use crate::env::Launch;
use crate::{DistError, Result};

#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "nccl")]
mod nccl;
mod thread;

#[cfg(feature = "nccl")]
pub use self::nccl::NcclComm;

#[cfg(feature = "mpi")]
pub use self::mpi::{MpiComm, CHECK_VAR, PANIC_EXIT_CODE, REPORT_GRACE, TIMEOUT_EXIT_CODE};
pub use thread::ThreadComm;

/// An elementwise reduction.
///
/// `Sum` adds in the engine's order: [`ThreadComm`] adds in rank order, `((x₀+x₁)+x₂)+…`; MPI's
/// order is its own, but with two ranks a sum is one commutative addition, so every engine gives
/// the same bits at W = 2. bf16 and f16 tensors are reduced in f32 and rounded once at the end.
/// How `Max` and `Min` treat NaN is not specified (MPI does not specify it); flags are therefore
/// carried as 0/1 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Elementwise sum.
    Sum,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

/// The collectives a data-parallel trainer needs, over candle tensors and small host values.
///
/// Every collective is called by every rank of the group, in the same order, with matching
/// arguments (the same tensor count, shapes, dtypes, op and root on every rank, except where a
/// method says otherwise); a rank that skips one leaves the others waiting until the timeout
/// ([`timeout_from_env`]). Tensor arguments must be contiguous (any start offset) and of a
/// supported dtype: f32, f64, bf16, f16 for reductions, also u8, u32, i64 for copies. CUDA
/// tensors are staged through host memory by the MPI and thread engines.
///
/// In-place collectives write into the tensors' storage: every tensor that shares that storage
/// (a clone, a view) sees the result.
pub trait Communicator: Send {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks (≥ 1).
    fn world_size(&self) -> usize;

    /// Whether each rank is a process of its own under a launcher (MPI, NCCL): then a rank that
    /// fails alone should exit without finalising, so that the launcher ends the whole job at
    /// once (`mpirun` does, naming the rank), instead of its peers waiting in their next
    /// collective for the timeout. False for [`LocalComm`] and [`ThreadComm`] (threads of one
    /// process, whose peers learn at once that one left).
    fn separate_processes(&self) -> bool {
        false
    }

    /// Replaces each tensor in `bufs`, in place, by the elementwise `op` of that tensor over all
    /// ranks.
    ///
    /// # Errors
    /// Unsupported dtype or layout ([`DistError::Invalid`]); ranks disagreeing on the layout
    /// ([`DistError::Mismatch`], where the engine detects it); a peer gone or a timeout.
    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()>;

    /// Overwrites each tensor in `bufs`, in place, with rank `root`'s.
    ///
    /// # Errors
    /// `root` out of range; as [`Communicator::all_reduce`].
    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()>;

    /// Concatenates every rank's `shard` along dimension 0, in rank order: `[nᵣ, …]` on rank r
    /// gives `[Σ nᵣ, …]` on every rank. The leading sizes nᵣ may differ between ranks (an uneven
    /// split); the other dimensions and the dtype may not. The result is a new tensor on
    /// `shard`'s device.
    ///
    /// # Errors
    /// A 0-dimensional `shard`; as [`Communicator::all_reduce`].
    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor>;

    /// Reduces `flat` (`[W·n, …]`, the same shape on every rank) elementwise over all ranks and
    /// returns this rank's block of rows, `[n, …]` (rows `rank·n .. (rank+1)·n`). `flat` is not
    /// modified.
    ///
    /// # Errors
    /// A leading size not divisible by the world size; as [`Communicator::all_reduce`].
    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor>;

    /// Host-side reduction of a few numbers in place (counts, metric sums, flags as 0/1): the
    /// same length on every rank. Sums are exact for integers below 2⁵³.
    ///
    /// # Errors
    /// A peer gone or a timeout; a length mismatch where detected.
    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()>;

    /// Every rank's bytes, in rank order (per-row metadata, hashes). Lengths may differ.
    ///
    /// # Errors
    /// A peer gone or a timeout; more than `i32::MAX` bytes in all (MPI).
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Replaces `buf` with rank `root`'s bytes (its length included: other ranks may pass any
    /// buffer, an empty one too).
    ///
    /// # Errors
    /// `root` out of range; a peer gone or a timeout.
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()>;

    /// Returns once every rank has called it.
    ///
    /// # Errors
    /// A peer gone or a timeout.
    fn barrier(&mut self) -> Result<()>;

    /// Whether `flag` is true on any rank (an OR, carried as a `Max` of 0/1).
    ///
    /// # Errors
    /// As [`Communicator::all_reduce_f64`].
    fn any(&mut self, flag: bool) -> Result<bool> {
        let mut x = [f64::from(u8::from(flag))];
        self.all_reduce_f64(&mut x, Op::Max)?;
        Ok(x[0] > 0.0)
    }
}

/// The single-process communicator: rank 0 of 1, every collective the identity (tensors are not
/// touched; the gathering ones return copies).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalComm;

pub(crate) fn check_root(op: &'static str, root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(DistError::Invalid {
            op,
            detail: format!("root {root} is not a rank of a world of {world}"),
        });
    }
    Ok(())
}

pub(crate) fn check_gather_shape(shard: &Tensor) -> Result<()> {
    if shard.rank() == 0 {
        return Err(DistError::Invalid {
            op: "all_gather",
            detail: "needs a tensor with at least one dimension (reshape a scalar to [1])".into(),
        });
    }
    Ok(())
}

pub(crate) fn check_scatter_shape(flat: &Tensor, world: usize) -> Result<usize> {
    let d0 = flat.dims().first().copied().unwrap_or(0);
    if flat.rank() == 0 || d0 % world != 0 {
        return Err(DistError::Invalid {
            op: "reduce_scatter",
            detail: format!(
                "needs a leading size divisible by the world size {world}, got shape {:?}",
                flat.dims()
            ),
        });
    }
    Ok(d0 / world)
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        for b in bufs {
            crate::buf::check_reducible("all_reduce", b.dtype())?;
        }
        let _ = op;
        Ok(())
    }
    fn broadcast(&mut self, _bufs: &[Tensor], root: usize) -> Result<()> {
        check_root("broadcast", root, 1)
    }
    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        check_gather_shape(shard)?;
        Ok(shard.copy()?)
    }
    fn reduce_scatter(&mut self, flat: &Tensor, _op: Op) -> Result<Tensor> {
        check_scatter_shape(flat, 1)?;
        crate::buf::check_reducible("reduce_scatter", flat.dtype())?;
        Ok(flat.copy()?)
    }
    fn all_reduce_f64(&mut self, _xs: &mut [f64], _op: Op) -> Result<()> {
        Ok(())
    }
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }
    fn broadcast_bytes(&mut self, _buf: &mut Vec<u8>, root: usize) -> Result<()> {
        check_root("broadcast_bytes", root, 1)
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
}

impl Communicator for Box<dyn Communicator> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn separate_processes(&self) -> bool {
        (**self).separate_processes()
    }
    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        (**self).all_reduce(bufs, op)
    }
    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()> {
        (**self).broadcast(bufs, root)
    }
    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        (**self).all_gather(shard)
    }
    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor> {
        (**self).reduce_scatter(flat, op)
    }
    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()> {
        (**self).all_reduce_f64(xs, op)
    }
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        (**self).all_gather_bytes(mine)
    }
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        (**self).broadcast_bytes(buf, root)
    }
    fn barrier(&mut self) -> Result<()> {
        (**self).barrier()
    }
}

/// Writes `text` and a newline to stderr in one `write` call (a line of a rank's own report):
/// stderr is unbuffered and `mpirun` forwards each write as it comes, so a line written in pieces
/// can be split by `mpirun`'s own report of the abort that follows. Errors are ignored (stderr
/// gone is nothing to report to).
pub fn say_whole(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{text}\n").as_bytes());
}

/// One communicator shared by several owners of one rank (the trainer's metadata gathers and the
/// optimizer's [`crate::DistReduce`]): a cloneable handle that locks it for each collective.
///
/// The owners must still call collectives in the same order on every rank.
#[derive(Clone)]
pub struct SharedComm {
    inner: Arc<Mutex<Box<dyn Communicator>>>,
    rank: usize,
    world: usize,
    separate: bool,
    /// Nanoseconds spent inside collectives, all owners together ([`SharedComm::busy`]).
    busy_ns: Arc<std::sync::atomic::AtomicU64>,
}

impl SharedComm {
    /// Wraps `comm`.
    pub fn new(comm: Box<dyn Communicator>) -> Self {
        let (rank, world, separate) = (comm.rank(), comm.world_size(), comm.separate_processes());
        SharedComm {
            inner: Arc::new(Mutex::new(comm)),
            rank,
            world,
            separate,
            busy_ns: Default::default(),
        }
    }

    /// Time this rank has spent inside collectives through any clone of this handle since it was
    /// made: the communication itself and the wait for the slowest rank to arrive (rlvr's
    /// `time/comm_s` diagnostic is its growth over a step).
    pub fn busy(&self) -> Duration {
        Duration::from_nanos(self.busy_ns.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn with<R>(&self, f: impl FnOnce(&mut dyn Communicator) -> Result<R>) -> Result<R> {
        // A panic inside a collective leaves the engine as it was (it returns errors, not
        // half-written state), so a poisoned lock is still usable.
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = std::time::Instant::now();
        let r = f(&mut **g);
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns
            .fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
        r
    }
}

impl Communicator for SharedComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn separate_processes(&self) -> bool {
        self.separate
    }
    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        self.with(|c| c.all_reduce(bufs, op))
    }
    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()> {
        self.with(|c| c.broadcast(bufs, root))
    }
    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        self.with(|c| c.all_gather(shard))
    }
    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor> {
        self.with(|c| c.reduce_scatter(flat, op))
    }
    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()> {
        self.with(|c| c.all_reduce_f64(xs, op))
    }
    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.with(|c| c.all_gather_bytes(mine))
    }
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        self.with(|c| c.broadcast_bytes(buf, root))
    }
    fn barrier(&mut self) -> Result<()> {
        self.with(|c| c.barrier())
    }
}

/// The environment variable that sets the collective timeout, in seconds (`0` turns it off).
pub const TIMEOUT_VAR: &str = "RLVR_DIST_TIMEOUT_S";

/// The collective timeout when [`TIMEOUT_VAR`] is unset: 600 s (10 minutes, torch's NCCL
/// default). A collective waits for the slowest rank to arrive, and a rank may arrive late
/// because it sampled longer completions, so the bound must exceed the longest step's skew.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest collective timeout accepted, in seconds (10⁶ s, about 11.6 days; 0 means wait
/// forever): far beyond it a deadline `now + timeout` overflows.
pub const MAX_TIMEOUT_S: f64 = 1e6;

/// The collective timeout from [`TIMEOUT_VAR`]'s value (`None`: unset): `Some(timeout)`, or
/// `None` when it is `0` (wait forever).
///
/// # Errors
/// A value that is not a non-negative number of seconds.
pub fn timeout_from(value: Option<&str>) -> Result<Option<Duration>> {
    let Some(v) = value else {
        return Ok(Some(DEFAULT_TIMEOUT));
    };
    match v.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_S => {
            Ok(Duration::try_from_secs_f64(s).ok())
        }
        _ => Err(DistError::Invalid {
            op: "init",
            detail: format!(
                "{TIMEOUT_VAR}={v:?} is not a number of seconds in [0, {MAX_TIMEOUT_S:e}] (0 \
                 waits forever)"
            ),
        }),
    }
}

/// [`timeout_from`] over this process's environment.
///
/// # Errors
/// As [`timeout_from`].
pub fn timeout_from_env() -> Result<Option<Duration>> {
    timeout_from(std::env::var(TIMEOUT_VAR).ok().as_deref())
}

/// The communicator for `launch`: [`LocalComm`] for a world of 1; for more, `MpiComm` (its
/// timeout from [`timeout_from_env`]) when the crate has the `mpi` feature, after checking that
/// MPI sees the same rank and world size as the launcher's variables.
///
/// # Errors
/// A world size above 1 in a build without the `mpi` feature ([`DistError::FeatureMissing`],
/// naming the feature and the build command); MPI failing to start or disagreeing with the
/// launcher (a binary built against another MPI than the `mpirun` that started it runs every
/// rank as a world of 1).
pub fn init(launch: &Launch) -> Result<Box<dyn Communicator>> {
    init_with_timeout(launch, timeout_from_env()?)
}

/// [`init`] with the collective timeout `timeout` (`None`: wait forever) instead of
/// [`TIMEOUT_VAR`]'s (rlvr's `distributed.timeout_s`).
///
/// # Errors
/// As [`init`].
pub fn init_with_timeout(
    launch: &Launch,
    timeout: Option<Duration>,
) -> Result<Box<dyn Communicator>> {
    if launch.world_size == 1 {
        return Ok(Box::new(LocalComm));
    }
    #[cfg(feature = "mpi")]
    {
        let comm = MpiComm::init()?.with_timeout(timeout);
        if comm.rank() != launch.rank || comm.world_size() != launch.world_size {
            return Err(DistError::Mpi(format!(
                "MPI says rank {} of {}, the launcher's variables say {launch}: was this binary \
                 built against the MPI of the mpirun that started it (OpenMPI vs MPICH)?",
                comm.rank(),
                comm.world_size()
            )));
        }
        Ok(Box::new(comm))
    }
    #[cfg(not(feature = "mpi"))]
    let _ = timeout;
    #[cfg(not(feature = "mpi"))]
    Err(DistError::FeatureMissing {
        world_size: launch.world_size,
        source_var: launch.source.world_var().to_string(),
    })
}

/// Which engine carries the tensor collectives (rlvr's `distributed.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// NCCL when this build has it, the device is a GPU and there is more than one rank; else
    /// the host engine. The default, as torch's `init_process_group` picks NCCL for GPUs.
    #[default]
    Auto,
    /// The host engine ([`init`]): MPI, or nothing at a world size of 1. CUDA tensors are staged
    /// through host memory.
    Host,
    /// NCCL, also at a world size of 1 (a check of the NCCL path on one GPU); an error in a build
    /// without the `nccl` feature or on a CPU device.
    Nccl,
}

/// Whether this build has the `nccl` feature (NCCL collectives for GPU tensors).
pub const NCCL_BUILT: bool = cfg!(feature = "nccl");

/// The communicator of this rank for tensors on `device`: [`init_with_timeout`]'s host engine,
/// wrapped in NCCL as `backend` says ([`Backend`]). Every rank calls it together.
///
/// # Errors
/// As [`init_with_timeout`]; [`Backend::Nccl`] without the feature or with a CPU `device`;
/// NCCL's initialisation errors.
pub fn init_on(
    launch: &Launch,
    timeout: Option<Duration>,
    backend: Backend,
    device: &candle_core::Device,
) -> Result<Box<dyn Communicator>> {
    let host = init_with_timeout(launch, timeout)?;
    let nccl = match backend {
        Backend::Host => false,
        Backend::Auto => NCCL_BUILT && device.is_cuda() && launch.world_size > 1,
        Backend::Nccl => true,
    };
    if !nccl {
        return Ok(host);
    }
    if !device.is_cuda() {
        return Err(DistError::Invalid {
            op: "nccl init",
            detail: format!(
                "distributed.backend = \"nccl\" needs a GPU device, got {device:?} (use \"auto\" \
                 or \"host\" on CPUs)"
            ),
        });
    }
    #[cfg(feature = "nccl")]
    {
        let (rank, world) = (host.rank(), host.world_size());
        let comm = NcclComm::new(device, host)?;
        if rank == 0 {
            eprintln!(
                "data parallel: tensor collectives over NCCL {} on {device:?}, {world} rank(s)",
                NcclComm::version()?
            );
        }
        Ok(Box::new(comm))
    }
    #[cfg(not(feature = "nccl"))]
    Err(DistError::Invalid {
        op: "nccl init",
        detail: "distributed.backend = \"nccl\" needs a build with the `nccl` feature \
                 (scripts/cuda-build.sh --features nccl); \"auto\" or \"host\" use MPI"
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn nccl_is_refused_on_a_cpu_and_auto_stays_on_the_host() {
        let launch = Launch::single();
        let e = init_on(&launch, None, Backend::Nccl, &Device::Cpu)
            .err()
            .unwrap();
        assert!(e.to_string().contains("needs a GPU device"), "{e}");
        let c = init_on(&launch, None, Backend::Auto, &Device::Cpu).unwrap();
        assert_eq!((c.rank(), c.world_size()), (0, 1));
    }

    #[test]
    fn local_is_the_identity() {
        let mut c = LocalComm;
        let t = Tensor::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap();
        c.all_reduce(std::slice::from_ref(&t), Op::Sum).unwrap();
        c.broadcast(std::slice::from_ref(&t), 0).unwrap();
        assert_eq!(t.to_vec1::<f32>().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(
            c.all_gather(&t).unwrap().to_vec1::<f32>().unwrap(),
            [1.0, 2.0, 3.0]
        );
        assert_eq!(c.reduce_scatter(&t, Op::Max).unwrap().dims(), [3]);
        let mut xs = [1.5, -2.0];
        c.all_reduce_f64(&mut xs, Op::Sum).unwrap();
        assert_eq!(xs, [1.5, -2.0]);
        assert_eq!(c.all_gather_bytes(b"ab").unwrap(), vec![b"ab".to_vec()]);
        let mut b = b"x".to_vec();
        c.broadcast_bytes(&mut b, 0).unwrap();
        assert_eq!(b, b"x");
        c.barrier().unwrap();
        assert!(c.any(true).unwrap() && !c.any(false).unwrap());
        assert!(c
            .broadcast(&[], 1)
            .unwrap_err()
            .to_string()
            .contains("root 1"));
        let s = Tensor::new(1f32, &Device::Cpu).unwrap();
        assert!(c.all_gather(&s).is_err());
        let u = Tensor::zeros(2, DType::U32, &Device::Cpu).unwrap();
        assert!(c.all_reduce(&[u], Op::Sum).is_err());
    }

    #[test]
    fn timeout_values() {
        assert_eq!(timeout_from(None).unwrap(), Some(DEFAULT_TIMEOUT));
        assert_eq!(timeout_from(Some("0")).unwrap(), None);
        assert_eq!(
            timeout_from(Some("2.5")).unwrap(),
            Some(Duration::from_millis(2500))
        );
        for bad in ["", "-1", "ten", "inf", "NaN"] {
            let e = timeout_from(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(TIMEOUT_VAR), "{e}");
        }
    }

    #[test]
    fn init_for_one_process_is_local_and_several_need_the_feature() {
        let c = init(&Launch::single()).unwrap();
        assert_eq!((c.rank(), c.world_size()), (0, 1));
        #[cfg(not(feature = "mpi"))]
        {
            let mut env = std::collections::BTreeMap::new();
            env.insert("OMPI_COMM_WORLD_RANK".to_string(), "0".to_string());
            env.insert("OMPI_COMM_WORLD_SIZE".to_string(), "2".to_string());
            let launch = crate::env::resolve(&env).unwrap();
            let e = init(&launch).err().unwrap().to_string();
            assert!(
                e.starts_with("world size 2 (from OMPI_COMM_WORLD_SIZE) needs the `mpi` feature")
                    && e.contains("cargo build --release -p rlvr --features mpi"),
                "{e}"
            );
        }
    }

    #[test]
    fn shared_comm_forwards() {
        let mut a = SharedComm::new(Box::new(LocalComm));
        let mut b = a.clone();
        assert_eq!((a.rank(), b.world_size()), (0, 1));
        assert_eq!(a.all_gather_bytes(b"1").unwrap(), [b"1".to_vec()]);
        b.barrier().unwrap();
    }
}
