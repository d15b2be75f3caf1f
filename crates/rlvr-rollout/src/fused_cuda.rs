//! The fused decode step on CUDA (feature `cuda`; issue 50): [`crate::fused::StepProgram`] run on
//! candle's stream, eagerly or as a CUDA graph per batch-size bucket (`rlvr_kernels::graph`).
//!
//! A decoder serves one bucket of a wave: the sampler builds one per wave and a new one each time
//! the wave's live rows fit half the slots (it compacts the cache first). Buffers: the step's
//! activations and inputs are candle tensors allocated once per decoder (their storage never
//! moves), the weights are the model's own tensors (in-place updates are seen; a reload that
//! replaces storage makes a new wave's program; a bf16 model's f32 LoRA factors are bf16 copies
//! made when the decoder is built, current for its bucket: weights change between `sample`
//! calls, never during one), the caches and the bias are the wave's
//! `KvBuffer`, which is not compacted while a decoder runs on it. Each buffer's device address is
//! read once per decoder; a step writes its inputs (embeddings of the new tokens, positions, columns,
//! lengths) into those buffers with candle copies, then runs the program's launches (Triton
//! kernels through `rlvr_kernels::triton::cuda::launch`, projections through cuBLAS) or replays
//! the graph captured from them.
//!
//! Unrun until a GPU runs it: type-checked (`scripts/cuda-check.sh -p rlvr-rollout --features
//! cuda`); the program it runs is the one tested on the CPU (`fused` module), and
//! `bench/gpu_check.sh`'s sampling part is the GPU check.

use std::collections::BTreeMap;
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cublas::CudaBlas;
use candle_core::cuda_backend::cudarc::driver::{CudaGraph, CudaSlice, CudaStream, DevicePtr};
use candle_core::{DType, Storage, Tensor};
use rlvr_kernels::graph::{self, GraphCache, GraphKey};
use rlvr_kernels::triton::{self, cuda as tc, DeviceBuffer, Manifest};
use rlvr_model::{Model, ModelError};

use crate::decode::KvBuffer;
use crate::error::Result;
use crate::fused::{rotary_tables, weight, Buf, FusedStep, Op, StepProgram, StepShape};

/// The fused decode step of one wave on CUDA.
pub(crate) struct FusedDecoder {
    program: StepProgram,
    dev: candle_core::CudaDevice,
    stream: Arc<CudaStream>,
    blas: Arc<CudaBlas>,
    manifest: &'static Manifest,
    /// The step's own buffers (activations, inputs, ones, rotary tables) and the weights:
    /// alive as long as the decoder, so the addresses below stay valid.
    tensors: BTreeMap<Buf, Tensor>,
    /// The i32 inputs (positions, columns, lengths), written with host-to-device copies.
    ints: BTreeMap<Buf, CudaSlice<i32>>,
    /// Every buffer's device address; the cache's and bias's are read from the wave's
    /// `KvBuffer` at the first step.
    addrs: BTreeMap<Buf, DeviceBuffer>,
    /// The cache's layers and bias rows whose addresses `addrs` holds: kept alive by the
    /// decoder, so a replay never writes into freed memory even if the cache moved.
    held: Vec<Tensor>,
    embed: Tensor,
    graphs: GraphCache<CudaGraph>,
    /// Distinguishes waves in the graph key (a process-wide counter).
    generation: u64,
}

fn err(e: impl std::fmt::Display) -> crate::RolloutError {
    ModelError::Invalid(format!("fused decode step: {e}")).into()
}

fn candle_dtype(d: triton::DType) -> Result<DType> {
    Ok(match d {
        triton::DType::Fp32 => DType::F32,
        triton::DType::Bf16 => DType::BF16,
        triton::DType::I32 => DType::I32,
        other => return Err(err(format!("no {other} buffers"))),
    })
}

/// The device address of a contiguous CUDA tensor (its view's first element) and length.
fn device_buffer(t: &Tensor, stream: &CudaStream) -> Result<DeviceBuffer> {
    let (s, l) = t.storage_and_layout();
    let Storage::Cuda(c) = &*s else {
        return Err(err("a buffer is not on the CUDA device"));
    };
    if !l.is_contiguous() {
        return Err(err("a buffer is not contiguous"));
    }
    let (b, guard) = tc::candle_buffer(c, l, stream).map_err(err)?;
    drop(guard);
    Ok(DeviceBuffer {
        len: t.elem_count(),
        ..b
    })
}

impl FusedDecoder {
    /// The decoder of `model` over the wave's `cache` (its rows are the step's slots), with
    /// graphs when `graphs`.
    ///
    /// Errors: a model or device the program does not cover, out of device memory.
    pub(crate) fn new(model: &Model, cache: &KvBuffer, graphs: bool) -> Result<Self> {
        static WAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let candle_core::Device::Cuda(dev) = model.device() else {
            return Err(err("the model is not on a CUDA device"));
        };
        let (dev, stream) = (dev.clone(), dev.cuda_stream());
        let manifest = Manifest::committed().map_err(err)?;
        let target = tc::device_target(&stream, manifest).map_err(err)?;
        let shape = StepShape::of(model, cache.rows(), cache.capacity())?;
        let program = StepProgram::build(shape, manifest, target)?;
        let mut tensors = BTreeMap::new();
        let mut ints = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        let (cos, sin) = rotary_tables(model)?;
        for (b, (dt, len)) in program.sizes() {
            let t = match b {
                Buf::KCache(_) | Buf::VCache(_) | Buf::Bias => continue,
                _ if dt == triton::DType::I32 => {
                    let s: CudaSlice<i32> = dev.alloc_zeros(len)?;
                    let (ptr, guard) = s.device_ptr(&stream);
                    drop(guard);
                    let dtype = triton::DType::I32;
                    addrs.insert(b, DeviceBuffer { ptr, dtype, len });
                    ints.insert(b, s);
                    continue;
                }
                Buf::W(w) => weight(model, w)?,
                Buf::Cos => cos.contiguous()?,
                Buf::Sin => sin.contiguous()?,
                Buf::Ones => Tensor::ones(shape.rows, candle_dtype(dt)?, model.device())?,
                _ => {
                    let (_, dims) = shape.spec(b, program.n_splits);
                    Tensor::zeros(dims, candle_dtype(dt)?, model.device())?
                }
            };
            tensors.insert(b, t);
        }
        for (b, t) in &tensors {
            addrs.insert(*b, device_buffer(t, &stream)?);
        }
        let embed = weight_of(model, "model.embed_tokens.weight")?;
        Ok(FusedDecoder {
            program,
            blas: dev.cublas_handle(),
            dev,
            stream,
            manifest,
            tensors,
            ints,
            addrs,
            held: Vec::new(),
            embed,
            graphs: GraphCache::new(shape.rows, graphs),
            generation: WAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Reads the addresses of the wave's caches and bias (once: the sampler compacts the cache
    /// only between decoders).
    ///
    /// Errors: a cache whose first layer moved since (the sampler must build a new decoder after
    /// compacting; the step then fails and the wave goes on with the candle step).
    fn bind_cache(&mut self, cache: &KvBuffer) -> Result<()> {
        let (k0, _) = cache
            .layer(0)
            .ok_or_else(|| err("no cache layer 0".to_string()))?;
        if let Some(bound) = self.addrs.get(&Buf::KCache(0)) {
            let now = device_buffer(k0, &self.stream)?;
            if now.ptr != bound.ptr {
                return Err(err(format!(
                    "the KV cache moved under the fused decode step ({:#x} → {:#x})",
                    bound.ptr, now.ptr
                )));
            }
            return Ok(());
        }
        for l in 0..self.program.shape.layers {
            let (k, v) = cache
                .layer(l)
                .ok_or_else(|| err(format!("no cache layer {l}")))?;
            self.addrs
                .insert(Buf::KCache(l), device_buffer(k, &self.stream)?);
            self.addrs
                .insert(Buf::VCache(l), device_buffer(v, &self.stream)?);
            self.held.extend([k.clone(), v.clone()]);
        }
        let bias = device_buffer(cache.bias_rows(), &self.stream)?;
        self.addrs.insert(Buf::Bias, bias);
        self.held.push(cache.bias_rows().clone());
        Ok(())
    }

    /// Queues the program's launches on the stream (no allocation, no copy, no sync: what a
    /// capture records).
    fn launch_all(&self) -> Result<()> {
        let a = |b: &Buf| -> Result<DeviceBuffer> {
            self.addrs
                .get(b)
                .copied()
                .ok_or_else(|| err(format!("buffer {b:?} has no address")))
        };
        for op in &self.program.ops {
            match op {
                Op::Launch { plan, bind } => {
                    let bufs: Vec<(&str, DeviceBuffer)> = (bind.iter())
                        .map(|(n, b)| Ok((n.as_str(), a(b)?)))
                        .collect::<Result<_>>()?;
                    tc::launch(&self.stream, self.manifest, plan, &bufs).map_err(err)?;
                }
                Op::Gemm {
                    x,
                    w,
                    bias,
                    out,
                    m,
                    n,
                    k,
                    alpha,
                    accumulate,
                } => {
                    let beta = match bias {
                        Some(b) => {
                            // out = ones[m, 1] · bias[n, 1]ᵀ, then the product accumulated.
                            let ones = a(&Buf::Ones)?;
                            tc::gemm(&self.blas, &ones, &a(b)?, &a(out)?, *m, *n, 1, 1.0, 0.0)
                                .map_err(err)?;
                            1.0
                        }
                        // A LoRA adapter's update onto its projection's output.
                        None if *accumulate => 1.0,
                        None => 0.0,
                    };
                    tc::gemm(
                        &self.blas,
                        &a(x)?,
                        &a(w)?,
                        &a(out)?,
                        *m,
                        *n,
                        *k,
                        *alpha,
                        beta,
                    )
                    .map_err(err)?;
                }
            }
        }
        Ok(())
    }

    /// Writes the step's inputs into their fixed buffers (outside any capture).
    fn write_inputs(&mut self, ids: &[u32], pos: &[u32], col: usize) -> Result<()> {
        let rows = self.program.shape.rows;
        let d = self.embed.device();
        let idx = Tensor::from_slice(ids, rows, d)?;
        let x = self.embed.index_select(&idx, 0)?;
        let put = |b: Buf, t: &Tensor| -> Result<()> {
            let dst = self
                .tensors
                .get(&b)
                .ok_or_else(|| err(format!("no buffer {b:?}")))?;
            Ok(dst.slice_set(t, 0, 0)?)
        };
        put(Buf::X(0), &x)?;
        let values = [
            (Buf::Pos, pos.iter().map(|p| *p as i32).collect::<Vec<_>>()),
            (Buf::Cols, vec![col as i32; rows]),
            (Buf::Lens, vec![col as i32 + 1; rows]),
        ];
        for (b, v) in values {
            let dst = self
                .ints
                .get_mut(&b)
                .ok_or_else(|| err(format!("no buffer {b:?}")))?;
            self.stream.memcpy_htod(&v, dst).map_err(err)?;
        }
        Ok(())
    }
}

fn weight_of(model: &Model, name: &str) -> Result<Tensor> {
    Ok(model
        .var(name)
        .ok_or_else(|| err(format!("no weight {name}")))?
        .as_tensor()
        .detach())
}

impl FusedStep for FusedDecoder {
    fn step(&mut self, cache: &mut KvBuffer, ids: &[u32], pos: &[u32]) -> Result<Tensor> {
        let rows = self.program.shape.rows;
        if ids.len() != rows || pos.len() != rows || cache.rows() != rows {
            return Err(err(format!(
                "{} ids and {} positions for {rows} slots over a cache of {} rows",
                ids.len(),
                pos.len(),
                cache.rows()
            )));
        }
        let col = cache.len();
        if col >= cache.capacity() {
            return Err(err(format!("KV cache full: capacity {}", cache.capacity())));
        }
        self.bind_cache(cache)?;
        self.write_inputs(ids, pos, col)?;
        let key = GraphKey {
            capacity: cache.capacity(),
            buffers: self.generation,
            weights: 0,
        };
        let mut graphs = std::mem::replace(&mut self.graphs, GraphCache::new(0, false));
        let graphs_were_on = graphs.disabled().is_none();
        let this = &*self;
        let r = graphs.step(
            rows,
            key,
            |_| this.launch_all(),
            |_| {
                graph::cuda::capture_candle(&this.dev, || {
                    this.launch_all()
                        .map_err(|e| triton::TritonError::Driver(e.to_string()))
                })
                .map_err(err)
            },
            |g| graph::cuda::replay(g).map_err(err),
        );
        // A failed capture turns graphs off for this bucket and its steps run eagerly: said once,
        // so that a report of `fused+graphs` (the switches) is not read as graphs that ran.
        if let (true, Some(why)) = (graphs_were_on, graphs.disabled()) {
            rlvr_model::kernels::log_once(format!(
                "kernels.cuda_graphs = on: {why}; the decode steps run eagerly"
            ));
        }
        self.graphs = graphs;
        r?;
        rlvr_model::KvStore::commit(cache, 1)?;
        let logits = &self.tensors[&Buf::Logits];
        Ok(logits.to_dtype(DType::F32)?.contiguous()?)
    }
}
