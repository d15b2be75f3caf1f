//! Differentiable building blocks of the decoder, written with candle-core ops that all have a
//! backward (candle-nn's fused versions do not: DESIGN.md section 7).

use candle_core::{DType, Tensor, D};

use crate::error::Result;

/// The dtype reductions (norms, softmax, log-softmax) run in: f64 for f64, else f32.
pub fn upcast(dt: DType) -> DType {
    if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// `x · wᵀ + b` over the last dimension: x `[.., in]`, w `[out, in]`, b `[out]` → `[.., out]`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    // x: [.., in], w: [out, in]
    let dims = x.dims().to_vec();
    let inner = *dims.last().unwrap();
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let y = x.reshape((rows, inner))?.matmul(&w.t()?)?;
    let y = match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut out = dims;
    *out.last_mut().unwrap() = w.dim(0)?;
    Ok(y.reshape(out)?)
}

/// RMSNorm over the last dimension, computed in f32 as transformers does, then cast back:
/// `w · x / sqrt(mean(x²) + eps)`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let dt = x.dtype();
    let xf = x.to_dtype(upcast(dt))?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xf.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(y.to_dtype(dt)?.broadcast_mul(w)?)
}

/// Gemma's RMSNorm over the last dimension (transformers' `Gemma2RMSNorm`): normalised in f32,
/// multiplied by `1 + w` in f32, then cast back (the product happens before the cast, unlike
/// [`rms_norm`]).
pub fn rms_norm_plus_one(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let dt = x.dtype();
    let up = upcast(dt);
    let xf = x.to_dtype(up)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let y = xf.broadcast_div(&(var + eps)?.sqrt()?)?;
    let scale = (w.to_dtype(up)? + 1.0)?;
    Ok(y.broadcast_mul(&scale)?.to_dtype(dt)?)
}

/// transformers' `rotate_half`: `[x1, x2] → [−x2, x1]` over the last dimension.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    Ok(Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?)
}

/// `c`, a constant operand of a broadcast binary op whose other operand is `x`, as the backward
/// should see it: unchanged when `x` carries no graph; when it does, a leaf variable holding a
/// copy of `c` (same values, so the forward is unchanged).
///
/// Why: candle's backward (`Tensor::backward`, candle-core 0.11) gives both operands of a binary
/// op a gradient in its store, the constant one too, at the op's full (broadcast) shape; a
/// constant's broadcast is no node of the graph, so that gradient is never consumed and stays
/// alive until the backward ends, one per op. For the attention's mask and row maxima that was
/// two `[B, heads, T, S]` f32 tensors per layer, held at the backward's peak (docs/memory.md: 527
/// MiB for 16 rows of SmolLM2-135M with 253-token prompts). As a variable, the constant's
/// broadcast is a node: its full-size gradient is summed down to `c`'s shape (kept: `c`'s size)
/// and freed at once. The other operand's gradient is computed as before, bit for bit.
///
/// Errors: the copy's.
pub fn constant_operand(x: &Tensor, c: &Tensor) -> Result<Tensor> {
    if !x.track_op() {
        return Ok(c.clone());
    }
    Ok(candle_core::Var::from_tensor(&c.detach())?.into_inner())
}

/// Applies the rotary embedding to `x` `[B, T, heads, hd]` with cos/sin `[B, T, 1, rd]`,
/// `rd ≤ hd`: the first `rd` dimensions of each head rotate and the other `hd − rd` pass
/// through unchanged (partial rotary, transformers' `apply_rotary_pos_emb` with `rotary_dim =
/// cos.shape[-1]`).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let (cos, sin) = (&constant_operand(x, cos)?, &constant_operand(x, sin)?);
    let (hd, rd) = (x.dim(D::Minus1)?, cos.dim(D::Minus1)?);
    if rd < hd {
        let rot = x.narrow(D::Minus1, 0, rd)?;
        let pass = x.narrow(D::Minus1, rd, hd - rd)?;
        let rot = (rot.broadcast_mul(cos)? + rotate_half(&rot)?.broadcast_mul(sin)?)?;
        return Ok(Tensor::cat(&[&rot, &pass], D::Minus1)?);
    }
    Ok((x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?)?)
}

/// Numerically stable log-softmax over the last dimension (differentiable).
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let m = constant_operand(x, &x.max_keepdim(D::Minus1)?.detach())?;
    let z = x.broadcast_sub(&m)?;
    let lse = z.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(z.broadcast_sub(&lse)?)
}

/// Numerically stable softmax over the last dimension (differentiable).
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    let m = constant_operand(x, &x.max_keepdim(D::Minus1)?.detach())?;
    let e = x.broadcast_sub(&m)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}
