//! `NcclComm`: the tensor collectives over NVIDIA's NCCL (feature `nccl`), for ranks on GPUs.
//!
//! Tensors on the communicator's CUDA device are reduced, broadcast, gathered and scattered by
//! NCCL on the device's own stream (candle's stream of that device: a collective is ordered after
//! the kernels that wrote its inputs and before those that read its outputs, with no host
//! synchronisation). Host values (`all_reduce_f64`, the byte collectives, the barrier) and any
//! tensor not on that device go to the host communicator it was built with: `MpiComm` under
//! `mpirun`, [`LocalComm`](super::LocalComm) at a world size of 1. The NCCL group is bootstrapped
//! through that host communicator: rank 0 makes the unique id and broadcasts its 128 bytes.
//!
//! Numerics: bf16 and f16 tensors are widened to f32 on the device, reduced in f32 and rounded
//! once (the [`Op`] contract; NCCL's own bf16 sum rounds at every hop). NCCL's sum order is its
//! ring's, not rank order: at W = 2 a sum is one commutative addition, so the bits equal the other
//! engines'; above 2 they agree within rounding. NCCL's algorithm choice depends on the topology
//! and the message size, so for bit-identical reruns on one machine set `NCCL_ALGO` and
//! `NCCL_PROTO` (e.g. `Ring`, `Simple`) as torch's determinism notes advise.
//!
//! Linking: candle links cudarc dynamically, so a binary built with `nccl` needs `libnccl.so.2`
//! at start (PyPI's `nvidia-nccl-cu13` wheel holds it: put its `nvidia/nccl/lib` on
//! `LD_LIBRARY_PATH`). [`NcclComm::version`] asks the library its version before any collective.

#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{CpuStorage, DType, Device, InplaceOp1, InplaceOp2, Layout, Tensor};

use super::{check_gather_shape, check_root, check_scatter_shape, Communicator, Op};
use crate::buf::{check_copyable, check_reducible};
use crate::{DistError, Result};

/// NCCL over the ranks' GPUs, with a host communicator for host values (module docs).
pub struct NcclComm {
    comm: Comm,
    device: Device,
    host: Box<dyn Communicator>,
}

// The NCCL communicator handle is a raw pointer that NCCL allows to be used from any one thread
// at a time; `Communicator` methods take `&mut self`, so calls never overlap.
unsafe impl Send for NcclComm {}

fn nccl_err(op: &'static str, e: impl std::fmt::Debug) -> DistError {
    DistError::Invalid {
        op,
        detail: format!("NCCL: {e:?}"),
    }
}

fn reduce_op(op: Op) -> ReduceOp {
    match op {
        Op::Sum => ReduceOp::Sum,
        Op::Max => ReduceOp::Max,
        Op::Min => ReduceOp::Min,
    }
}

impl NcclComm {
    /// The NCCL library's version as `major.minor.patch` (e.g. `2.27.3`).
    ///
    /// # Errors
    /// NCCL's own error, if the library answers with one.
    pub fn version() -> Result<String> {
        let v = candle_core::cuda_backend::cudarc::nccl::result::get_nccl_version()
            .map_err(|e| nccl_err("nccl version", e))?;
        // NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch.
        Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }

    /// One rank of an NCCL group on `device` (a `cuda:N` device), with the group's rank and size
    /// taken from `host`, which also carries the unique id from rank 0 and every host collective.
    ///
    /// Every rank must call it together (it is itself a collective).
    ///
    /// # Errors
    /// `device` not a CUDA device; NCCL's initialisation errors; the host broadcast's errors.
    pub fn new(device: &Device, mut host: Box<dyn Communicator>) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(DistError::Invalid {
                op: "nccl init",
                detail: format!("needs a CUDA device, got {device:?}"),
            });
        };
        let (rank, world) = (host.rank(), host.world_size());
        let mut bytes = if rank == 0 {
            let id = Id::new().map_err(|e| nccl_err("nccl unique id", e))?;
            id.internal().iter().map(|&c| c as u8).collect()
        } else {
            vec![0u8; 128]
        };
        host.broadcast_bytes(&mut bytes, 0)?;
        if bytes.len() != 128 {
            return Err(DistError::Mismatch {
                op: "nccl init",
                detail: format!("unique id of {} bytes, expected 128", bytes.len()),
            });
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(&bytes) {
            *d = *s as std::ffi::c_char;
        }
        let comm = Comm::from_rank(cuda.cuda_stream(), rank, world, Id::uninit(internal))
            .map_err(|e| nccl_err("nccl init", e))?;
        Ok(NcclComm {
            comm,
            device: device.clone(),
            host,
        })
    }

    fn on_device(&self, t: &Tensor) -> bool {
        t.device().same_device(&self.device)
    }
}

fn contiguous_range(op: &'static str, l: &Layout) -> Result<std::ops::Range<usize>> {
    l.contiguous_offsets()
        .map(|(a, b)| a..b)
        .ok_or(DistError::Invalid {
            op,
            detail: "needs a contiguous tensor".into(),
        })
}

/// Runs `$call` with `$t` bound to the element type of `$dtype` (the dtypes NCCL carries), as a
/// candle result.
macro_rules! by_dtype {
    ($dtype:expr, $t:ident => $call:expr) => {{
        let r = match $dtype {
            DType::F32 => {
                type $t = f32;
                $call
            }
            DType::F64 => {
                type $t = f64;
                $call
            }
            DType::BF16 => {
                type $t = half::bf16;
                $call
            }
            DType::F16 => {
                type $t = half::f16;
                $call
            }
            DType::U8 => {
                type $t = u8;
                $call
            }
            DType::U32 => {
                type $t = u32;
                $call
            }
            DType::I64 => {
                type $t = i64;
                $call
            }
            other => candle_core::bail!("nccl: unsupported dtype {other:?}"),
        };
        r.map_err(|e| candle_core::Error::Msg(e.to_string()))
    }};
}

/// What an in-place NCCL call does to one device buffer.
#[derive(Clone, Copy)]
enum InPlace {
    Reduce(Op),
    Broadcast(usize),
}

struct InPlaceOp<'a> {
    comm: &'a Comm,
    what: InPlace,
}

impl InPlaceOp<'_> {
    fn run<T: CudaDType + NcclType>(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        let r = contiguous_range("nccl", l)?;
        let slice = s.as_cuda_slice_mut::<T>()?;
        let mut view = slice.slice_mut(r);
        match self.what {
            InPlace::Reduce(op) => self
                .comm
                .all_reduce_in_place(&mut view, &reduce_op(op))
                .map_err(|e| nccl_err("all_reduce", e))?,
            InPlace::Broadcast(root) => self
                .comm
                .broadcast_in_place(&mut view, root as i32)
                .map_err(|e| nccl_err("broadcast", e))?,
        };
        Ok(())
    }
}

impl InplaceOp1 for InPlaceOp<'_> {
    fn name(&self) -> &'static str {
        "nccl-in-place"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("nccl: a CPU tensor reached the device path")
    }
    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        by_dtype!(s.dtype(), T => self.run::<T>(s, l))
    }
}

/// Out-of-place NCCL calls: the destination tensor is written from a source tensor.
#[derive(Clone, Copy)]
enum OutOfPlace {
    Gather,
    Scatter(Op),
}

struct OutOfPlaceOp<'a> {
    comm: &'a Comm,
    what: OutOfPlace,
}

impl OutOfPlaceOp<'_> {
    fn run<T: CudaDType + NcclType>(
        &self,
        dst: &mut CudaStorage,
        dl: &Layout,
        src: &CudaStorage,
        sl: &Layout,
    ) -> Result<()> {
        let (dr, sr) = (contiguous_range("nccl", dl)?, contiguous_range("nccl", sl)?);
        let s = src.as_cuda_slice::<T>()?.slice(sr);
        let d = dst.as_cuda_slice_mut::<T>()?;
        let mut d = d.slice_mut(dr);
        match self.what {
            OutOfPlace::Gather => self
                .comm
                .all_gather(&s, &mut d)
                .map_err(|e| nccl_err("all_gather", e))?,
            OutOfPlace::Scatter(op) => self
                .comm
                .reduce_scatter(&s, &mut d, &reduce_op(op))
                .map_err(|e| nccl_err("reduce_scatter", e))?,
        };
        Ok(())
    }
}

impl InplaceOp2 for OutOfPlaceOp<'_> {
    fn name(&self) -> &'static str {
        "nccl-out-of-place"
    }
    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        candle_core::bail!("nccl: a CPU tensor reached the device path")
    }
    fn cuda_fwd(
        &self,
        d: &mut CudaStorage,
        dl: &Layout,
        s: &CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        by_dtype!(d.dtype(), T => self.run::<T>(d, dl, s, sl))
    }
}

/// Half-precision tensors are reduced in f32 (module docs).
fn widened(t: &Tensor) -> bool {
    matches!(t.dtype(), DType::BF16 | DType::F16)
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.host.rank()
    }

    fn world_size(&self) -> usize {
        self.host.world_size()
    }
    fn separate_processes(&self) -> bool {
        true
    }

    fn all_reduce(&mut self, bufs: &[Tensor], op: Op) -> Result<()> {
        let (dev, host): (Vec<Tensor>, Vec<Tensor>) =
            bufs.iter().cloned().partition(|t| self.on_device(t));
        if !host.is_empty() {
            self.host.all_reduce(&host, op)?;
        }
        for t in &dev {
            check_reducible("all_reduce", t.dtype())?;
            if t.elem_count() == 0 {
                continue;
            }
            let run = InPlaceOp {
                comm: &self.comm,
                what: InPlace::Reduce(op),
            };
            if widened(t) {
                let wide = t.to_dtype(DType::F32)?;
                wide.inplace_op1(&run)?;
                let back = wide.to_dtype(t.dtype())?;
                // In place into the caller's storage (its views see the result).
                t.flatten_all()?.slice_set(&back.flatten_all()?, 0, 0)?;
            } else {
                t.inplace_op1(&run)?;
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, bufs: &[Tensor], root: usize) -> Result<()> {
        check_root("broadcast", root, self.world_size())?;
        let (dev, host): (Vec<Tensor>, Vec<Tensor>) =
            bufs.iter().cloned().partition(|t| self.on_device(t));
        if !host.is_empty() {
            self.host.broadcast(&host, root)?;
        }
        for t in &dev {
            check_copyable("broadcast", t.dtype())?;
            if t.elem_count() == 0 {
                continue;
            }
            t.inplace_op1(&InPlaceOp {
                comm: &self.comm,
                what: InPlace::Broadcast(root),
            })?;
        }
        Ok(())
    }

    fn all_gather(&mut self, shard: &Tensor) -> Result<Tensor> {
        if !self.on_device(shard) {
            return self.host.all_gather(shard);
        }
        check_gather_shape(shard)?;
        check_copyable("all_gather", shard.dtype())?;
        // NCCL gathers equal parts; the trait allows uneven leading sizes, so every rank's shape
        // is gathered first (host), shards are padded to the largest, and the padding is cut out.
        let dims = shard.dims().to_vec();
        let sig: Vec<u8> = dims
            .iter()
            .flat_map(|&d| (d as u64).to_le_bytes())
            .collect();
        let all = self.host.all_gather_bytes(&sig)?;
        let mut sizes = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            let d: Vec<usize> = b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
                .collect();
            if d.len() != dims.len() || d[1..] != dims[1..] {
                return Err(DistError::Mismatch {
                    op: "all_gather",
                    detail: format!("rank {r} has shape {d:?}, this rank {dims:?} (only the first dimension may differ)"),
                });
            }
            sizes.push(d[0]);
        }
        let max = sizes.iter().copied().max().unwrap_or(0);
        let shard = if dims[0] < max {
            let mut pad = dims.clone();
            pad[0] = max - dims[0];
            let zeros = Tensor::zeros(pad, shard.dtype(), &self.device)?;
            Tensor::cat(&[shard, &zeros], 0)?
        } else {
            shard.contiguous()?
        };
        let mut out_dims = dims.clone();
        out_dims[0] = max * self.world_size();
        let out = Tensor::zeros(out_dims, shard.dtype(), &self.device)?;
        if max > 0 {
            out.inplace_op2(
                &shard,
                &OutOfPlaceOp {
                    comm: &self.comm,
                    what: OutOfPlace::Gather,
                },
            )?;
        }
        if sizes.iter().all(|&n| n == max) {
            return Ok(out);
        }
        let parts = sizes
            .iter()
            .enumerate()
            .map(|(r, &n)| out.narrow(0, r * max, n))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?)
    }

    fn reduce_scatter(&mut self, flat: &Tensor, op: Op) -> Result<Tensor> {
        if !self.on_device(flat) {
            return self.host.reduce_scatter(flat, op);
        }
        let part = check_scatter_shape(flat, self.world_size())?;
        check_reducible("reduce_scatter", flat.dtype())?;
        let src = if widened(flat) {
            flat.to_dtype(DType::F32)?
        } else {
            flat.contiguous()?
        };
        let mut dims = src.dims().to_vec();
        dims[0] = part;
        let out = Tensor::zeros(dims, src.dtype(), &self.device)?;
        out.inplace_op2(
            &src,
            &OutOfPlaceOp {
                comm: &self.comm,
                what: OutOfPlace::Scatter(op),
            },
        )?;
        Ok(if widened(flat) {
            out.to_dtype(flat.dtype())?
        } else {
            out
        })
    }

    fn all_reduce_f64(&mut self, xs: &mut [f64], op: Op) -> Result<()> {
        self.host.all_reduce_f64(xs, op)
    }

    fn all_gather_bytes(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.host.all_gather_bytes(mine)
    }

    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        self.host.broadcast_bytes(buf, root)
    }

    fn barrier(&mut self) -> Result<()> {
        // The host barrier alone would let a rank leave with NCCL work still queued: wait for
        // this rank's stream first.
        self.device.synchronize()?;
        self.host.barrier()
    }
}
