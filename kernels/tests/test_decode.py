"""The decode family (kernels/src/decode.py) under the interpreter against float64 numpy.

Attention error measure: ``max|got − ref| / max|ref|`` per row (normwise; the output is a convex
combination of value rows). Bounds asserted: f32 1e-6 against float64 (the issue's bound; measured
maxima printed with ``pytest -s`` and listed in kernels/README.md, "## Decode"); bf16 2e-2 against
float64 on the same bf16-rounded inputs (P is rounded to bf16 for the P·V product and the output
once more, as the training attention's bf16 variants). Rotary + cache write: bit-identical to the
emulation of rlvr's CPU op (tests/test_rotary.py's), the value copied bit for bit, every other
cache column left as it was.
"""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src import decode as K
from kernels.tests.test_rotary import emulate_forward, tables

RNG = np.random.default_rng(50)
SENTINEL = 777.0
MASK_BIAS = -1e30


def _t(a, dt):
    return Tensor(bf16(a), bf16=True) if dt == "bf16" else Tensor(np.asarray(a, np.float32))


def _f(t):
    return (from_bf16(t.arr) if t.arr.dtype == np.uint16 else t.arr).astype(np.float64)


def _rnd(a, dt):
    return from_bf16(bf16(a)).astype(np.float64) if dt == "bf16" else np.asarray(
        a, np.float32).astype(np.float64)


def _variant(name):
    return next(v for v in K.VARIANTS if v.name == name)


# ------------------------------------------------------------------------------------------------
# Attention


def attn_ref(q, kc, vc, bias, lens, scale):
    """float64: row b's query heads over its cache columns 0..lens[b], bias added to the scores."""
    b, hq, d = q.shape
    hk = kc.shape[1]
    rep = hq // hk
    o = np.zeros((b, hq, d))
    for r in range(b):
        n = lens[r]
        for h in range(hq):
            s = kc[r, h // rep, :n] @ q[r, h] * scale + bias[r, :n]
            p = np.exp(s - s.max())
            o[r, h] = (p / p.sum()) @ vc[r, h // rep, :n]
    return o


def run_attn(q, kc, vc, bias, lens, scale, dt, consts, n_splits=None):
    """Both kernels as the launcher runs them; returns (o [B, Hq, D] float64, the partials)."""
    b, hq, d = q.shape
    hk, cap = kc.shape[1], kc.shape[2]
    ns = n_splits or K.grid_splits(cap, consts["SPLIT_MIN"], consts["MAX_SPLITS"])
    o_part = Tensor(np.full((b, hq, ns, d), SENTINEL, np.float32))
    lse_part = Tensor(np.full((b, hq, ns), SENTINEL, np.float32))
    o = _t(np.full((b, hq, d), SENTINEL), dt)
    lens_t = Tensor(np.asarray(lens, np.int32))
    K.decode_attn_kernel[(b, hk, ns)](
        _t(q, dt), _t(kc, dt), _t(vc, dt), Tensor(np.asarray(bias, np.float32)), lens_t, o_part,
        lse_part, hq, hk, cap, ns, scale, GROUP_BLOCK=K.GROUP_BLOCK, **consts)
    comb = {k: consts[k] for k in ("HEAD_DIM", "BLOCK_N", "SPLIT_MIN", "MAX_SPLITS")}
    K.decode_attn_combine_kernel[(b, hq)](o_part, lse_part, lens_t, o, hq, ns, **comb)
    return _f(o), o_part.arr, lse_part.arr


def consts_of(dt, d, **over):
    c = dict(_variant(f"decode_attn_{dt}_d{d}").constexprs)
    c.pop("GROUP_BLOCK")
    c.update(over)
    return c


def inputs(b, hq, hk, d, cap, lens, pad=None):
    """Random q and caches (columns past each row's length hold NaN: never read), the bias with
    ``pad[r]`` leading padding columns masked (left-padded prompts)."""
    q = RNG.standard_normal((b, hq, d)).astype(np.float32)
    kc = RNG.standard_normal((b, hk, cap, d)).astype(np.float32)
    vc = RNG.standard_normal((b, hk, cap, d)).astype(np.float32)
    bias = np.zeros((b, cap), np.float32)
    for r in range(b):
        kc[r, :, lens[r]:] = np.nan
        vc[r, :, lens[r]:] = np.nan
        if pad is not None:
            bias[r, : pad[r]] = MASK_BIAS
            bias[r, lens[r]:] = np.nan  # never read either
    return q, kc, vc, bias


def _err(got, ref):
    return max(np.abs(got[r] - ref[r]).max() / np.abs(ref[r]).max() for r in range(len(ref)))


# (batch, Hq, Hkv, D, cap, lens, left padding): cache lengths off the block sizes (32/64) and the
# split size (256), GQA 1, 2 and 7, batch 1 and rows of different lengths.
CASES = [
    ("b1_gqa1_short", 1, 2, 2, 64, 40, [37], None),
    ("b1_gqa7_one", 1, 7, 1, 64, 8, [1], None),
    ("uneven_gqa2", 4, 4, 2, 64, 300, [1, 65, 257, 300], [0, 10, 0, 43]),
    ("uneven_gqa7_d128", 3, 14, 2, 128, 130, [129, 3, 100], [0, 2, 60]),
    ("long_split_gqa7", 2, 7, 1, 64, 1500, [1500, 777], [5, 0]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_attention(case, dt):
    _, b, hq, hk, d, cap, lens, pad = case
    q, kc, vc, bias = inputs(b, hq, hk, d, cap, lens, pad)
    scale = 1.0 / np.sqrt(d)
    got, _, _ = run_attn(q, kc, vc, bias, lens, scale, dt, consts_of(dt, d))
    # the reference on the kernel's inputs (bf16: the rounded ones)
    ref = attn_ref(_rnd(q, dt), np.nan_to_num(_rnd(kc, dt)), np.nan_to_num(_rnd(vc, dt)),
                   np.nan_to_num(bias), lens, scale)
    err = _err(got, ref)
    print(f"decode attention {case[0]} {dt}: {err:.2e}")
    assert err <= (1e-6 if dt == "f32" else 2e-2), err


def test_split_and_unsplit_long_cache():
    """The same long cache split (1500 keys: 6 splits of 256) and in one piece agree within 1e-6
    (f32), each within 1e-6 of float64; one split gives the single pass's bits exactly."""
    b, hq, hk, d, cap, lens = 2, 7, 1, 64, 1500, [1500, 1000]
    q, kc, vc, bias = inputs(b, hq, hk, d, cap, lens, [3, 0])
    scale = 0.125
    c = consts_of("f32", d)
    assert K.splits(1500, c["BLOCK_N"], c["SPLIT_MIN"], c["MAX_SPLITS"]) == 6
    split, _, lse = run_attn(q, kc, vc, bias, lens, scale, "f32", c)
    one, _, _ = run_attn(q, kc, vc, bias, lens, scale, "f32", consts_of("f32", d, MAX_SPLITS=1,
                                                                        SPLIT_MIN=2048))
    ref = attn_ref(q, np.nan_to_num(kc), np.nan_to_num(vc), bias, lens, scale)
    e_split, e_one, e_between = _err(split, ref), _err(one, ref), _err(split, one)
    print(f"long cache: split {e_split:.2e}, unsplit {e_one:.2e}, split vs unsplit {e_between:.2e}")
    assert max(e_split, e_one, e_between) <= 1e-6
    # the split's partials: every split of row 0 written, row 1 (4 splits) leaves the rest
    assert np.isfinite(lse[0, :, :6]).all() and (lse[1, :, 4:] == SENTINEL).all()


def test_split_size_depends_on_the_length_alone():
    """The same rows at another capacity (another split axis) and in another batch give the same
    bits: the split is a function of each row's length only."""
    d, hq, hk = 64, 4, 2
    lens = [700, 33]
    q, kc, vc, bias = inputs(2, hq, hk, d, 700, lens, [7, 0])
    c = consts_of("bf16", d)
    a, _, _ = run_attn(q, kc, vc, bias, lens, 0.125, "bf16", c)
    big = lambda x, fill: np.concatenate([x, np.full(x.shape[:-2] + (300,) + x.shape[-1:], fill,
                                                     np.float32)], -2)
    kc2, vc2 = big(kc, 0.0), big(vc, 0.0)
    bias2 = np.concatenate([bias, np.zeros((2, 300), np.float32)], 1)
    b2, _, _ = run_attn(q, kc2, vc2, bias2, lens, 0.125, "bf16", c)
    assert K.grid_splits(1000, c["SPLIT_MIN"], c["MAX_SPLITS"]) != K.grid_splits(
        700, c["SPLIT_MIN"], c["MAX_SPLITS"])
    assert np.array_equal(a, b2)
    # row 1 alone (batch 1) equals its result in the batch of two
    c1, _, _ = run_attn(q[1:], kc[1:], vc[1:], bias[1:], lens[1:], 0.125, "bf16", c)
    assert np.array_equal(c1[0], a[1])
    # and a rerun is bit-identical
    a2, _, _ = run_attn(q, kc, vc, bias, lens, 0.125, "bf16", c)
    assert np.array_equal(a, a2)


def test_split_rule():
    """split_len/splits/grid_splits: the values the Rust launcher mirrors
    (crates/rlvr-kernels/src/triton/families/decode.rs tests the same table)."""
    table = [(1, 256, 1), (256, 256, 1), (257, 256, 2), (384, 256, 2), (4096, 256, 16),
             (4097, 320, 13), (10000, 640, 16), (32768, 2048, 16)]
    for length, span, n in table:
        assert K.split_len(length, 64, 256, 16) == span, length
        assert K.splits(length, 64, 256, 16) == n, length
    for cap in (1, 256, 257, 4096, 5000, 40000):
        g = K.grid_splits(cap, 256, 16)
        assert all(K.splits(n, 64, 256, 16) <= g for n in range(1, cap + 1, 7))
        assert all(K.splits(n, 32, 256, 16) <= g for n in range(1, cap + 1, 7))


# ------------------------------------------------------------------------------------------------
# Rotary + cache write


def run_rope(q, k, v, cap, cos, sin, pos, cols, dt, fused_qkv=False):
    b, hq, d = q.shape
    hk = k.shape[1]
    if fused_qkv:  # one [B, (Hq + 2Hkv)·D] buffer, q/k/v as views of it
        qkv = np.concatenate([q.reshape(b, -1), k.reshape(b, -1), v.reshape(b, -1)], 1)
        big = _t(qkv, dt)
        qa = Tensor(big.arr.reshape(-1), bf16=dt == "bf16")
        ka = Tensor(big.arr.reshape(-1)[hq * d:], bf16=dt == "bf16")
        va = Tensor(big.arr.reshape(-1)[(hq + hk) * d:], bf16=dt == "bf16")
        sq = skv = qkv.shape[1]
    else:
        qa, ka, va = _t(q, dt), _t(k, dt), _t(v, dt)
        sq, skv = hq * d, hk * d
    qo = _t(np.zeros_like(q), dt)
    kc = _t(np.full((b, hk, cap, d), SENTINEL), dt)
    vc = _t(np.full((b, hk, cap, d), SENTINEL), dt)
    K.decode_rope_kv_kernel[(b,)](qa, ka, va, qo, kc, vc, Tensor(cos), Tensor(sin),
                                  Tensor(np.asarray(pos, np.int32)),
                                  Tensor(np.asarray(cols, np.int32)), sq, skv, hq, hk, cap,
                                  HEAD_DIM=d, HEAD_BLOCK=1024 // d)
    return qo, kc, vc


@pytest.mark.parametrize("b,hq,hk,d,cap", [(1, 14, 2, 64, 9), (5, 7, 1, 64, 40),
                                           (3, 12, 2, 128, 17), (2, 40, 8, 128, 5)])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("fused_qkv", [False, True])
def test_rope_kv(b, hq, hk, d, cap, dt, fused_qkv):
    cos, sin = tables(4096, d)
    q = RNG.standard_normal((b, hq, d)).astype(np.float32)
    k = RNG.standard_normal((b, hk, d)).astype(np.float32)
    v = RNG.standard_normal((b, hk, d)).astype(np.float32)
    pos = RNG.integers(0, 4096, b)
    cols = RNG.integers(0, cap, b)  # per row: uneven rows
    qo, kc, vc = run_rope(q, k, v, cap, cos, sin, pos, cols, dt, fused_qkv)
    assert np.array_equal(_f(qo), emulate_forward(q, cos, sin, pos, dt).astype(np.float64))
    k_rot = emulate_forward(k, cos, sin, pos, dt).astype(np.float64)
    kc, vc = _f(kc), _f(vc)
    for r in range(b):
        assert np.array_equal(kc[r, :, cols[r]], k_rot[r])
        assert np.array_equal(vc[r, :, cols[r]], _rnd(v[r], dt))
        other = np.ones(cap, bool)
        other[cols[r]] = False
        fill = _rnd(SENTINEL, dt)  # 776 in bf16
        assert (kc[r][:, other] == fill).all() and (vc[r][:, other] == fill).all()


def test_rope_kv_then_attention_equals_reference():
    """A prefill's cache, then one decode step through both kernels (f32): the attention of the
    rotated query over the cache with the rotated key in place, within 1e-6 of float64."""
    b, hq, hk, d, cap = 3, 14, 2, 64, 50
    cos, sin = tables(4096, d)
    lens = np.array([50, 20, 33])
    hist_k = RNG.standard_normal((b, hk, cap, d)).astype(np.float32)
    hist_v = RNG.standard_normal((b, hk, cap, d)).astype(np.float32)
    q = RNG.standard_normal((b, hq, d)).astype(np.float32)
    k = RNG.standard_normal((b, hk, d)).astype(np.float32)
    v = RNG.standard_normal((b, hk, d)).astype(np.float32)
    pos = lens - 1 + 100
    cols = lens - 1
    qa, ka, va = _t(q, "f32"), _t(k, "f32"), _t(v, "f32")
    qo = _t(np.zeros_like(q), "f32")
    kc, vc = _t(hist_k, "f32"), _t(hist_v, "f32")
    K.decode_rope_kv_kernel[(b,)](qa, ka, va, qo, kc, vc, Tensor(cos), Tensor(sin),
                                  Tensor(pos.astype(np.int32)), Tensor(cols.astype(np.int32)),
                                  hq * d, hk * d, hq, hk, cap, HEAD_DIM=d, HEAD_BLOCK=16)
    bias = np.zeros((b, cap), np.float32)
    got, _, _ = run_attn(qo.arr, kc.arr, vc.arr, bias, lens, 0.125, "f32", consts_of("f32", d))
    kc_ref = hist_k.astype(np.float64).copy()
    vc_ref = hist_v.astype(np.float64).copy()
    qr = emulate_forward(q, cos, sin, pos, "f32").astype(np.float64)
    kr = emulate_forward(k, cos, sin, pos, "f32").astype(np.float64)
    for r in range(b):
        kc_ref[r, :, cols[r]] = kr[r]
        vc_ref[r, :, cols[r]] = v[r]
    ref = attn_ref(qr, kc_ref, vc_ref, bias, lens, 0.125)
    assert _err(got, ref) <= 1e-6


def test_variants():
    from kernels.tests.check_variants import check
    check(K, "decode_")
    names = {v.name for v in K.VARIANTS}
    for dt in ("f32", "bf16"):
        for d in K.HEAD_DIMS:
            for kind in ("rope_kv", "attn", "attn_combine"):
                assert f"decode_{kind}_{dt}_d{d}" in names
                assert f"decode_{kind}_{dt}_d{d}_a16" in names
