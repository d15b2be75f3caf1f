//! Fused attention on CUDA (feature `cuda`): a candle custom op over q, k, v `[N, heads, hd]`
//! whose `cuda_fwd` launches `attn_fwd_*` (FlashAttention-2's online softmax, Dao 2023,
//! arXiv:2307.08691) through `rlvr_kernels::triton::cuda` on candle's stream, keeping the
//! log-sum-exp inside the op for the backward, and whose `bwd` launches `attn_bwd_pre_*`,
//! `attn_bwd_dkdv_*` and `attn_bwd_dq_*` (deterministic: no atomics). The descriptors come from
//! the [`AttnLayout`] the model built (dense rows or the shared-prefix layout).
//!
//! Outputs are zero-initialised: rows outside every sequence (padding) are never written, so
//! they read 0 (their gradients too). Activation checkpointing recomputes through this op (the
//! layer's forward is what `crate::recompute` re-runs), each forward keeping its own LSE.
//!
//! Not yet run on a GPU: the launch plans are the ones the model-level recorder replays under
//! Triton's interpreter (`crate::kernels::record_launches`); the GPU check is
//! `bench/gpu_check.sh`.

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaStream;
use candle_core::cuda_backend::{CudaDevice, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Storage, Tensor};
use rlvr_kernels::triton::cuda as tc;
use rlvr_kernels::triton::families;
use rlvr_kernels::triton::families::attention::{self, Layout as AttnLayout};
use rlvr_kernels::triton::{DeviceBuffer, KernelEntry, Manifest};

use crate::error::Result;

/// Fused attention of q `[Nq, nh, hd]`, k and v `[N, nkv, hd]` (contiguous, f32 or bf16, on a
/// CUDA device; Nq = N, or fewer when the rows after Nq are key-only) over `layout`:
/// `[Nq, nh, hd]`, with the fused backward (refused by its plan for key-only prefixes).
pub(crate) fn apply(layout: Arc<AttnLayout>, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    if layout.seqs.is_empty() {
        return Ok(q.zeros_like()?);
    }
    let op = AttnOp {
        layout,
        lse: Mutex::new(None),
    };
    Ok(q.apply_op3(k, v, op)?)
}

struct AttnOp {
    layout: Arc<AttnLayout>,
    /// The forward's log-sum-exp `[nh·N]` f32, for the backward.
    lse: Mutex<Option<Tensor>>,
}

fn variant(kernel: &str, dtype: DType, d: usize) -> candle_core::Result<String> {
    let dt = match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        other => candle_core::bail!("fused attention: {other:?} (the kernels are f32 and bf16)"),
    };
    Ok(format!("attn_{kernel}_{dt}_d{d}"))
}

/// Zeros of `dtype` (`len` elements) as a CUDA storage on `dev`.
fn zeros(dev: &CudaDevice, dtype: DType, len: usize) -> candle_core::Result<CudaStorage> {
    Ok(match dtype {
        DType::F32 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f32>(len)?, dev.clone()),
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<half::bf16>(len)?, dev.clone())
        }
        other => candle_core::bail!("fused attention: no {other:?} buffers"),
    })
}

fn contiguous(len: usize) -> Layout {
    Layout::contiguous(len)
}

/// Launches kernel `kernel` of the family over `l` with `inputs` (read) and `outputs` (written),
/// each by its buffer name; the descriptors are uploaded here. The variant is the aligned twin
/// (`_a16`, 128-bit accesses) when the manifest has one and every address and length of this
/// launch qualifies ([`LaunchPlan::resolve`] is pure: it is checked before anything launches),
/// else the fallback compiled without alignment assumptions.
fn run(
    dev: &CudaDevice,
    kernel: &str,
    dtype: DType,
    l: &AttnLayout,
    inputs: &[(&str, &CudaStorage, &Layout)],
    outputs: &mut [(&str, &mut CudaStorage)],
) -> candle_core::Result<()> {
    let m = Manifest::committed()?;
    let stream = dev.cuda_stream();
    let target = tc::device_target(&stream, m)?;
    let base = variant(kernel, dtype, l.head_dim)?;
    if let Some(twin) = m.find(&families::aligned_name(&base), target) {
        if launch(dev, &stream, m, twin, l, inputs, outputs, true)? {
            return Ok(());
        }
    }
    let entry = m.entry(&base, target)?;
    launch(dev, &stream, m, entry, l, inputs, outputs, false)?;
    Ok(())
}

/// One launch of `entry`; with `optional` (an aligned twin) returns `Ok(false)` without
/// launching when its plan does not accept this launch's shapes or addresses.
#[allow(clippy::too_many_arguments)]
fn launch(
    dev: &CudaDevice,
    stream: &Arc<CudaStream>,
    m: &Manifest,
    entry: &KernelEntry,
    l: &AttnLayout,
    inputs: &[(&str, &CudaStorage, &Layout)],
    outputs: &mut [(&str, &mut CudaStorage)],
    optional: bool,
) -> candle_core::Result<bool> {
    let (plan, desc) = match attention::plan(entry, l) {
        Ok(p) => p,
        Err(_) if optional => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let mut descs = Vec::with_capacity(desc.len());
    for (name, v) in desc {
        let len = v.len();
        let s = CudaStorage::wrap_cuda_slice(dev.clone_htod(&v)?, dev.clone());
        descs.push((name, s, contiguous(len)));
    }
    let mut bufs: Vec<(&str, DeviceBuffer)> = Vec::new();
    let mut guards = Vec::new();
    for &(name, s, lay) in inputs {
        let (b, g) = tc::candle_buffer(s, lay, stream)?;
        bufs.push((name, b));
        guards.push(g);
    }
    for (name, s, lay) in &descs {
        let (b, g) = tc::candle_buffer(s, lay, stream)?;
        bufs.push((name.as_str(), b));
        guards.push(g);
    }
    for (name, s) in outputs.iter_mut() {
        let lay = contiguous(storage_len(s));
        let (b, g) = tc::candle_buffer_mut(s, &lay, stream)?;
        bufs.push((*name, b));
        guards.push(g);
    }
    if optional && plan.resolve(&bufs).is_err() {
        return Ok(false);
    }
    tc::launch(stream, m, &plan, &bufs)?;
    drop(guards);
    Ok(true)
}

fn storage_len(s: &CudaStorage) -> usize {
    match &s.slice {
        CudaStorageSlice::F32(x) => x.len(),
        CudaStorageSlice::BF16(x) => x.len(),
        CudaStorageSlice::I32(x) => x.len(),
        _ => 0,
    }
}

fn check(l: &Layout, what: &str) -> candle_core::Result<()> {
    if !l.is_contiguous() {
        candle_core::bail!("fused attention: {what} is not contiguous");
    }
    Ok(())
}

impl CustomOp3 for AttnOp {
    fn name(&self) -> &'static str {
        "rlvr-fused-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("fused attention is CUDA only (the CPU runs the candle composition)")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        for (l, w) in [(lq, "q"), (lk, "k"), (lv, "v")] {
            check(l, w)?;
        }
        let l = &*self.layout;
        let dev = &q.device;
        let dtype = q.dtype();
        let (n, hq) = (l.n_tokens, l.q_heads);
        // The output has q's rows (key-only rows after them have no queries).
        let nq = lq.shape().dims().first().copied().unwrap_or(0);
        let mut o = zeros(dev, dtype, nq * hq * l.head_dim)?;
        let mut lse = zeros(dev, DType::F32, hq * n)?;
        run(
            dev,
            "fwd",
            dtype,
            l,
            &[("q", q, lq), ("k", k, lk), ("v", v, lv)],
            &mut [("o", &mut o), ("lse", &mut lse)],
        )?;
        let lse = Tensor::from_storage(Storage::Cuda(lse), hq * n, BackpropOp::none(), false);
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(lse);
        Ok((o, Shape::from((nq, hq, l.head_dim))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let l = &*self.layout;
        let lse = (self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone())
            .ok_or_else(|| candle_core::Error::Msg("fused attention: no forward LSE".into()))?;
        let d_o = d_o.to_dtype(q.dtype())?.contiguous()?;
        let (n, hq, hk, d) = (l.n_tokens, l.q_heads, l.kv_heads, l.head_dim);
        let dtype = q.dtype();
        let (sq, lq) = q.storage_and_layout();
        let (sk, lk) = k.storage_and_layout();
        let (sv, lv) = v.storage_and_layout();
        let (so, lo) = o.storage_and_layout();
        let (sd, ld) = d_o.storage_and_layout();
        let (sl, ll) = lse.storage_and_layout();
        let (
            Storage::Cuda(cq),
            Storage::Cuda(ck),
            Storage::Cuda(cv),
            Storage::Cuda(co),
            Storage::Cuda(cd),
            Storage::Cuda(cl),
        ) = (&*sq, &*sk, &*sv, &*so, &*sd, &*sl)
        else {
            candle_core::bail!("fused attention backward: tensors not on CUDA");
        };
        for (lay, w) in [(lq, "q"), (lk, "k"), (lv, "v"), (lo, "o"), (ld, "dO")] {
            check(lay, w)?;
        }
        let dev = &cq.device;
        let mut delta = zeros(dev, DType::F32, hq * n)?;
        run(
            dev,
            "bwd_pre",
            dtype,
            l,
            &[("o", co, lo), ("do", cd, ld)],
            &mut [("delta", &mut delta)],
        )?;
        let dl = contiguous(hq * n);
        let ins = [
            ("q", cq, lq),
            ("k", ck, lk),
            ("v", cv, lv),
            ("do", cd, ld),
            ("lse", cl, ll),
            ("delta", &delta, &dl),
        ];
        let mut dk = zeros(dev, dtype, n * hk * d)?;
        let mut dv = zeros(dev, dtype, n * hk * d)?;
        run(
            dev,
            "bwd_dkdv",
            dtype,
            l,
            &ins,
            &mut [("dk", &mut dk), ("dv", &mut dv)],
        )?;
        let mut dq = zeros(dev, dtype, n * hq * d)?;
        run(dev, "bwd_dq", dtype, l, &ins, &mut [("dq", &mut dq)])?;
        let t = |s: CudaStorage, heads: usize| {
            Tensor::from_storage(Storage::Cuda(s), (n, heads, d), BackpropOp::none(), false)
        };
        Ok((Some(t(dq, hq)), Some(t(dk, hk)), Some(t(dv, hk))))
    }
}
