"""Rotary embedding (kernels/src/rotary.py) under the interpreter.

References: a numpy emulation of rlvr's CPU op (``layers.rs``: f32 tables cast to the dtype, two
products and a sum each rounded to the dtype) and float64. Measured (seed 0; kernels/README.md,
"Rotary embedding"): the forward bit-identical to the emulation in f32 and in bf16; f32 forward and
backward within 9.7e-8 of float64 relative to the head's max |x|; bf16 backward within one bf16
rounding (2^-8 relative) of float64.
"""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src import rotary as K

RNG = np.random.default_rng(0)


def tables(max_pos, hd, theta=1e6):
    """rlvr's tables (``Rotary::table``): a = p · inv_freq in f32, cos/sin in f32, the half repeated."""
    inv = (1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)).astype(np.float32)
    a = np.arange(max_pos, dtype=np.float32)[:, None] * inv[None, :]
    a = np.concatenate([a, a], 1)
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


def _t(a, dt):
    return Tensor(bf16(a), bf16=True) if dt == "bf16" else Tensor(np.asarray(a, np.float32))


def _f(t):
    return (from_bf16(t.arr) if t.arr.dtype == np.uint16 else t.arr).astype(np.float64)


def run(kernel, q, k, cos, sin, pos, dt, in_place=False):
    n, hq, d = q.shape
    qi, ki = _t(q, dt), _t(k, dt)
    qo, ko = (qi, ki) if in_place else (_t(np.zeros_like(q), dt), _t(np.zeros_like(k), dt))
    kernel[(n,)](qi, ki, qo, ko, Tensor(cos), Tensor(sin), Tensor(pos.astype(np.int32)), hq,
                 k.shape[1], HEAD_DIM=d, HEAD_BLOCK=K.head_block(d))
    return qo, ko


def emulate_forward(x, cos, sin, pos, dt):
    """rlvr's CPU op: x·cos + rotate_half(x)·sin, each of the three tensors in the dtype."""
    rnd = (lambda a: from_bf16(bf16(a))) if dt == "bf16" else (lambda a: a.astype(np.float32))
    x = rnd(x)
    c, s = rnd(cos[pos])[:, None, :], rnd(sin[pos])[:, None, :]
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], -1)
    return rnd(rnd(x * c) + rnd(rot * s))


def ref(x, cos, sin, pos, transpose):
    """float64: the rotation, or its transpose (dx = c·dy − rotate_half(s·dy))."""
    c, s = cos[pos][:, None, :].astype(np.float64), sin[pos][:, None, :].astype(np.float64)
    h = x.shape[-1] // 2
    rh = lambda v: np.concatenate([-v[..., h:], v[..., :h]], -1)
    return c * x - rh(s * x) if transpose else c * x + rh(x) * s


CASES = [  # (tokens, q heads, kv heads, head dim)
    (11, 14, 2, 64),
    (7, 9, 3, 128),
    (1, 1, 1, 128),
    (5, 28, 4, 128),
]


def _inputs(n, hq, hkv, d, max_pos=4096):
    cos, sin = tables(max_pos, d)
    pos = RNG.integers(0, max_pos, n)
    pos[n // 2:] = pos[: n - n // 2][::-1]  # repeated and out of order
    q = RNG.standard_normal((n, hq, d)).astype(np.float32)
    k = RNG.standard_normal((n, hkv, d)).astype(np.float32)
    return q, k, cos, sin, pos


@pytest.mark.parametrize("n,hq,hkv,d", CASES)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_forward(n, hq, hkv, d, dt):
    q, k, cos, sin, pos = _inputs(n, hq, hkv, d)
    qo, ko = run(K.rotary_fwd_kernel, q, k, cos, sin, pos, dt)
    for x, out in ((q, qo), (k, ko)):
        emul = emulate_forward(x, cos, sin, pos, dt)
        # bit-identical: elementwise, the same correctly rounded ops in the same order as the CPU
        assert np.array_equal(_f(out), emul.astype(np.float64))
        if dt == "f32":
            r = ref(x.astype(np.float64), cos, sin, pos, False)
            scale = np.abs(x).max(-1, keepdims=True)
            assert (np.abs(_f(out) - r) <= 2e-7 * scale).all()


@pytest.mark.parametrize("n,hq,hkv,d", CASES)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_backward(n, hq, hkv, d, dt):
    dq, dk, cos, sin, pos = _inputs(n, hq, hkv, d)
    gq, gk = run(K.rotary_bwd_kernel, dq, dk, cos, sin, pos, dt)
    rnd = (lambda a: from_bf16(bf16(a))) if dt == "bf16" else (lambda a: a)
    for g, out in ((dq, gq), (dk, gk)):
        # the transpose of the forward's Jacobian, from the tables the forward used (bf16: rounded)
        r = ref(rnd(g).astype(np.float64), rnd(cos), rnd(sin), pos, True)
        err = np.abs(_f(out) - r)
        if dt == "f32":
            assert (err <= 2e-7 * np.abs(g).max(-1, keepdims=True)).all()
        else:
            # the products of bf16 values are exact in f32, the sum is rounded once in f32 and
            # once to bf16: within 2^-8 of the value (plus the f32 rounding, 2^-24)
            assert (err <= (2.0**-8 + 2.0**-23) * np.abs(r)).all()


def test_backward_is_the_transpose():
    """<rope(x), y> = <x, ropeᵀ(y)> (float64 check of the f32 kernels)."""
    n, hq, hkv, d = 6, 4, 2, 64
    x, kx, cos, sin, pos = _inputs(n, hq, hkv, d)
    y, ky, _, _, _ = _inputs(n, hq, hkv, d)
    sin = sin * 1.25  # a table whose halves differ from the rotation's would still be transposed
    sin[:, : d // 2] *= 0.5
    fx, _ = run(K.rotary_fwd_kernel, x, kx, cos, sin, pos, "f32")
    by, _ = run(K.rotary_bwd_kernel, y, ky, cos, sin, pos, "f32")
    lhs = (_f(fx) * y).sum()
    rhs = (x * _f(by)).sum()
    assert abs(lhs - rhs) <= 1e-5 * (np.abs(x).sum() + np.abs(y).sum())


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_in_place(dt):
    q, k, cos, sin, pos = _inputs(9, 9, 3, 128)
    qo, ko = run(K.rotary_fwd_kernel, q, k, cos, sin, pos, dt)
    qi, ki = run(K.rotary_fwd_kernel, q, k, cos, sin, pos, dt, in_place=True)
    assert np.array_equal(qi.arr, qo.arr) and np.array_equal(ki.arr, ko.arr)


def test_q_only():
    """n_kh = 0 leaves k alone (rotating q alone)."""
    q, k, cos, sin, pos = _inputs(3, 2, 1, 64)
    qo, ko = _t(np.zeros_like(q), "f32"), _t(np.full_like(k, 7.0), "f32")
    K.rotary_fwd_kernel[(3,)](_t(q, "f32"), ko, qo, ko, Tensor(cos), Tensor(sin),
                              Tensor(pos.astype(np.int32)), 2, 0, HEAD_DIM=64, HEAD_BLOCK=16)
    assert (ko.arr == 7.0).all()
    assert np.array_equal(qo.arr, emulate_forward(q, cos, sin, pos, "f32"))


def test_variants():
    from kernels.tests.check_variants import check
    check(K, "rotary_")
