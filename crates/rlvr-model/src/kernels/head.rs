//! The log-prob head's chunk kernels (`kernels.logprob_head`, issue 44): what the CUDA op
//! ([`super::cuda_head`]) and the CPU launch recorder share, and the recorder's taps.
//!
//! On CUDA with the switch on, [`crate::Model`]'s head computes each vocabulary chunk of logits
//! `z = h·W_cᵀ` `[N, C]` with cuBLAS (candle's matmul), merges it into the per-row online
//! log-sum-exp state with `logprob_fwd_*`, and `logprob_finish` gives `(log p_y, H)`; the
//! backward recomputes each chunk, turns it into `∂L/∂z` in place with `logprob_bwd_*`, and
//! forms `∂h += ∂z·W_c`, `∂W_c = ∂zᵀ·h` with GEMMs. No `[N, V]` buffer beyond one chunk.
//!
//! On the CPU, under [`super::record_launches`] with the switch on, [`tap`] records the same
//! launches from the real hidden states, head weight and targets of a forward: the forward
//! chunks (the first, with a fresh state; the second; the last) with the state expected from
//! float64 sums over the real logits, `logprob_finish` expecting the head's real output, and,
//! when the gradient of that output arrives, the backward chunks expecting the candle
//! composition's gradient of the logits ([`crate::Model::logprobs_unfused`] under autograd).

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use rlvr_kernels::triton::families::logprob_head::{self, LogprobChunk};
use rlvr_kernels::triton::{self, HostBuffer, Tolerance};

use super::{host_f32, tap as grad_tap, twin_of, wants, write_record};
use crate::error::{ModelError, Result};

/// Vocabulary entries per chunk of the fused head for `n` rows over `v` entries with `elems`
/// logits per chunk ([`crate::chunked::chunk_width`]), rounded down to a multiple of 16 when at
/// least 16 (the aligned kernels' condition on `n_cols` and `stride_z`).
pub(crate) fn chunk_width(n: usize, v: usize, elems: usize) -> usize {
    let c = crate::chunked::chunk_width(n, v, elems);
    if c >= 16 {
        c / 16 * 16
    } else {
        c
    }
}

/// The forward and backward kernels' variant for logits of `dtype` (f32 or bf16), the
/// `_softcap` one for a model with a final-logit softcap (Gemma 2).
pub(crate) fn variant(kernel: &str, dtype: DType, softcap: bool) -> Option<String> {
    let dt = match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        _ => return None,
    };
    Some(logprob_head::variant_name(kernel, dt, softcap))
}

/// The kernels' `cap` argument: the softcap, or 0 (ignored by the plain variants).
pub(crate) fn cap_arg(softcap: Option<f64>) -> f32 {
    softcap.map_or(0.0, |c| c as f32)
}

fn plan_err(e: triton::TritonError) -> ModelError {
    ModelError::Invalid(e.to_string())
}

/// The chunk width of the records: the CUDA path's, but at most a third of the vocabulary (so
/// that a small test model's forward still shows a first, a middle and a last chunk).
fn record_chunk(n: usize, v: usize) -> usize {
    chunk_width(n, v, crate::chunked::CHUNK_ELEMS_GPU).min(v.div_ceil(3).max(1))
}

/// Merges logits chunk `z` `[N, cs]` (row-major) starting at id `c0` into `state` `[N, 4]`
/// (M, S, D, s_y), in float64; `first`: a fresh state; `softcap`: Gemma 2's final-logit cap,
/// applied before the temperature.
#[allow(clippy::too_many_arguments)]
fn merge(
    state: &mut [f64],
    z: &[f32],
    cs: usize,
    c0: usize,
    targets: &[u32],
    inv_t: f32,
    first: bool,
    softcap: Option<f64>,
) {
    for (r, &y) in targets.iter().enumerate() {
        let st = &mut state[r * 4..r * 4 + 4];
        let (m0, s0, d0, sy0) = if first {
            (f64::NEG_INFINITY, 0.0, 0.0, 0.0)
        } else {
            (st[0], st[1], st[2], st[3])
        };
        let sc: Vec<f64> = (0..cs)
            .map(|c| match softcap {
                None => (z[r * cs + c] * inv_t) as f64,
                Some(cap) => cap * inv_t as f64 * (z[r * cs + c] as f64 / cap).tanh(),
            })
            .collect();
        let m = sc.iter().fold(m0, |a, b| a.max(*b));
        let (a, delta) = if s0 > 0.0 {
            ((m0 - m).exp(), m0 - m)
        } else {
            (0.0, 0.0)
        };
        let s = a * s0 + sc.iter().map(|x| (x - m).exp()).sum::<f64>();
        let d = a * (d0 + delta * s0) + sc.iter().map(|x| (x - m).exp() * (x - m)).sum::<f64>();
        let y = y as usize;
        let sy = if (c0..c0 + cs).contains(&y) {
            sc[y - c0]
        } else {
            sy0
        };
        st.copy_from_slice(&[m, s, d, sy]);
    }
}

/// The chunks `(c0, cs)` of a `v`-entry vocabulary at width `chunk`.
fn chunks(v: usize, chunk: usize) -> Vec<(usize, usize)> {
    (0..v)
        .step_by(chunk.max(1))
        .map(|c0| (c0, chunk.min(v - c0)))
        .collect()
}

/// Which chunks' launches are recorded, with their label suffix: the first, the second, the
/// last (when distinct).
fn recorded(n_chunks: usize) -> Vec<(usize, &'static str)> {
    let mut out = vec![(0, "_first")];
    if n_chunks > 1 {
        out.push((1, ""));
    }
    if n_chunks > 2 {
        out.push((n_chunks - 1, "_last"));
    }
    out
}

/// Writes the record of `name` under `label`, and its aligned twin's when the chunk allows it.
fn write_both(
    label: &str,
    name: &str,
    s: &LogprobChunk,
    bufs: BTreeMap<String, HostBuffer>,
    want: BTreeMap<String, (HostBuffer, Tolerance)>,
) -> Result<()> {
    let build = |e: &triton::KernelEntry| {
        Ok((logprob_head::plan(e, s).map_err(plan_err)?, BTreeMap::new()))
    };
    write_record(label, name, build, bufs.clone(), want.clone())?;
    if s.n_cols.is_multiple_of(16) && s.stride_z.is_multiple_of(16) {
        if let Some(twin) = twin_of(name) {
            write_record(&format!("{label}_a16"), &twin, build, bufs, want)?;
        }
    }
    Ok(())
}

/// The logits of vocabulary rows `c0..c0+cs` of `w` for `h`, as the CUDA path computes them
/// (candle's matmul in the model dtype), on the host in f32 (bf16 values exact).
fn chunk_logits(h: &Tensor, w: &Tensor, c0: usize, cs: usize) -> Result<Vec<f32>> {
    host_f32(&h.matmul(&w.narrow(0, c0, cs)?.t()?)?)
}

fn logits_buffer(dtype: DType, shape: &[usize], z: &[f32]) -> HostBuffer {
    match dtype {
        DType::BF16 => HostBuffer::bf16(shape, z),
        _ => HostBuffer::f32(shape, z),
    }
}

/// Under the launch recorder (CPU, `kernels.logprob_head = "on"`): records the fused head's
/// forward launches for hidden states `h` `[N, H]`, head weight `w` `[V, H]` (f32 or bf16),
/// `targets`, temperature and final-logit `softcap` (Gemma 2: the `_softcap` variants), with
/// `out` `[N, 2]` (log p_y, H or 0) the head's real output;
/// returns `out` behind an identity whose backward records the backward launches (module docs).
/// Without a recorder (or another dtype), `out` unchanged.
///
/// Errors: tensor errors, writing the records.
pub(crate) fn tap(
    h: &Tensor,
    w: &Tensor,
    targets: &[u32],
    temperature: f64,
    entropy: bool,
    softcap: Option<f64>,
    out: &Tensor,
) -> Result<Tensor> {
    let dtype = h.dtype();
    let Some(fwd) = variant("fwd", dtype, softcap.is_some()) else {
        return Ok(out.clone());
    };
    if !super::recording() || !h.device().is_cpu() {
        return Ok(out.clone());
    }
    let (n, _) = h.dims2()?;
    let v = w.dim(0)?;
    let (h, w) = (h.detach().contiguous()?, w.detach().contiguous()?);
    let inv_t = (1.0 / temperature) as f32;
    let chunk = record_chunk(n, v);
    let parts = chunks(v, chunk);
    let tg: Vec<i32> = targets.iter().map(|&y| y as i32).collect();
    let mut state = vec![0f64; n * 4];
    let mut state32 = vec![0f32; n * 4];
    let picks = recorded(parts.len());
    for (k, &(c0, cs)) in parts.iter().enumerate() {
        let z = chunk_logits(&h, &w, c0, cs)?;
        let before = state32.clone();
        // The kernel merges into the f32 state it stored: so does the reference.
        let mut st: Vec<f64> = before.iter().map(|x| *x as f64).collect();
        merge(&mut st, &z, cs, c0, targets, inv_t, k == 0, softcap);
        state = st;
        state32 = state.iter().map(|x| *x as f32).collect();
        let Some(&(_, sfx)) = picks.iter().find(|(i, _)| *i == k) else {
            continue;
        };
        let label = format!("model_{fwd}{sfx}");
        if !wants(&label) {
            continue;
        }
        let s = LogprobChunk {
            rows: n,
            n_cols: cs,
            stride_z: cs,
            col0: c0,
            first: k == 0,
            inv_t,
            cap: cap_arg(softcap),
        };
        let bufs = BTreeMap::from([
            ("z".to_string(), logits_buffer(dtype, &[n, cs], &z)),
            ("targets".to_string(), HostBuffer::i32(&[n], &tg)),
            ("state".to_string(), HostBuffer::f32(&[n, 4], &before)),
        ]);
        let want = BTreeMap::from([(
            "state".to_string(),
            (HostBuffer::f32(&[n, 4], &state32), Tolerance::F32),
        )]);
        write_both(&label, &fwd, &s, bufs, want)?;
    }
    // finish: (log p_y, H) from the merged state; expected: the head's own output (the entropy
    // from the float64 state when the head did not compute it).
    let real = host_f32(out)?;
    let mut want_out = vec![0f32; n * 2];
    for r in 0..n {
        let (s, d) = (state[r * 4 + 1], state[r * 4 + 2]);
        want_out[r * 2] = real[r * 2];
        want_out[r * 2 + 1] = if entropy {
            real[r * 2 + 1]
        } else {
            (s.ln() - d / s) as f32
        };
    }
    let s_all = LogprobChunk {
        rows: n,
        n_cols: chunk,
        stride_z: chunk,
        col0: 0,
        first: false,
        inv_t,
        cap: cap_arg(softcap),
    };
    // Its own label for a softcapped head (another test's records may be written beside it).
    let finish_label = match softcap {
        Some(_) => "model_logprob_finish_softcap",
        None => "model_logprob_finish",
    };
    write_record(
        finish_label,
        "logprob_finish",
        |e| {
            Ok((
                logprob_head::plan(e, &s_all).map_err(plan_err)?,
                BTreeMap::new(),
            ))
        },
        BTreeMap::from([
            ("state".to_string(), HostBuffer::f32(&[n, 4], &state32)),
            (
                "out".to_string(),
                HostBuffer::zeros(triton::DType::Fp32, &[n, 2]),
            ),
        ]),
        BTreeMap::from([(
            "out".to_string(),
            (HostBuffer::f32(&[n, 2], &want_out), Tolerance::F32),
        )]),
    )?;
    let st = TapState {
        h,
        w,
        targets: targets.to_vec(),
        temperature,
        entropy,
        softcap,
        chunk,
        state: state32,
        out: want_out,
    };
    // The backward's records are written when the real upstream gradient `(g_ℓ, g_H)` of the
    // head's `[N, 2]` output arrives.
    grad_tap(out.clone(), move |g| record_bwd(&st, g))
}

struct TapState {
    h: Tensor,
    w: Tensor,
    targets: Vec<u32>,
    temperature: f64,
    entropy: bool,
    softcap: Option<f64>,
    chunk: usize,
    state: Vec<f32>,
    out: Vec<f32>,
}

fn record_bwd(t: &TapState, g: &Tensor) -> Result<()> {
    let dtype = t.h.dtype();
    let Some(bwd) = variant("bwd", dtype, t.softcap.is_some()) else {
        return Ok(());
    };
    let (n, v) = (t.targets.len(), t.w.dim(0)?);
    let mut grad = host_f32(g)?;
    if !t.entropy {
        for r in 0..n {
            grad[r * 2 + 1] = 0.0; // the head passes g_H = 0 without entropy
        }
    }
    // The candle composition's gradient of the logits for this upstream gradient.
    let z_all = t.h.matmul(&t.w.t()?)?.to_dtype(DType::F32)?;
    let logits = candle_core::Var::from_tensor(&z_all)?;
    let y = Tensor::from_vec(t.targets.clone(), (1, n), t.h.device())?;
    let capped = match t.softcap {
        None => logits.as_tensor().clone(),
        Some(cap) => ((logits.as_tensor() / cap)?.tanh()? * cap)?,
    };
    let (lp, ent) =
        crate::Model::logprobs_unfused(&capped.unsqueeze(0)?, &y, t.temperature, t.entropy)?;
    let dev = t.h.device();
    let col = |c: usize| -> Result<Tensor> {
        let x: Vec<f32> = (0..n).map(|r| grad[r * 2 + c]).collect();
        Ok(Tensor::from_vec(x, (1, n), dev)?)
    };
    let mut loss = (lp * col(0)?)?.sum_all()?;
    if let Some(e) = ent {
        loss = (loss + (e * col(1)?)?.sum_all()?)?;
    }
    let dz = host_f32(
        loss.backward()?
            .get(logits.as_tensor())
            .ok_or_else(|| ModelError::Invalid("head record: no logits gradient".into()))?,
    )?;
    let tg: Vec<i32> = t.targets.iter().map(|&y| y as i32).collect();
    let inv_t = (1.0 / t.temperature) as f32;
    let parts = chunks(v, t.chunk);
    let tol = match dtype {
        DType::BF16 => Tolerance::BF16,
        _ => Tolerance {
            atol: 1e-6,
            rtol: 1e-5,
        },
    };
    for (k, sfx) in recorded(parts.len()) {
        let (c0, cs) = parts[k];
        let label = format!("model_{bwd}{sfx}");
        if !wants(&label) {
            continue;
        }
        let z = chunk_logits(&t.h, &t.w, c0, cs)?;
        let want: Vec<f32> = (0..n * cs)
            .map(|i| dz[(i / cs) * v + c0 + i % cs])
            .collect();
        let s = LogprobChunk {
            rows: n,
            n_cols: cs,
            stride_z: cs,
            col0: c0,
            first: k == 0,
            inv_t,
            cap: cap_arg(t.softcap),
        };
        let bufs = BTreeMap::from([
            ("z".to_string(), logits_buffer(dtype, &[n, cs], &z)),
            ("targets".to_string(), HostBuffer::i32(&[n], &tg)),
            ("state".to_string(), HostBuffer::f32(&[n, 4], &t.state)),
            ("out".to_string(), HostBuffer::f32(&[n, 2], &t.out)),
            ("grad".to_string(), HostBuffer::f32(&[n, 2], &grad)),
        ]);
        let e = BTreeMap::from([(
            "z".to_string(),
            (logits_buffer(dtype, &[n, cs], &want), tol),
        )]);
        write_both(&label, &bwd, &s, bufs, e)?;
    }
    Ok(())
}
