//! The CUDA launcher (feature `cuda`): runs a [`LaunchPlan`] on a cudarc stream, the one candle's
//! `CudaDevice` owns, with the committed cubins.
//!
//! Per launch: the manifest entry is looked up and checked launchable, the plan is checked
//! against it again, the device's compute capability must select the plan's target and its
//! opt-in shared memory per block must hold the entry's; the function is loaded once per CUDA
//! context (`cuModuleLoadData` of the embedded cubin, then `cuModuleGetFunction`) and cached,
//! with `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` set when it needs more than 48 KiB;
//! then the arguments are passed in the plan's order, the two scratch pointers as null.
//!
//! cudarc is candle's (`candle_core::cuda_backend::cudarc`), so its features stay exactly as
//! candle sets them. The code that touches cudarc is this file only; under the `cudarc-check`
//! feature it type-checks against cudarc alone, without candle's CUDA backend (whose build
//! needs nvcc). `candle_buffer` (feature `cuda` only) maps candle storage to a
//! [`DeviceBuffer`].
//!
//! In a candle custom op's `cuda_fwd` (the wiring of issue 44's item 6), per launch:
//! 1. `let stream = storage.device.cuda_stream();` and `let m = Manifest::committed()?;`
//! 2. `let target = device_target(&stream, m)?;` (refuses GPUs without shipped code);
//! 3. the entry, e.g. `m.entry(&families::rmsnorm::variant("fwd", dtype, cols)?, target)?`,
//!    and its plan, `families::rmsnorm::plan(entry, &shapes)?` (grid and arguments);
//! 4. the outputs allocated on the device, then one `candle_buffer` (inputs) or
//!    `candle_buffer_mut` (outputs, in-place buffers) per buffer name of the plan
//!    ([`LaunchPlan::buffers`]), plus any descriptors the family asks for (attention's);
//! 5. `launch(&stream, m, &plan, &[("x", x), ...])?`, then drop the guards.
//!
//! Unchecked until a GPU runs it: only type-checked (`scripts/cuda-check.sh`, or the
//! `cudarc-check` feature); the plans themselves are checked on the CPU by the ABI test and the
//! launch recorder's replay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

#[cfg(feature = "cuda")]
use candle_core::cuda_backend::cudarc;
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

#[cfg(feature = "cuda")]
use super::manifest::DType;
use super::manifest::{KernelEntry, Manifest, CUBINS};
pub use super::plan::DeviceBuffer;
use super::plan::{LaunchPlan, RawArg};
use super::{Result, TritonError};

/// Dynamic shared memory a kernel may use without opting in, bytes.
pub const DEFAULT_DYNAMIC_SHARED_BYTES: u32 = 48 * 1024;

fn driver(what: &str, e: impl std::fmt::Debug) -> TritonError {
    TritonError::Driver(format!("{what}: {e:?}"))
}

type FunctionCache = Mutex<HashMap<(usize, String, super::Target), CudaFunction>>;

/// The loaded function of `entry` in `ctx`, loading its module on first use.
fn function(ctx: &Arc<CudaContext>, entry: &KernelEntry) -> Result<CudaFunction> {
    static CACHE: OnceLock<FunctionCache> = OnceLock::new();
    // A cached function holds its module, which holds the context: the address stays unique.
    let key = (Arc::as_ptr(ctx) as usize, entry.name.clone(), entry.target);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(f) = cache.lock().unwrap().get(&key) {
        return Ok(f.clone());
    }
    let Some((_, cubin)) = CUBINS.iter().find(|(p, _)| *p == entry.cubin) else {
        return Err(TritonError::Manifest(format!(
            "{} ({}): kernels/build/{} was not embedded when rlvr-kernels was built",
            entry.name, entry.target, entry.cubin
        )));
    };
    let module = (ctx.load_module(Ptx::from_binary(cubin.to_vec())))
        .map_err(|e| driver(&format!("loading {}", entry.cubin), e))?;
    let f = (module.load_function(&entry.entry)).map_err(|e| {
        driver(
            &format!("{} has no function {}", entry.cubin, entry.entry),
            e,
        )
    })?;
    if entry.shared_bytes > DEFAULT_DYNAMIC_SHARED_BYTES {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            entry.shared_bytes as i32,
        )
        .map_err(|e| driver(&format!("{}: dynamic shared memory", entry.name), e))?;
    }
    cache.lock().unwrap().insert(key, f.clone());
    Ok(f)
}

/// The target whose kernels run on `stream`'s device, among those `manifest` ships: what the
/// plan builders need before they pick an entry ([`Manifest::entry`]).
///
/// Errors: [`TritonError::Capability`] naming the device's compute capability and the shipped
/// targets; a driver error.
pub fn device_target(stream: &CudaStream, manifest: &Manifest) -> Result<super::Target> {
    // cudarc returns (and clears) an error an earlier asynchronous operation left pending before
    // this query's own: say so, since the query itself rarely fails.
    let (major, minor) = (stream.context().compute_capability()).map_err(|e| {
        driver(
            "querying the compute capability (or a CUDA error pending from an earlier \
             operation: rerun with RLVR_CUDA_SYNC=1 to name the launch that failed)",
            e,
        )
    })?;
    manifest.target_for(major as u32, minor as u32)
}

/// `stream`'s device's target among `manifest`'s ([`device_target`]) and its opt-in shared memory
/// per block (bytes), queried once per device and manifest: a launch's host time is what a decode
/// step without a CUDA graph pays per kernel.
fn device_facts(stream: &CudaStream, manifest: &Manifest) -> Result<(super::Target, u32)> {
    type Facts = Mutex<HashMap<(usize, usize), (super::Target, u32)>>;
    static FACTS: OnceLock<Facts> = OnceLock::new();
    let ctx = stream.context();
    let key = (ctx.ordinal(), manifest as *const Manifest as usize);
    let facts = FACTS.get_or_init(Default::default);
    if let Some(f) = facts.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(*f);
    }
    let target = device_target(stream, manifest)?;
    let smem = (ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
    .map_err(|e| driver("shared memory limit", e))?;
    let f = (target, smem.max(0) as u32);
    facts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, f);
    Ok(f)
}

/// Launches `plan` on `stream` with the compiled kernels of `manifest` (normally
/// [`Manifest::committed`]); `buffers` gives the device buffer of every buffer name the plan's
/// pointers use. Asynchronous: returns once the launch is queued.
///
/// The caller keeps the buffers alive and unmoved until the kernel has run (candle's storage
/// and the guards of `candle_buffer` do) and gives buffers at least as large as the plan's
/// shapes: the plan builders derive grid and strides from those shapes, and the launch
/// recorder's replay tests them.
///
/// Errors: the entry's refusals ([`Manifest::entry`]), a plan not matching its entry, a device
/// whose compute capability selects another target ([`TritonError::Capability`] when none),
/// shared memory over the device's limit, a buffer missing, of another dtype or shorter than a
/// pointer's offset, and any driver error ([`TritonError::Driver`]).
pub fn launch(
    stream: &Arc<CudaStream>,
    manifest: &Manifest,
    plan: &LaunchPlan,
    buffers: &[(&str, DeviceBuffer)],
) -> Result<()> {
    let entry = manifest.entry(&plan.name, plan.target)?;
    plan.check_against(entry)?;
    let ctx = stream.context();
    let (target, smem) = device_facts(stream, manifest)?;
    if target != plan.target {
        return Err(TritonError::Plan {
            name: plan.name.clone(),
            why: format!("planned for {}, but this device runs {target}", plan.target),
        });
    }
    entry.check_shared_limit(smem)?;
    let values = plan.resolve(buffers)?;
    let func = function(ctx, entry)?;
    let mut b = stream.launch_builder(&func);
    for v in &values {
        match v {
            RawArg::U64(x) => b.arg(x),
            RawArg::I32(x) => b.arg(x),
            RawArg::I64(x) => b.arg(x),
            RawArg::F32(x) => b.arg(x),
        };
    }
    let cfg = LaunchConfig {
        grid_dim: (plan.grid[0], plan.grid[1], plan.grid[2]),
        block_dim: (plan.block[0], plan.block[1], plan.block[2]),
        shared_mem_bytes: plan.shared_bytes,
    };
    // SAFETY: the arguments are the entry's parameters in order, each of the kind and width
    // its PTX declares (the plan was checked against the manifest above, and the manifest
    // against the PTX by the ABI test, `ptx::check_abi`); the values live in `values` until
    // `launch` returns (the driver copies them); the pointers address live buffers of the
    // plan's dtype (checked above) whose sizes the caller vouches for (see the doc comment).
    unsafe { b.launch(cfg) }.map_err(|e| driver(&format!("launching {}", plan.name), e))?;
    super::count_launch();
    if sync_each_launch() {
        debug_sync(stream.cu_stream(), || {
            let bufs: Vec<String> = (buffers.iter())
                .map(|(n, b)| format!("{n} {:#x}+{} {}", b.ptr, b.len, b.dtype))
                .collect();
            format!(
                "{} (grid {:?}, block {:?}, {} bytes of shared memory; buffers {})",
                plan.name,
                plan.grid,
                plan.block,
                plan.shared_bytes,
                bufs.join(", ")
            )
        })?;
    }
    Ok(())
}

/// The environment variable that makes every Triton launch and fused-step GEMM synchronise and
/// report a failure as its own (`RLVR_CUDA_SYNC=1`): launches are asynchronous, so a kernel's
/// fault otherwise surfaces at a later operation, under that operation's name. Slow: for
/// finding which launch fails (as `CUDA_LAUNCH_BLOCKING=1` does for CUDA itself). A launch
/// inside a CUDA-graph capture is not synchronised (a capture forbids it); the replay is.
pub const SYNC_ENV: &str = "RLVR_CUDA_SYNC";

fn sync_each_launch() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(SYNC_ENV).is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Under [`SYNC_ENV`]: waits for `stream` (unless it is capturing a graph) and names what was
/// just queued (`what`) when it failed.
fn debug_sync(stream: cudarc::driver::sys::CUstream, what: impl FnOnce() -> String) -> Result<()> {
    use cudarc::driver::sys::{self as ds, CUresult, CUstreamCaptureStatus as S};
    let mut status = std::mem::MaybeUninit::uninit();
    // SAFETY: the stream is live (its owner is in the middle of a call on it); the driver
    // writes the status, read only when the call succeeded.
    let capturing = unsafe {
        ds::cuStreamIsCapturing(stream, status.as_mut_ptr()) == CUresult::CUDA_SUCCESS
            && status.assume_init() != S::CU_STREAM_CAPTURE_STATUS_NONE
    };
    if capturing {
        return Ok(());
    }
    // SAFETY: as above.
    match unsafe { ds::cuStreamSynchronize(stream) } {
        CUresult::CUDA_SUCCESS => Ok(()),
        e => Err(TritonError::Driver(format!(
            "{} failed when it ran ({SYNC_ENV}): {e:?}",
            what()
        ))),
    }
}

/// The [`DeviceBuffer`] of a candle CUDA storage the kernel only reads, seen through `layout`
/// (its start offset applied), with cudarc's guard that orders the launch after the storage's
/// pending writes and records the read; drop the guard after [`launch`]. `stream` is the
/// storage device's (`CudaDevice::cuda_stream`).
///
/// Errors: a dtype the kernels never take (the f8/f6/f4 formats).
#[cfg(feature = "cuda")]
pub fn candle_buffer<'a>(
    storage: &'a candle_core::CudaStorage,
    layout: &candle_core::Layout,
    stream: &'a CudaStream,
) -> Result<(DeviceBuffer, cudarc::driver::SyncOnDrop<'a>)> {
    use candle_core::cuda_backend::CudaStorageSlice as S;
    use cudarc::driver::DevicePtr;
    let start = layout.start_offset();
    macro_rules! view {
        ($s:expr, $d:expr) => {{
            let (ptr, guard) = $s.device_ptr(stream);
            let len = $s.len().saturating_sub(start);
            (buffer(ptr, start, $d, len), guard)
        }};
    }
    Ok(match &storage.slice {
        S::F32(s) => view!(s, DType::Fp32),
        S::BF16(s) => view!(s, DType::Bf16),
        S::F16(s) => view!(s, DType::Fp16),
        S::F64(s) => view!(s, DType::Fp64),
        S::U8(s) => view!(s, DType::U8),
        S::U32(s) => view!(s, DType::U32),
        S::I16(s) => view!(s, DType::I16),
        S::I32(s) => view!(s, DType::I32),
        S::I64(s) => view!(s, DType::I64),
        _ => return Err(unsupported_storage()),
    })
}

/// [`candle_buffer`] for a storage the kernel writes (an output, or an in-place update): the
/// guard also records the write, so later readers on other streams wait for the kernel.
#[cfg(feature = "cuda")]
pub fn candle_buffer_mut<'a>(
    storage: &'a mut candle_core::CudaStorage,
    layout: &candle_core::Layout,
    stream: &'a CudaStream,
) -> Result<(DeviceBuffer, cudarc::driver::SyncOnDrop<'a>)> {
    use candle_core::cuda_backend::CudaStorageSlice as S;
    use cudarc::driver::DevicePtrMut;
    let start = layout.start_offset();
    macro_rules! view {
        ($s:expr, $d:expr) => {{
            let len = $s.len().saturating_sub(start);
            let (ptr, guard) = $s.device_ptr_mut(stream);
            (buffer(ptr, start, $d, len), guard)
        }};
    }
    Ok(match &mut storage.slice {
        S::F32(s) => view!(s, DType::Fp32),
        S::BF16(s) => view!(s, DType::Bf16),
        S::F16(s) => view!(s, DType::Fp16),
        S::F64(s) => view!(s, DType::Fp64),
        S::U8(s) => view!(s, DType::U8),
        S::U32(s) => view!(s, DType::U32),
        S::I16(s) => view!(s, DType::I16),
        S::I32(s) => view!(s, DType::I32),
        S::I64(s) => view!(s, DType::I64),
        _ => return Err(unsupported_storage()),
    })
}

#[cfg(feature = "cuda")]
fn buffer(ptr: u64, start: usize, dtype: DType, len: usize) -> DeviceBuffer {
    DeviceBuffer {
        ptr: ptr + (start * dtype.size()) as u64,
        dtype,
        len,
    }
}

/// Bytes of the cuBLAS workspace [`prepare_device`] gives candle's handle (NVIDIA's advice for
/// Hopper is 32 MiB; smaller GPUs need less).
#[cfg(feature = "cuda")]
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Sets up a freshly opened device for rlvr's use of it, before its first buffer: `stream` is
/// candle's one stream, `blas` candle's cuBLAS handle on it.
///
/// 1. The device's memory pool keeps what is freed: cudarc allocates stream-ordered
///    (`cuMemAllocAsync`) from the device's current pool, whose release threshold is 0 by
///    default, so every synchronisation would hand the freed memory back to the driver and the
///    next step's allocations would map it again. The threshold becomes `u64::MAX`, as a caching
///    allocator behaves (PyTorch's keeps its blocks too); `cuMemPoolTrimTo` could give it back.
/// 2. cuBLAS gets a workspace of its own ([`CUBLAS_WORKSPACE_BYTES`], allocated once and kept for
///    the process): without one, cuBLAS takes its workspace from the stream-ordered allocator
///    while a CUDA graph is captured, and may then choose other algorithms than in an eager step
///    of the same shapes, which the fused decode step's graphs on/off bit-identity needs equal
///    (cuBLAS documentation, "CUDA Graphs Support").
///
/// Errors: the driver's or cuBLAS's error, named.
#[cfg(feature = "cuda")]
pub fn prepare_device(stream: &Arc<CudaStream>, blas: &cudarc::cublas::CudaBlas) -> Result<()> {
    use cudarc::driver::result as dr;
    use cudarc::driver::sys::CUmemPool_attribute;
    use cudarc::driver::DevicePtr;
    let ctx = stream.context();
    ctx.bind_to_thread()
        .map_err(|e| driver("binding the context", e))?;
    // SAFETY: the pool is the device's current one (a valid handle from the driver); the value
    // points to a u64, the type of CU_MEMPOOL_ATTR_RELEASE_THRESHOLD.
    unsafe {
        let pool = dr::device::get_mem_pool(ctx.cu_device())
            .map_err(|e| driver("the device's memory pool", e))?;
        let mut keep = u64::MAX;
        dr::mem_pool::set_attribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        )
        .map_err(|e| driver("the memory pool's release threshold", e))?;
    }
    // SAFETY: cuBLAS only writes its own scratch into the workspace; it is never read here.
    let ws = unsafe { stream.alloc::<u8>(CUBLAS_WORKSPACE_BYTES) }
        .map_err(|e| driver("the cuBLAS workspace", e))?;
    let status = {
        let (ptr, _guard) = ws.device_ptr(stream);
        // SAFETY: the handle is candle's, alive while the device is; the workspace stays
        // allocated for the process (leaked below), as cuBLAS requires for the handle's life.
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                ptr as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE_BYTES,
            )
        }
    };
    if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(TritonError::Driver(format!(
            "cublasSetWorkspace ({CUBLAS_WORKSPACE_BYTES} bytes): {status:?}"
        )));
    }
    std::mem::forget(ws);
    Ok(())
}

#[cfg(feature = "cuda")]
fn unsupported_storage() -> TritonError {
    TritonError::Driver("f8/f6/f4 storage cannot be a Triton kernel's buffer".into())
}

/// `out[m, n] = alpha · x[m, k] · w[n, k]ᵀ + beta · out` (row-major, f32 or bf16, f32 accumulation) with
/// cuBLAS on `blas`'s stream (candle's `CudaDevice::cublas_handle`, bound to candle's stream):
/// the fused decode step's projections, written into preallocated buffers so that a CUDA graph
/// can replay them. In cuBLAS's column-major terms it is `outᵀ = op(w)·xᵀ` with `w` transposed.
/// `beta = 1` accumulates onto `out` (a bias written there first, or a LoRA adapter's update
/// `alpha = α/r` onto its projection's output).
///
/// Errors: buffers of different or unsupported dtypes, a buffer shorter than its matrix, a
/// dimension of 0 or over `i32::MAX`, cuBLAS's error.
#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    blas: &cudarc::cublas::CudaBlas,
    x: &DeviceBuffer,
    w: &DeviceBuffer,
    out: &DeviceBuffer,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    use cudarc::cublas::sys;
    let err = |why: String| TritonError::Driver(format!("gemm [{m}, {k}] · [{n}, {k}]ᵀ: {why}"));
    let ty = match x.dtype {
        DType::Fp32 => sys::cudaDataType_t::CUDA_R_32F,
        DType::Bf16 => sys::cudaDataType_t::CUDA_R_16BF,
        other => return Err(err(format!("{other} (f32 or bf16 only)"))),
    };
    if w.dtype != x.dtype || out.dtype != x.dtype {
        return Err(err(format!(
            "dtypes {}, {}, {} differ",
            x.dtype, w.dtype, out.dtype
        )));
    }
    for (what, b, need) in [("x", x, m * k), ("w", w, n * k), ("out", out, m * n)] {
        if b.len < need {
            return Err(err(format!(
                "{what} holds {} elements, {need} needed",
                b.len
            )));
        }
    }
    let dim = |v: usize| -> Result<i32> {
        i32::try_from(v)
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| err(format!("dimension {v}")))
    };
    let (mi, ni, ki) = (dim(m)?, dim(n)?, dim(k)?);
    // SAFETY: the three pointers address live device buffers of the checked dtype holding at
    // least the matrices' elements (checked above; the caller keeps them alive until the stream
    // has run the product); alpha and beta are host f32s, as CUBLAS_COMPUTE_32F takes them.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            ni,
            mi,
            ki,
            (&alpha) as *const f32 as *const _,
            w.ptr as *const std::ffi::c_void,
            ty,
            ki,
            x.ptr as *const std::ffi::c_void,
            ty,
            ki,
            (&beta) as *const f32 as *const _,
            out.ptr as *mut std::ffi::c_void,
            ty,
            ni,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| err(format!("{e:?}")))?;
    if sync_each_launch() {
        let mut stream = std::ptr::null_mut();
        // SAFETY: the handle is live; cuBLAS writes the stream it is bound to.
        unsafe { sys::cublasGetStream_v2(*blas.handle(), &mut stream) }
            .result()
            .map_err(|e| err(format!("cublasGetStream: {e:?}")))?;
        debug_sync(stream as cudarc::driver::sys::CUstream, || {
            format!(
                "cuBLAS gemm {m}×{k} · ({n}×{k})ᵀ (x {:#x}, w {:#x}, out {:#x}, {})",
                x.ptr, w.ptr, out.ptr, x.dtype
            )
        })?;
    }
    Ok(())
}
