//! The launch recorder's taps of the fused RMSNorm (with the residual add) and SwiGLU (CPU,
//! f32, under [`super::record_launches`]): the forward records at the op, with the op's real
//! inputs and the candle composition's outputs as the expected values; the backward records
//! when the gradient of the op's output arrives (an identity op on that output, [`tap`]), with
//! the gradients the composition gives for it as the expected values. Without the recorder these
//! functions return the composition's tensors untouched (the CPU path is bit-identical).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor, Var};
use rlvr_kernels::triton::families::{rmsnorm, swiglu as sw};
use rlvr_kernels::triton::{self, HostBuffer, Tolerance};

use super::{grad_host, host_f32, recording, rmsnorm_covers, rmsnorm_shape, tap, write_picked};
use crate::error::{ModelError, Result};

/// The backward records' bound: the kernels and the composition sum in different orders.
const BWD_TOL: Tolerance = Tolerance {
    atol: 2e-5,
    rtol: 1e-4,
};

type Buffers = BTreeMap<String, HostBuffer>;
type Expected = BTreeMap<String, (HostBuffer, Tolerance)>;

fn f(shape: &[usize], v: &[f32]) -> HostBuffer {
    HostBuffer::f32(shape, v)
}

fn zeros(shape: &[usize]) -> HostBuffer {
    HostBuffer::zeros(triton::DType::Fp32, shape)
}

fn terr(e: triton::TritonError) -> ModelError {
    ModelError::Invalid(e.to_string())
}

/// `(rows, cols)` of `x` `[.., cols]`.
fn rows_cols(x: &Tensor) -> (usize, usize) {
    let cols = x.dims().last().copied().unwrap_or(1).max(1);
    (x.elem_count() / cols, cols)
}

/// `1 / sqrt(mean(h²) + eps)` per row of `h` `[rows, cols]`, in f64.
fn rstd_of(h: &[f32], cols: usize, eps: f32) -> Vec<f64> {
    h.chunks_exact(cols)
        .map(|row| {
            let ms = row.iter().map(|v| *v as f64 * *v as f64).sum::<f64>() / cols as f64;
            1.0 / (ms + eps as f64).sqrt()
        })
        .collect()
}

/// Whether the recorder takes an RMSNorm of `x` with `w` (recording, f32, covered).
fn records_norm(x: &Tensor, w: &Tensor) -> bool {
    recording() && x.dtype() == DType::F32 && rmsnorm_covers(x, w)
}

/// [`super::rms_norm`] under the recorder: records `rmsnorm_fwd` now and `rmsnorm_bwd` with
/// `rmsnorm_dw` when the gradient of `y` arrives. Returns `y` (tapped when recording).
pub(super) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, y: Tensor) -> Result<Tensor> {
    if !records_norm(x, w) {
        return Ok(y);
    }
    let (rows, cols) = rows_cols(x);
    let s = rmsnorm_shape(rows, cols, eps);
    let xh = host_f32(x)?;
    let rstd = rstd_of(&xh, cols, s.eps);
    let rc = [rows, cols];
    let rstd32: Vec<f32> = rstd.iter().map(|v| *v as f32).collect();
    let name = rmsnorm::variant("fwd", triton::DType::Fp32, cols).map_err(terr)?;
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| rmsnorm::plan(e, &s),
        Buffers::from([
            ("x".to_string(), f(&rc, &xh)),
            ("w".to_string(), f(&[cols], &host_f32(w)?)),
            ("y".to_string(), zeros(&rc)),
            ("rstd".to_string(), zeros(&[rows])),
        ]),
        Expected::from([
            ("y".to_string(), (f(&rc, &host_f32(&y)?), Tolerance::F32)),
            ("rstd".to_string(), (f(&[rows], &rstd32), Tolerance::F32)),
        ]),
    )?;
    let (h, w) = (x.detach(), w.detach());
    tap(y, move |dy| record_norm_bwd(&s, eps, &h, &w, None, dy))
}

/// [`super::rms_norm_add`] on the CPU: `h = residual + x` and the composition's norm of `h`.
/// Under the recorder it also records `rmsnorm_add_fwd`, and `rmsnorm_add_bwd` with
/// `rmsnorm_dw` once the gradients of `y` (`dy`) and of `h` in total arrived; the kernel's
/// `dres` (the gradient `h` receives from the residual stream) is that total less the
/// composition's norm gradient for `dy`. The taps sit between `h` (and `y`) and all their
/// consumers, so every gradient sums its terms in the order of the untapped graph: the results
/// stay bit-identical.
pub(super) fn rms_norm_add(
    residual: &Tensor,
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let h = (residual + x)?;
    if !records_norm(x, w) {
        let y = crate::ops::rms_norm(&h, w, eps)?;
        return Ok((h, y));
    }
    let (rows, cols) = rows_cols(x);
    let s = rmsnorm_shape(rows, cols, eps);
    // (dh in total, dy): the backward records once both gradients are in.
    let pending: Arc<Mutex<(Option<Tensor>, Option<Tensor>)>> = Arc::new(Mutex::new((None, None)));
    let (hd, wd) = (h.detach(), w.detach());
    let on = move |slot: usize| {
        let (pending, hd, wd) = (pending.clone(), hd.clone(), wd.clone());
        move |g: &Tensor| -> Result<()> {
            let both = {
                let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                let g = Some(g.detach());
                if slot == 0 {
                    p.0 = g;
                } else {
                    p.1 = g;
                }
                match &*p {
                    (Some(dh), Some(dy)) => Some((dh.clone(), dy.clone())),
                    _ => None,
                }
            };
            match both {
                Some((dh, dy)) => record_norm_bwd(&s, eps, &hd, &wd, Some(&dh), &dy),
                None => Ok(()),
            }
        }
    };
    let h = tap(h, on(0))?;
    let y = crate::ops::rms_norm(&h, w, eps)?;
    let hh = host_f32(&h)?;
    let rstd: Vec<f32> = rstd_of(&hh, cols, s.eps)
        .iter()
        .map(|v| *v as f32)
        .collect();
    let rc = [rows, cols];
    let name = rmsnorm::variant("add_fwd", triton::DType::Fp32, cols).map_err(terr)?;
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| rmsnorm::plan(e, &s),
        Buffers::from([
            ("x".to_string(), f(&rc, &host_f32(x)?)),
            ("residual".to_string(), f(&rc, &host_f32(residual)?)),
            ("w".to_string(), f(&[cols], &host_f32(w)?)),
            ("h_out".to_string(), zeros(&rc)),
            ("y".to_string(), zeros(&rc)),
            ("rstd".to_string(), zeros(&[rows])),
        ]),
        Expected::from([
            ("h_out".to_string(), (f(&rc, &hh), Tolerance::F32)),
            ("y".to_string(), (f(&rc, &host_f32(&y)?), Tolerance::F32)),
            ("rstd".to_string(), (f(&[rows], &rstd), Tolerance::F32)),
        ]),
    )?;
    let y = tap(y, on(1))?;
    Ok((h, y))
}

/// The backward records of an RMSNorm of `h` with `w` given the gradient `dy` of its output
/// (and, for the add variant, `dh`, the gradient `h` received in total): `rmsnorm_bwd` expects
/// the composition's gradient of `h` as `dx`; `rmsnorm_add_bwd` gets `dres = dh − that` and
/// expects `dh`; both expect the per-program partials of `Σ dy · h · rstd` (float64 over each
/// program's rows) as `dw_part`; `rmsnorm_dw` sums those partials and expects the composition's
/// weight gradient.
fn record_norm_bwd(
    s: &rmsnorm::RmsNorm,
    eps: f64,
    h: &Tensor,
    w: &Tensor,
    dh: Option<&Tensor>,
    dy: &Tensor,
) -> Result<()> {
    let (rows, cols) = (s.rows, s.cols);
    let (hv, wv) = (Var::from_tensor(h)?, Var::from_tensor(w)?);
    let y2 = crate::ops::rms_norm(hv.as_tensor(), wv.as_tensor(), eps)?;
    let grads = (y2 * dy.detach())?.sum_all()?.backward()?;
    let grad = |v: &Var| -> Result<Tensor> {
        Ok(match grads.get(v.as_tensor()) {
            Some(g) => g.clone(),
            None => v.as_tensor().zeros_like()?,
        })
    };
    let g = grad(&hv)?;
    let (dres, dx) = match dh {
        Some(total) => (Some((total - &g)?), total.clone()),
        None => (None, g),
    };
    let dw = grad(&wv)?;
    let (hh, dyh) = (host_f32(h)?, host_f32(dy)?);
    let rstd: Vec<f32> = rstd_of(&hh, cols, s.eps)
        .iter()
        .map(|v| *v as f32)
        .collect();
    let parts = rows.div_ceil(s.rows_per_prog);
    let mut dw_part = vec![0f64; parts * cols];
    for i in 0..rows {
        let p = i / s.rows_per_prog;
        for c in 0..cols {
            let n = hh[i * cols + c] as f64 * rstd[i] as f64;
            dw_part[p * cols + c] += dyh[i * cols + c] as f64 * n;
        }
    }
    let dw_part: Vec<f32> = dw_part.iter().map(|v| *v as f32).collect();
    let rc = [rows, cols];
    let kernel = if dres.is_some() { "add_bwd" } else { "bwd" };
    let name = rmsnorm::variant(kernel, triton::DType::Fp32, cols).map_err(terr)?;
    let mut buffers = Buffers::from([
        ("dy".to_string(), f(&rc, &dyh)),
        ("h".to_string(), f(&rc, &hh)),
        ("w".to_string(), f(&[cols], &host_f32(w)?)),
        ("rstd".to_string(), f(&[rows], &rstd)),
        ("dx".to_string(), zeros(&rc)),
        ("dw_part".to_string(), zeros(&[parts, cols])),
    ]);
    if let Some(d) = &dres {
        buffers.insert("dres".to_string(), f(&rc, &host_f32(d)?));
    }
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| rmsnorm::plan(e, s),
        buffers,
        Expected::from([
            ("dx".to_string(), (f(&rc, &host_f32(&dx)?), BWD_TOL)),
            (
                "dw_part".to_string(),
                (f(&[parts, cols], &dw_part), BWD_TOL),
            ),
        ]),
    )?;
    let name = rmsnorm::variant("dw", triton::DType::Fp32, cols).map_err(terr)?;
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| rmsnorm::plan(e, s),
        Buffers::from([
            ("dw_part".to_string(), f(&[parts, cols], &dw_part)),
            ("dw".to_string(), zeros(&[cols])),
        ]),
        Expected::from([("dw".to_string(), (f(&[cols], &host_f32(&dw)?), BWD_TOL))]),
    )
}

/// [`super::swiglu`] under the recorder: records `swiglu_fwd` now and `swiglu_bwd` (the
/// composition's gradients of `g` and `u` for the incoming gradient of `a`) when it arrives.
pub(super) fn swiglu(g: &Tensor, u: &Tensor, a: Tensor) -> Result<Tensor> {
    if !recording() || g.dtype() != DType::F32 || u.dtype() != DType::F32 || g.elem_count() == 0 {
        return Ok(a);
    }
    let (rows, cols) = rows_cols(g);
    let s = sw::Swiglu { rows, cols };
    let rc = [rows, cols];
    let name = sw::variant("fwd", triton::DType::Fp32);
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| sw::plan(e, &s),
        Buffers::from([
            ("g".to_string(), f(&rc, &host_f32(g)?)),
            ("u".to_string(), f(&rc, &host_f32(u)?)),
            ("a".to_string(), zeros(&rc)),
        ]),
        Expected::from([("a".to_string(), (f(&rc, &host_f32(&a)?), Tolerance::F32))]),
    )?;
    let (g, u) = (g.detach(), u.detach());
    tap(a, move |da| {
        let (gv, uv) = (Var::from_tensor(&g)?, Var::from_tensor(&u)?);
        let a2 = (gv.as_tensor().silu()? * uv.as_tensor())?;
        let grads = (a2 * da.detach())?.sum_all()?.backward()?;
        let grad = |v: &Var| grad_host(&grads, v);
        let name = sw::variant("bwd", triton::DType::Fp32);
        write_picked(
            &format!("model_{name}"),
            &name,
            |e| sw::plan(e, &s),
            Buffers::from([
                ("g".to_string(), f(&rc, &host_f32(&g)?)),
                ("u".to_string(), f(&rc, &host_f32(&u)?)),
                ("da".to_string(), f(&rc, &host_f32(da)?)),
                ("dg".to_string(), zeros(&rc)),
                ("du".to_string(), zeros(&rc)),
            ]),
            Expected::from([
                ("dg".to_string(), (f(&rc, &grad(&gv)?), BWD_TOL)),
                ("du".to_string(), (f(&rc, &grad(&uv)?), BWD_TOL)),
            ]),
        )
    })
}

/// Two taps' callbacks: `on_both(first, second)` runs once both gradients arrived (in either
/// order).
#[allow(clippy::type_complexity)]
fn pair(
    on_both: impl Fn(&Tensor, &Tensor) -> Result<()> + Send + Sync + 'static,
) -> (
    impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
) {
    let state: Arc<Mutex<[Option<Tensor>; 2]>> = Arc::new(Mutex::new([None, None]));
    let on_both = Arc::new(on_both);
    let slot = move |i: usize| {
        let (state, on_both) = (state.clone(), on_both.clone());
        move |g: &Tensor| -> Result<()> {
            let both = {
                let mut p = state.lock().unwrap_or_else(|e| e.into_inner());
                p[i] = Some(g.detach());
                match &*p {
                    [Some(a), Some(b)] => Some((a.clone(), b.clone())),
                    _ => None,
                }
            };
            match both {
                Some((a, b)) => on_both(&a, &b),
                None => Ok(()),
            }
        }
    };
    (slot(0), slot(1))
}

/// [`super::rotary`] on the CPU: the composition (`crate::ops::rope` of q, then of k). Under
/// the recorder (f32, head dim 64 or 128) it also records `rotary_fwd` over q and k at once
/// (the f32 tables, each token's position) and, once the gradients of both rotated tensors
/// arrived, `rotary_bwd` with the composition's gradients of q and k as the expected values.
pub(super) fn rotary(
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    fr: &super::FusedRope,
) -> Result<(Tensor, Tensor)> {
    use crate::ops::rope;
    use rlvr_kernels::triton::families::rotary as ro;
    let q_rot = rope(q, cos, sin)?;
    let k_rot = rope(k, cos, sin)?;
    let (b, t, nh, hd) = q.dims4()?;
    let nkv = k.dim(2)?;
    if !recording() || q.dtype() != DType::F32 || !(hd == 64 || hd == 128) || b * t == 0 {
        return Ok((q_rot, k_rot));
    }
    let n = b * t;
    let s = ro::Rotary {
        tokens: n,
        q_heads: nh,
        kv_heads: nkv,
        head_dim: hd,
    };
    let (cos32, sin32) = (host_f32(&fr.cos)?, host_f32(&fr.sin)?);
    let table = [cos32.len() / hd, hd];
    let pos = fr.pos_host.clone();
    let (sq, sk) = ([n, nh, hd], [n, nkv, hd]);
    let common = move || {
        Buffers::from([
            ("cos".to_string(), f(&table, &cos32)),
            ("sin".to_string(), f(&table, &sin32)),
            ("pos".to_string(), HostBuffer::i32(&[n], &pos)),
        ])
    };
    let name = ro::variant("fwd", triton::DType::Fp32, hd);
    let mut buffers = common();
    buffers.extend([
        ("q".to_string(), f(&sq, &host_f32(q)?)),
        ("k".to_string(), f(&sk, &host_f32(k)?)),
        ("q_out".to_string(), zeros(&sq)),
        ("k_out".to_string(), zeros(&sk)),
    ]);
    write_picked(
        &format!("model_{name}"),
        &name,
        |e| ro::plan(e, &s),
        buffers,
        Expected::from([
            (
                "q_out".to_string(),
                (f(&sq, &host_f32(&q_rot)?), Tolerance::F32),
            ),
            (
                "k_out".to_string(),
                (f(&sk, &host_f32(&k_rot)?), Tolerance::F32),
            ),
        ]),
    )?;
    let (qd, kd, cd, sd) = (q.detach(), k.detach(), cos.detach(), sin.detach());
    let (on_q, on_k) = pair(move |dq, dk| {
        let (qv, kv) = (Var::from_tensor(&qd)?, Var::from_tensor(&kd)?);
        let loss = ((rope(qv.as_tensor(), &cd, &sd)? * dq)?.sum_all()?
            + (rope(kv.as_tensor(), &cd, &sd)? * dk)?.sum_all()?)?;
        let grads = loss.backward()?;
        let grad = |v: &Var| grad_host(&grads, v);
        let name = ro::variant("bwd", triton::DType::Fp32, hd);
        let mut buffers = common();
        buffers.extend([
            ("dq".to_string(), f(&sq, &host_f32(dq)?)),
            ("dk".to_string(), f(&sk, &host_f32(dk)?)),
            ("dq_out".to_string(), zeros(&sq)),
            ("dk_out".to_string(), zeros(&sk)),
        ]);
        write_picked(
            &format!("model_{name}"),
            &name,
            |e| ro::plan(e, &s),
            buffers,
            Expected::from([
                ("dq_out".to_string(), (f(&sq, &grad(&qv)?), BWD_TOL)),
                ("dk_out".to_string(), (f(&sk, &grad(&kv)?), BWD_TOL)),
            ]),
        )
    });
    Ok((tap(q_rot, on_q)?, tap(k_rot, on_k)?))
}
