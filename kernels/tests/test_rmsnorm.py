"""RMSNorm with the residual add (kernels/src/rmsnorm.py) under the interpreter.

References: float64 numpy for the math; for bf16's forward, a numpy emulation of rlvr's exact cast
sequence (``ops::rms_norm`` and the decoder's residual add). Measured (seed 0, these shapes):
see kernels/README.md ("RMSNorm"): f32 forward 2.2e-7 relative per element, backward 1.5e-7 of
the terms; bf16 h and y bit-identical to the emulation (y within 2 bf16 ulps, in 2e-4 of the
elements, when the sum of squares is added in another order); bf16 backward within one bf16
rounding (2^-8 relative) of float64.
"""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src import rmsnorm as K

EPS = 1e-6
RNG = np.random.default_rng(0)


def _t(a, dt):
    return Tensor(bf16(a), bf16=True) if dt == "bf16" else Tensor(np.asarray(a, np.float32))


def _f(t):
    """A kernel buffer's values as float64."""
    return (from_bf16(t.arr) if t.arr.dtype == np.uint16 else t.arr).astype(np.float64)


def _q(a, dt):
    """The values an array has once stored in dtype ``dt`` (as float64)."""
    return _f(_t(a, dt))


def _zeros(shape, dt):
    return Tensor(np.zeros(shape, np.uint16), bf16=True) if dt == "bf16" else Tensor(np.zeros(shape, np.float32))


def forward(x, w, dt, residual=None):
    rows, n = x.shape
    y, h, rstd = _zeros((rows, n), dt), _zeros((rows, n), dt), Tensor(np.zeros(rows, np.float32))
    blk = K.block_for(n)
    if residual is None:
        K.rmsnorm_fwd_kernel[(rows,)](_t(x, dt), _t(w, dt), y, rstd, n, EPS, BLOCK=blk)
        h = _t(x, dt)
    else:
        K.rmsnorm_add_fwd_kernel[(rows,)](_t(x, dt), _t(residual, dt), _t(w, dt), h, y, rstd, n, EPS,
                                          BLOCK=blk)
    return h, y, rstd


def backward(dy, h, w, rstd, dt, rows_per_prog, dres=None, dw_dt=None, dw_tile=(1024, 4)):
    """The row kernel, then the dw kernel; ``dw_tile`` (BLOCK, UNROLL) of the dw kernel: larger
    than the variants' (64, 16) by default, fewer programs for the interpreter, the same sum
    (test_dw_fixed_order runs the variants' own)."""
    rows, n = dy.shape
    parts = -(-rows // rows_per_prog)
    dx, part = _zeros((rows, n), dt), Tensor(np.zeros((parts, n), np.float32))
    blk = K.block_for(n)
    if dres is None:
        K.rmsnorm_bwd_kernel[(parts,)](_t(dy, dt), h, _t(w, dt), rstd, dx, part, rows, n,
                                       rows_per_prog, BLOCK=blk)
    else:
        K.rmsnorm_add_bwd_kernel[(parts,)](_t(dy, dt), h, _t(w, dt), rstd, _t(dres, dt), dx, part,
                                           rows, n, rows_per_prog, BLOCK=blk)
    dw = _zeros(n, dw_dt or dt)
    blk, unroll = dw_tile
    K.rmsnorm_dw_kernel[(-(-n // blk),)](part, dw, parts, n, BLOCK=blk, UNROLL=unroll)
    return dx, part, dw


def ref_forward(h, w):
    """float64: y = h / sqrt(mean(h²) + eps) · w, and rstd."""
    r = 1.0 / np.sqrt((h * h).mean(-1, keepdims=True) + EPS)
    return h * r * w, r[:, 0]


def ref_backward(h, w, dy, dres, n_factor):
    """float64 gradients; ``n_factor`` is what the forward multiplied w by (bf16: dtype(n)).

    Also each row's scale of the terms dx is made of (max of r·(|dn| + |n·c|) + |dres|): dx itself
    can be far smaller (hidden 1: dx = r·dn·eps/(h² + eps)), and an f32 computation's error is
    relative to the terms, not to their difference.
    """
    r = 1.0 / np.sqrt((h * h).mean(-1, keepdims=True) + EPS)
    n = h * r
    dn = dy * w
    c = (dn * n).mean(-1, keepdims=True)
    extra = 0.0 if dres is None else dres
    dx = r * (dn - n * c) + extra
    scale = (r * (np.abs(dn) + np.abs(n * c)) + np.abs(extra)).max(-1, keepdims=True)
    return dx, (dy * n_factor).sum(0), scale


def emulate_bf16_forward(x, w, residual, sequential=False):
    """rlvr's CPU op in bf16, step by step (f32 arithmetic, bf16 roundings where candle rounds).

    The sum of squares is numpy's pairwise f32 sum (the interpreter's ``tl.sum`` too), or with
    ``sequential`` a left-to-right f32 sum: another order, as the GPU's tree and candle's AVX lanes.
    """
    f32 = np.float32
    hb = from_bf16(bf16(x))
    if residual is not None:
        hb = from_bf16(bf16(hb + from_bf16(bf16(residual))))  # bf16 + bf16: f32 add, one rounding
    sq = hb * hb
    ss = np.cumsum(sq, -1, dtype=f32)[:, -1:] if sequential else sq.sum(-1, dtype=f32, keepdims=True)
    ms = ss * f32(1.0 / hb.shape[-1])  # candle's mean: sum · f32(1/n)
    s = np.sqrt(ms + f32(EPS))
    n = hb / s  # f32 division
    y = from_bf16(bf16(from_bf16(bf16(n)) * from_bf16(bf16(w))))  # to_dtype(bf16), then · w in bf16
    return hb, y, n, (f32(1) / s)[:, 0]


def _inputs(rows, n):
    x = RNG.standard_normal((rows, n)).astype(np.float32)
    res = (2.0 * RNG.standard_normal((rows, n))).astype(np.float32)
    w = (1.0 + 0.2 * RNG.standard_normal(n)).astype(np.float32)
    dy = RNG.standard_normal((rows, n)).astype(np.float32)
    dres = RNG.standard_normal((rows, n)).astype(np.float32)
    return x, res, w, dy, dres


SHAPES = [(37, 896), (5, 576), (1, 1), (3, 8192), (9, 128)]


def test_mean_scale_matches_candle():
    # candle's mean multiplies by f32(1/n) computed in f64; the kernel computes 1/n in f32 (div_rn).
    n = np.arange(1, 8193)
    assert np.array_equal((1.0 / n).astype(np.float32), np.float32(1) / n.astype(np.float32))


def test_block_classes():
    assert [K.block_for(n) for n in (1, 128, 129, 896, 1024, 1536, 3584, 5120, 8192)] == \
        [128, 128, 1024, 1024, 1024, 2048, 4096, 8192, 8192]
    with pytest.raises(ValueError):
        K.block_for(8193)


@pytest.mark.parametrize("rows,n", SHAPES)
@pytest.mark.parametrize("add", [True, False])
def test_f32(rows, n, add):
    x, res, w, dy, dres = _inputs(rows, n)
    h, y, rstd = forward(x, w, "f32", res if add else None)
    h64 = x.astype(np.float64) + (res if add else 0.0)
    # f32: h = x + residual is one correctly rounded f32 add, as on the CPU.
    assert np.array_equal(h.arr, x + res if add else x)
    y_ref, r_ref = ref_forward(h.arr.astype(np.float64), w.astype(np.float64))
    rel = np.abs(_f(y) - y_ref) / np.maximum(np.abs(y_ref), 1e-30)
    assert rel.max() < 1e-6, rel.max()
    assert np.abs(_f(rstd) / r_ref - 1).max() < 1e-6
    # against the f64 value of the unrounded sum too (h's own rounding is the CPU's, not an error)
    assert np.abs(h.arr - h64).max() <= 2.0**-23 * np.abs(h64).max()

    rpp = 4
    dx, part, dw = backward(dy, h, w, rstd, "f32", rpp, dres if add else None)
    hf = h.arr.astype(np.float64)
    dx_ref, dw_ref, scale = ref_backward(hf, w.astype(np.float64), dy.astype(np.float64),
                                         dres.astype(np.float64) if add else None,
                                         ref_forward(hf, 1.0)[0])
    assert (np.abs(_f(dx) - dx_ref) <= 1e-6 * scale).all()
    assert np.abs(_f(dw) - dw_ref).max() <= 1e-6 * np.abs(dw_ref).max()


@pytest.mark.parametrize("rows,n", SHAPES)
@pytest.mark.parametrize("add", [True, False])
def test_bf16(rows, n, add):
    x, res, w, dy, dres = _inputs(rows, n)
    h, y, rstd = forward(x, w, "bf16", res if add else None)
    hb, y_emul, n_emul, rstd_emul = emulate_bf16_forward(x, w, res if add else None)
    assert np.array_equal(from_bf16(h.arr), hb)  # one rounding of an f32 add: bit-identical
    assert np.abs(rstd.arr / rstd_emul - 1).max() < 1e-6
    # y: bit-identical to the emulation with the same order of the sum of squares (the cast
    # sequence is the CPU's) ...
    assert np.array_equal(from_bf16(y.arr), y_emul)
    # ... and with another order, s may differ in its last bit, which moves n = h/s across a bf16
    # rounding boundary in a rare element: dtype(n) is 1 ulp off there, and y = dtype(n)·w up to
    # 2 ulps (w's significand, up to 2, scales the step)
    _, y_seq, n_seq, _ = emulate_bf16_forward(x, w, res if add else None, sequential=True)
    ulp = np.abs(y.arr.astype(np.int32) - bf16(y_seq).astype(np.int32))
    assert ulp.max() <= 2 and (ulp != 0).mean() < 1e-3

    dx, part, dw = backward(dy, h, w, rstd, "bf16", 3, dres if add else None)
    h64, w64, dy64 = _f(h), _q(w, "bf16"), _q(dy, "bf16")
    nb = from_bf16(bf16(n_emul)).astype(np.float64)
    dx_ref, dw_ref, scale = ref_backward(h64, w64, dy64, _q(dres, "bf16") if add else None, nb)
    # dx: f32 arithmetic (error ~1e-7 of the row's terms), then one rounding to bf16 (≤ 2^-8 relative)
    err = np.abs(_f(dx) - dx_ref)
    assert (err <= 2.0**-8 * np.abs(dx_ref) + 1e-6 * scale).all()
    # dw: f32 sums of dy · dtype(n), one rounding to bf16; and the backward's n = h · rstd may round
    # to a bf16 neighbour of the forward's n = h / s in a rare element (one term off by 2^-7)
    terms = np.abs(dy64 * nb)
    bound = 2.0**-8 * np.abs(dw_ref) + 2.0**-7 * terms.max(0) + 1e-6 * terms.sum(0)
    assert (np.abs(_f(dw) - dw_ref) <= bound).all()
    # the same partials written out in f32 (rmsnorm_dw_f32 serves bf16 models too)
    _, _, dw32 = backward(dy, h, w, rstd, "bf16", 3, dres if add else None, dw_dt="f32")
    assert (np.abs(_f(dw32) - dw_ref) <= 2.0**-7 * terms.max(0) + 1e-6 * terms.sum(0)).all()


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_dw_fixed_order(dt):
    """dw is the partials added in order 0..n_parts (bit for bit), and two runs are identical."""
    rows, n = 41, 896  # 21 partial rows: one full step of DW_UNROLL = 16, then 5 and 11 masked
    x, res, w, dy, dres = _inputs(rows, n)
    h, _, rstd = forward(x, w, dt, res)
    runs = [backward(dy, h, w, rstd, dt, 2, dres, dw_dt="f32", dw_tile=(K.DW_BLOCK, K.DW_UNROLL))
            for _ in range(2)]
    (dx1, p1, dw1), (dx2, p2, dw2) = runs
    assert p1.arr.shape == (21, n) and K.DW_UNROLL == 16
    assert np.array_equal(dx1.arr, dx2.arr) and np.array_equal(p1.arr, p2.arr)
    assert np.array_equal(dw1.arr, dw2.arr)
    seq = np.zeros(n, np.float32)
    for p in p1.arr:
        seq = seq + p
    assert np.array_equal(dw1.arr, seq)


def test_in_place():
    """h_out may alias residual (the residual stream updated in place), dx may alias dres."""
    rows, n = 6, 576
    x, res, w, dy, dres = _inputs(rows, n)
    ref_h, ref_y, ref_r = forward(x, w, "bf16", res)
    stream = _t(res, "bf16")
    y, rstd = _zeros((rows, n), "bf16"), Tensor(np.zeros(rows, np.float32))
    K.rmsnorm_add_fwd_kernel[(rows,)](_t(x, "bf16"), stream, _t(w, "bf16"), stream, y, rstd, n, EPS,
                                      BLOCK=K.block_for(n))
    assert np.array_equal(stream.arr, ref_h.arr) and np.array_equal(y.arr, ref_y.arr)
    ref_dx, _, _ = backward(dy, ref_h, w, ref_r, "bf16", 2, dres)
    g = _t(dres, "bf16")
    part = Tensor(np.zeros((3, n), np.float32))
    K.rmsnorm_add_bwd_kernel[(3,)](_t(dy, "bf16"), ref_h, _t(w, "bf16"), ref_r, g, g, part, rows, n, 2,
                                   BLOCK=K.block_for(n))
    assert np.array_equal(g.arr, ref_dx.arr)


def test_variants():
    from kernels.tests.check_variants import check
    check(K, "rmsnorm_")
