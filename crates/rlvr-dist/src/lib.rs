//! `rlvr-dist`: data-parallel collectives for rlvr.
//!
//! - [`env`]: rank, world size and local rank from the launcher's environment (`mpirun`,
//!   `srun --mpi=pmix`, torchrun, SLURM, `RLVR_*`), and the `cuda` → `cuda:{local rank}` rule;
//!   pure functions.
//! - [`Communicator`]: in-place all-reduce (sum, max, min) and broadcast over candle tensors,
//!   all-gather and reduce-scatter, small host collectives (f64 values, bytes), a barrier.
//!   Implementations: [`LocalComm`] (one process, the identity: the default), [`ThreadComm`]
//!   (threads of one process, tests only), `MpiComm` (feature `mpi`), `NcclComm` (feature `nccl`:
//!   GPU tensors over NCCL, host values over one of the others), chosen by [`init_on`]'s [`Backend`].
//! - [`DistReduce`]: the optimizer's gradient reduction (a SUM all-reduce of every parameter's
//!   gradient in fixed buckets) together with the non-finite flag (an OR), so that every rank
//!   makes the same skip decision.
//! - [`ZeroReduce`] ([`zero`]): ZeRO stage 1, the optimizer state sharded by whole parameters:
//!   gradients reduce-scattered to their owners, the global norm summed over the shards, each
//!   owner's new weights broadcast, state gathered to rank 0 for checkpoints.
//! - Failure: every collective has a timeout ([`comm::TIMEOUT_VAR`], default
//!   [`comm::DEFAULT_TIMEOUT`] = 600 s). On MPI a rank that times out asks its peers which
//!   collective they are in, prints one line naming the ranks that never arrived, and aborts the
//!   job; a rank that exits is reported by `mpirun`, which ends the job at once.
//! - [`watch`]: runs a launcher with a deadline for tests and benchmarks (Open MPI's `mpirun`
//!   can outlive its ranks after an abort).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use rlvr_dist::{Communicator, Op, ThreadComm};
//! // Two ranks as two threads: rank r contributes [r, 10 r]; the sum lands on both, in place.
//! let out = ThreadComm::run(2, |mut c| {
//!     let r = c.rank() as f32;
//!     let t = Tensor::new(&[r, 10.0 * r], &Device::Cpu).unwrap();
//!     c.all_reduce(std::slice::from_ref(&t), Op::Sum).unwrap();
//!     t.to_vec1::<f32>().unwrap()
//! });
//! assert_eq!(out, [[1.0, 10.0], [1.0, 10.0]]);
//! ```

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod buf;
pub mod comm;
pub mod env;
mod error;
pub mod reduce;
#[cfg(unix)]
pub mod watch;
pub mod zero;

#[cfg(feature = "mpi")]
pub use comm::MpiComm;
#[cfg(feature = "nccl")]
pub use comm::NcclComm;
pub use comm::{
    init, init_on, init_with_timeout, Backend, Communicator, LocalComm, Op, SharedComm, ThreadComm,
    NCCL_BUILT,
};
pub use error::{DistError, Result};
pub use reduce::DistReduce;
pub use zero::ZeroReduce;
