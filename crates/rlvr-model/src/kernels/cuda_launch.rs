//! What the fused layer ops on CUDA share (feature `cuda`): zeroed output storages, the
//! tensors' CUDA storages, and one launch of a family's kernel on candle's stream, taking the
//! variant's aligned twin (`_a16`) when its plan accepts the launch's shapes and addresses
//! ([`families::pick`]), as the launch recorder records it.

use candle_core::cuda_backend::CudaDevice;
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, DType, Layout, Shape, Storage, Tensor};
use rlvr_kernels::triton::cuda as tc;
use rlvr_kernels::triton::{self, families, DeviceBuffer, KernelEntry, LaunchPlan, Manifest};

/// The kernels' name of `dtype` (f32 or bf16). Errors: any other dtype.
pub(super) fn kernel_dtype(dtype: DType, what: &str) -> candle_core::Result<triton::DType> {
    match dtype {
        DType::F32 => Ok(triton::DType::Fp32),
        DType::BF16 => Ok(triton::DType::Bf16),
        other => candle_core::bail!("fused {what}: {other:?} (the kernels are f32 and bf16)"),
    }
}

/// Zeros of `dtype` (`len` elements) as a CUDA storage on `dev`.
pub(super) fn zeros(
    dev: &CudaDevice,
    dtype: DType,
    len: usize,
) -> candle_core::Result<CudaStorage> {
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f32>(len)?, dev.clone()),
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<half::bf16>(len)?, dev.clone())
        }
        other => candle_core::bail!("fused kernels: no {other:?} buffers"),
    })
}

/// A tensor over `storage` of `shape`, without a graph (an op's output or gradient).
pub(super) fn tensor(storage: CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// Fails unless `l` is contiguous (the kernels index rows densely from the start offset).
pub(super) fn check(l: &Layout, what: &str) -> candle_core::Result<()> {
    if !l.is_contiguous() {
        candle_core::bail!("fused kernels: {what} is not contiguous");
    }
    Ok(())
}

/// An output of a launch: a storage the kernel writes from element `offset` on, under `name`.
pub(super) struct Out<'a> {
    pub name: &'a str,
    pub storage: &'a mut CudaStorage,
    /// Further names for views into the same storage at these element offsets (the fused
    /// residual add's `h_out` and `y` in one `[2, rows, cols]` output).
    pub views: &'a [(&'a str, usize)],
}

/// Launches variant `name` (or its aligned twin) of a family whose plan `build` makes at this
/// launch's shapes, reading `inputs` and writing `outputs`, each by its buffer name, on `dev`'s
/// stream. cudarc's guards order the launch after the buffers' pending work and record it.
/// The kernels index every buffer densely from its start offset, so a strided input is refused
/// here rather than read wrongly (the outputs are whole storages this module allocated).
///
/// Errors: an input not contiguous, the manifest, the device's target, the plan builder's
/// refusal, the driver's.
pub(super) fn launch(
    dev: &CudaDevice,
    name: &str,
    build: impl Fn(&KernelEntry) -> triton::Result<LaunchPlan>,
    inputs: &[(&str, &CudaStorage, &Layout)],
    outputs: &mut [Out<'_>],
) -> candle_core::Result<()> {
    let m = Manifest::committed()?;
    let stream = dev.cuda_stream();
    let target = tc::device_target(&stream, m)?;
    let mut bufs: Vec<(&str, DeviceBuffer)> = Vec::new();
    let mut guards = Vec::new();
    for &(n, s, lay) in inputs {
        check(lay, n)?;
        let (b, g) = tc::candle_buffer(s, lay, &stream)?;
        bufs.push((n, b));
        guards.push(g);
    }
    for o in outputs.iter_mut() {
        let lay = Layout::contiguous(storage_len(o.storage));
        let (b, g) = tc::candle_buffer_mut(o.storage, &lay, &stream)?;
        for &(v, at) in o.views {
            bufs.push((
                v,
                DeviceBuffer {
                    ptr: b.ptr + (at * b.dtype.size()) as u64,
                    dtype: b.dtype,
                    len: b.len.saturating_sub(at),
                },
            ));
        }
        bufs.push((o.name, b));
        guards.push(g);
    }
    let plan = families::pick(m, name, target, Some(&bufs), build)?;
    tc::launch(&stream, m, &plan, &bufs)?;
    drop(guards);
    Ok(())
}

fn storage_len(s: &CudaStorage) -> usize {
    use candle_core::cuda_backend::CudaStorageSlice as S;
    match &s.slice {
        S::F32(x) => x.len(),
        S::BF16(x) => x.len(),
        S::I32(x) => x.len(),
        _ => 0,
    }
}

/// Runs `f` over the CUDA storages and layouts of `ts` (read locks held meanwhile).
///
/// Errors: a tensor not on CUDA.
pub(super) fn with_cuda<R>(
    ts: &[&Tensor],
    f: impl FnOnce(&[(&CudaStorage, &Layout)]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let locked: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut v = Vec::with_capacity(locked.len());
    for (s, l) in &locked {
        match &**s {
            Storage::Cuda(c) => v.push((c, *l)),
            _ => candle_core::bail!("fused kernels: a tensor is not on CUDA"),
        }
    }
    f(&v)
}
