"""SwiGLU's gating (kernels/src/swiglu.py) under the interpreter.

References: a numpy emulation of rlvr's CPU path (candle's ``silu`` then ``g * u``, with its bf16
roundings) and float64. Measured (seed 0; kernels/README.md, "SwiGLU gating"): the forward
bit-identical to the emulation in f32 and bf16 (the interpreter's exp is numpy's, as the
emulation's); f32 forward within 2.2e-7 of float64 per element, du 6e-8, dg 2.7e-7 of its terms'
scale; bf16 backward within one bf16 rounding (2^-8 relative) of float64.
"""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src import swiglu as K

RNG = np.random.default_rng(0)
f32 = np.float32


def _t(a, dt):
    return Tensor(bf16(a), bf16=True) if dt == "bf16" else Tensor(np.asarray(a, np.float32))


def _f(t):
    return (from_bf16(t.arr) if t.arr.dtype == np.uint16 else t.arr).astype(np.float64)


def _rb(a):
    return from_bf16(bf16(a))


def _grid(rows, cols):
    return (rows, -(-cols // K.BLOCK))


def emulate_silu(g, dt):
    """candle's silu: f32 ``g / (1 + exp(−g))``; bf16 ``v / (bf16::ONE + (−v).exp())`` in bf16 ops."""
    g = np.asarray(g, f32)
    if dt == "bf16":
        return _rb(g / _rb(f32(1) + _rb(np.exp(-g))))
    return g / (f32(1) + np.exp(-g))


def emulate_forward(g, u, dt):
    rnd = _rb if dt == "bf16" else (lambda a: np.asarray(a, f32))
    g, u = rnd(g), rnd(u)
    return rnd(emulate_silu(g, dt) * u)


def _inputs(rows, cols):
    g = (3.0 * RNG.standard_normal((rows, cols))).astype(f32)
    g.flat[:6] = [0.0, -1.2784645, 30.0, -30.0, -100.0, 100.0]  # 0, dsilu's zero, saturation
    u = RNG.standard_normal((rows, cols)).astype(f32)
    da = RNG.standard_normal((rows, cols)).astype(f32)
    return g, u, da


SHAPES = [(7, 4864), (3, 1000), (1, 1), (5, 1025)]
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(100) in f32


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_forward(rows, cols, dt):
    g, u, _ = _inputs(rows, cols)
    a = _t(np.zeros_like(g), dt)
    K.swiglu_fwd_kernel[_grid(rows, cols)](_t(g, dt), _t(u, dt), a, cols, BLOCK=K.BLOCK)
    assert np.array_equal(_f(a), emulate_forward(g, u, dt).astype(np.float64))
    if dt == "f32":
        g64, u64 = g.astype(np.float64), u.astype(np.float64)
        r = g64 / (1 + np.exp(-g64)) * u64
        # + 1e-30: silu(−100) underflows to −0 (exp(100) is inf in f32), on the CPU too
        assert (np.abs(_f(a) - r) <= 4e-7 * np.abs(r) + 1e-30).all()


@pytest.mark.parametrize("rows,cols", SHAPES)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_backward(rows, cols, dt):
    g, u, da = _inputs(rows, cols)
    dg, du = _t(np.zeros_like(g), dt), _t(np.zeros_like(g), dt)
    K.swiglu_bwd_kernel[_grid(rows, cols)](_t(g, dt), _t(u, dt), _t(da, dt), dg, du, cols,
                                           BLOCK=K.BLOCK)
    rnd = _rb if dt == "bf16" else (lambda a: np.asarray(a, f32))
    g64, u64, da64 = (rnd(v).astype(np.float64) for v in (g, u, da))
    sig = 1.0 / (1.0 + np.exp(-g64))
    dg_ref = da64 * u64 * sig * (1.0 + g64 * (1.0 - sig))
    # du's factor is the silu the forward multiplied by (bf16: candle's rounded silu)
    du_ref = da64 * emulate_silu(rnd(g), dt).astype(np.float64)
    # dg's terms: |da·u|·σ·(1 + |g|(1 − σ)); f32 error is relative to them (dg crosses zero)
    dg_scale = np.abs(da64 * u64) * sig * (1.0 + np.abs(g64) * (1.0 - sig))
    if dt == "f32":
        assert (np.abs(_f(du) - du_ref) <= 2.0**-24 * np.abs(du_ref) + 1e-30).all()
        assert (np.abs(_f(dg) - dg_ref) <= 5e-7 * dg_scale + 1e-30).all()
    else:
        # du: a product of two bf16 values (exact in f32), rounded once to bf16
        assert (np.abs(_f(du) - du_ref) <= 2.0**-8 * np.abs(du_ref) + 1e-30).all()
        # dg: f32 arithmetic (~1e-6 of its terms, exp's error included) then one rounding
        assert (np.abs(_f(dg) - dg_ref) <= 2.0**-8 * np.abs(dg_ref) + 1e-6 * dg_scale + 1e-30).all()


def test_backward_in_place():
    g, u, da = _inputs(3, 1000)
    ref_dg, ref_du = _t(np.zeros_like(g), "bf16"), _t(np.zeros_like(g), "bf16")
    K.swiglu_bwd_kernel[_grid(3, 1000)](_t(g, "bf16"), _t(u, "bf16"), _t(da, "bf16"), ref_dg, ref_du,
                                        1000, BLOCK=K.BLOCK)
    gt, ut = _t(g, "bf16"), _t(u, "bf16")
    K.swiglu_bwd_kernel[_grid(3, 1000)](gt, ut, _t(da, "bf16"), gt, ut, 1000, BLOCK=K.BLOCK)
    assert np.array_equal(gt.arr, ref_dg.arr) and np.array_equal(ut.arr, ref_du.arr)


def test_variants():
    from kernels.tests.check_variants import check
    check(K, "swiglu_")
