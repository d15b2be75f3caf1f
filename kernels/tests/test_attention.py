"""The attention family (kernels/src/attention.py) under the interpreter against float64 numpy.

Error measure: ``max|got - ref| / max|ref|`` per output tensor (normwise, so entries near 0 do not
dominate). Bounds asserted: f32 ``F32_TOL`` = 1e-5; bf16 ``BF16_TOL`` = 2e-2 against the float64
reference computed from the same bf16-rounded inputs (bf16 keeps 8 significant bits: one rounding
is at most 2^-9 ≈ 2e-3 relative; P and dS are rounded to bf16 before their matmuls and the
outputs once more, and sums of those rounded terms can cancel, so the bound leaves ~10x over the
single rounding). The measured maxima are printed (``pytest -s``) and listed in kernels/README.md.
"""

import math

import numpy as np
import pytest
import triton.language as tl

from kernels.np_tensor import interpreter_bf16_dot_as_f32, Tensor, bf16, from_bf16
from kernels.src import attention as A
from kernels.tests.reference import (attention_blocks, attention_layout, attention_ref_bwd,
                                     attention_ref_fwd)


interpreter_bf16_dot_as_f32()

F32_TOL = 1e-5
BF16_TOL = 2e-2
SENTINEL = 777.0


def _rel(got, ref, rows, floor=1e-30):
    err = np.abs(got[rows] - ref[rows]).max()
    return err / max(np.abs(ref[rows]).max(), floor)


def _tensor(x, dtype):
    if dtype == "bf16":
        return Tensor(bf16(x), bf16=True)
    return Tensor(np.asarray(x, np.float32))


def _value(t, dtype):
    return from_bf16(t.arr) if dtype == "bf16" else t.arr.astype(np.float32)


def _out(shape, dtype, fill=SENTINEL):
    return _tensor(np.full(shape, fill, np.float32), dtype)


def run_attention(q, k, v, do, layout, scale, dtype="f32", bm=16, bn=16, bwd=True, blocks=None,
                  window=0):
    """Forward (and backward) through the four kernels; returns float arrays
    ``o, lse, dq, dk, dv`` (the backward ones None when ``bwd`` is false). ``blocks`` maps
    "fwd"/"dkdv"/"dq" to (BLOCK_M, BLOCK_N) (default: ``bm``, ``bn`` for all three)."""
    blocks = blocks or {kind: (bm, bn) for kind in ("fwd", "dkdv", "dq")}
    n, seqs, viewer_off, viewers, _ = layout
    _, hq, d = q.shape
    hkv = k.shape[1]
    sq, vo, vw = Tensor(seqs), Tensor(viewer_off), Tensor(viewers)
    tq, tk, tv = _tensor(q, dtype), _tensor(k, dtype), _tensor(v, dtype)
    o = _out(q.shape, dtype)
    lse = Tensor(np.full((hq, n), SENTINEL, np.float32))
    bm, bn = blocks["fwd"]
    qb = Tensor(attention_blocks(seqs, bm))
    A.attn_fwd_kernel[(qb.arr.shape[0], hq)](tq, tk, tv, o, lse, sq, qb, n, hq, hkv, scale,
                                             window, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn)
    if not bwd:
        return _value(o, dtype), lse.arr.copy(), None, None, None
    tdo = _tensor(do, dtype)
    delta = Tensor(np.full((hq, n), SENTINEL, np.float32))
    bm, bn = blocks["dq"]
    qb = Tensor(attention_blocks(seqs, bm))
    grid = (qb.arr.shape[0], hq)
    A.attn_bwd_pre_kernel[grid](o, tdo, delta, sq, qb, n, hq, HEAD_DIM=d, BLOCK_M=bm)
    dq, dk, dv = _out(q.shape, dtype), _out(k.shape, dtype), _out(v.shape, dtype)
    A.attn_bwd_dq_kernel[grid](tq, tk, tv, tdo, lse, delta, dq, sq, qb, n, hq, hkv, scale,
                               window, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn)
    bm, bn = blocks["dkdv"]
    kb = Tensor(attention_blocks(seqs, bn))
    A.attn_bwd_dkdv_kernel[(kb.arr.shape[0], hkv)](
        tq, tk, tv, tdo, lse, delta, dk, dv, sq, kb, vo, vw, n, hq, hkv, scale, window,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn)
    return (_value(o, dtype), lse.arr.copy(), _value(dq, dtype), _value(dk, dtype),
            _value(dv, dtype))


def _inputs(n, hq, hkv, d, seed, dtype):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, hq, d)) * 1.5
    k = rng.standard_normal((n, hkv, d))
    v = rng.standard_normal((n, hkv, d))
    do = rng.standard_normal((n, hq, d))
    if dtype == "bf16":  # the reference sees exactly the kernel's inputs
        q, k, v, do = (from_bf16(bf16(x)).astype(np.float64) for x in (q, k, v, do))
    return q, k, v, do


def _shared_specs(prompts, completions, seed):
    """Prompts first, then each prompt's completions (lengths drawn from 1..40)."""
    rng = np.random.default_rng(seed)
    specs = [(p, None) for p in prompts]
    for g, c in enumerate(completions):
        specs += [(int(rng.integers(1, 41)), g) for _ in range(c)]
    return specs


def check(specs, hq, hkv, d, dtype="f32", gaps=None, seed=0, bm=16, bn=16, bwd=True, name="",
          blocks=None, window=0):
    layout = attention_layout(specs, gaps)
    n, seqs = layout[0], layout[1]
    q, k, v, do = _inputs(n, hq, hkv, d, seed, dtype)
    scale = 1.0 / math.sqrt(d)
    got = run_attention(q, k, v, do, layout, scale, dtype, bm, bn, bwd, blocks, window)
    ref_o, ref_lse = attention_ref_fwd(q, k, v, seqs, scale, window)
    refs = [ref_o, ref_lse.T]
    got = [got[0], got[1].T] + list(got[2:])
    if bwd:
        refs += list(attention_ref_bwd(q, k, v, do, seqs, scale, window))
    rows = np.setdiff1d(np.arange(n), layout[4])
    tol = F32_TOL if dtype == "f32" else BF16_TOL
    errs = {}
    # A window of 1 makes dQ and dK exactly 0 in exact arithmetic (each query sees only itself:
    # dS = P·(dP − D) = 0, what is left is dP − D's f32 rounding): there the error is absolute.
    floor = 1.0 if window == 1 else 1e-30
    for label, g, r in zip(["O", "LSE", "dQ", "dK", "dV"], got, refs):
        errs[label] = _rel(g, r, rows, floor)
    print(f"\n{name} {dtype} d{d} Hq{hq}/Hkv{hkv} window {window}: " +
          " ".join(f"{lbl} {e:.2e}" for lbl, e in errs.items()))
    for label, e in errs.items():
        assert e <= tol, (label, e, tol)
    return errs


# 3 prompts (5, 17, 1 tokens) with 1, 3 and 2 completions of 1..40 tokens.
SHARED = _shared_specs([5, 17, 1], [1, 3, 2], seed=1)
# A smaller one for the many-head cases: prompts of 5 and 17 tokens, 1 and 2 completions.
SMALL = _shared_specs([5, 17], [1, 2], seed=2)
UNSHARED = [(n, None) for n in (1, 7, 16, 33, 20)]


def test_shared_prefix_f32_d64_gqa2():
    check(SHARED, 4, 2, 64, name="shared")


def test_shared_prefix_f32_d64_gqa7():
    check(SMALL, 7, 1, 64, seed=2, name="small")


def test_unshared_f32_d64():
    check(UNSHARED, 2, 1, 64, gaps=[0, 2, 0, 5, 1], name="unshared")


def test_shared_prefix_f32_d128():
    check(SHARED, 2, 1, 128, seed=3, name="shared")


def test_single_tokens_and_empty_prefix_f32():
    # L = 1 prompts with L = 1 completions, a lone L = 1 sequence, one longer than a block, an
    # empty completion (L = 0: no block, no work).
    specs = [(1, None), (1, 0), (1, 0), (1, None), (19, None), (2, 4), (0, 4)]
    check(specs, 2, 2, 64, seed=4, name="L=1")


def test_shared_prefix_bf16_d64():
    check(SHARED, 4, 2, 64, dtype="bf16", seed=5, name="shared")


def test_shared_prefix_bf16_d128():
    check(SHARED, 2, 1, 128, dtype="bf16", seed=6, name="shared")


def test_small_bf16_d64_gqa7():
    check(SMALL, 7, 1, 64, dtype="bf16", seed=12, bm=32, bn=32, name="small")


@pytest.mark.parametrize("dtype,target", [("f32", "sm90a"), ("bf16", "sm80")])
def test_variant_block_sizes(dtype, target):
    """The compiled variants' own block sizes (d64; most bigger than every sequence here)."""
    names = {"fwd": f"attn_fwd_{dtype}_d64", "dkdv": f"attn_bwd_dkdv_{dtype}_d64",
             "dq": f"attn_bwd_dq_{dtype}_d64"}
    blocks = {}
    for v in A.VARIANTS:
        for kind, name in names.items():
            if target in v.targets and v.name == name:
                blocks[kind] = (v.constexprs["BLOCK_M"], v.constexprs["BLOCK_N"])
    assert len(blocks) == 3
    check(SMALL, 2, 1, 64, dtype=dtype, seed=7, blocks=blocks, name=f"{dtype} {target} {blocks}")


# Sliding windows: 1 (each query sees itself only), not a multiple of the blocks (5, 13: a
# window edge inside a block, blocks wholly outside skipped), one block exactly (16), and wider
# than every sequence (100: as no window); in the shared-prompt layout (windows reaching back
# into the prompt, or not) and the unshared one with gaps, f32 and bf16, GQA 1/2/7.
@pytest.mark.parametrize("window", [1, 5, 13, 16, 100])
def test_window_shared_f32_d64(window):
    check(SHARED, 4, 2, 64, seed=20, name="shared", window=window)


@pytest.mark.parametrize("window", [1, 7, 33])
def test_window_unshared_f32(window):
    check(UNSHARED, 2, 1, 64, gaps=[0, 2, 0, 5, 1], seed=21, name="unshared", window=window)


def test_window_small_gqa7_d128_f32():
    check(SMALL, 7, 1, 128, seed=22, name="small", window=9)


@pytest.mark.parametrize("window", [3, 20])
def test_window_shared_bf16_d64(window):
    check(SHARED, 4, 2, 64, dtype="bf16", seed=23, bm=32, bn=32, name="shared", window=window)


def test_window_variant_block_sizes():
    """A window across the compiled bf16 variants' own (large) blocks, with unequal fwd/dkdv/dq
    blocks."""
    blocks = {"fwd": (128, 64), "dkdv": (64, 32), "dq": (128, 32)}
    check(SHARED, 2, 1, 64, dtype="bf16", seed=24, blocks=blocks, name="variant blocks",
          window=11)


def test_window_wider_than_every_sequence_equals_no_window():
    """A window wider than every position gives the windowless kernels' bits exactly."""
    lay = attention_layout(SMALL)
    q, k, v, do = _inputs(lay[0], 2, 1, 64, 25, "f32")
    a = run_attention(q, k, v, do, lay, 0.125)
    b = run_attention(q, k, v, do, lay, 0.125, window=1000)
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()


def test_shared_equals_unshared():
    """Each completion as one sequence [prompt, completion] without prefix gives the same O for
    the completion queries and, summed over its rows, the same prompt dK/dV."""
    prompts, comps = [5, 17, 1], [1, 3, 2]
    specs = _shared_specs(prompts, comps, seed=1)
    lay = attention_layout(specs)
    n, seqs = lay[0], lay[1]
    hq, hkv, d = 2, 1, 64
    q, k, v, do = _inputs(n, hq, hkv, d, 8, "f32")
    scale = 1.0 / math.sqrt(d)
    o, _, dq, dk, dv = run_attention(q, k, v, do, lay, scale)
    # Unshared: row r = [its prompt's rows, its completion's rows]; the prompt's query gradients
    # (dO) counted once, on the first row of each group.
    idx, uspecs, first = [], [], set()
    for s, (length, owner) in enumerate(specs):
        if owner is None:
            continue
        p0, plen = seqs[owner][0], seqs[owner][1]
        own = np.arange(seqs[s][0], seqs[s][0] + length)
        rows = np.concatenate([np.arange(p0, p0 + plen), own])
        idx.append((s, owner, rows, owner not in first))
        first.add(owner)
        uspecs.append((len(rows), None))
    ul = attention_layout(uspecs)
    flat = np.concatenate([r for _, _, r, _ in idx])
    udo = do[flat].copy()
    at = 0
    for s, owner, rows, keep in idx:
        if not keep:
            udo[at:at + seqs[owner][1]] = 0.0
        at += len(rows)
    uo, _, udq, udk, udv = run_attention(q[flat], k[flat], v[flat], udo, ul, scale)
    # Scatter the unshared results back onto the shared rows (sums for keys, first for queries).
    sdk, sdv, so, sdq = np.zeros_like(dk), np.zeros_like(dv), np.zeros_like(o), np.zeros_like(dq)
    at = 0
    for s, owner, rows, keep in idx:
        sl = slice(at, at + len(rows))
        np.add.at(sdk, rows, udk[sl])
        np.add.at(sdv, rows, udv[sl])
        plen = seqs[owner][1]
        if keep:
            so[rows[:plen]], sdq[rows[:plen]] = uo[sl][:plen], udq[sl][:plen]
        so[rows[plen:]], sdq[rows[plen:]] = uo[sl][plen:], udq[sl][plen:]
        at += len(rows)
    for label, a, b in [("O", o, so), ("dQ", dq, sdq), ("dK", dk, sdk), ("dV", dv, sdv)]:
        e = _rel(a, b, np.arange(n))
        print(f"\nshared vs unshared {label} {e:.2e}")
        assert e <= 2 * F32_TOL, (label, e)


def test_padding_untouched():
    """NaN in Q/K/V/dO between sequences: outputs there keep their sentinel, no NaN anywhere."""
    specs = _shared_specs([5, 3], [2, 1], seed=9)
    gaps = [3, 2, 1, 4, 2]
    lay = attention_layout(specs, gaps)
    n, pad = lay[0], lay[4]
    hq, hkv, d = 2, 1, 64
    q, k, v, do = _inputs(n, hq, hkv, d, 10, "f32")
    for x in (q, k, v, do):
        x[pad] = np.nan
    o, lse, dq, dk, dv = run_attention(q, k, v, do, lay, 1.0 / math.sqrt(d))
    rows = np.setdiff1d(np.arange(n), pad)
    for label, x in [("O", o), ("dQ", dq), ("dK", dk), ("dV", dv), ("LSE", lse.T)]:
        assert np.all(x[pad] == SENTINEL), label
        assert np.all(np.isfinite(x[rows])), label
    ref = attention_ref_fwd(np.nan_to_num(q), np.nan_to_num(k), np.nan_to_num(v), lay[1], 1 / 8)
    assert _rel(o, ref[0], rows) <= F32_TOL


def _kept_layout(news, pads, pasts, starts):
    """A kept-turn prefill's layout (crates/rlvr-model ``kept_seqs``): B rows of T new positions
    (row b's ``news[b]`` tokens after ``pads[b]`` padding rows), then B rows of P cached
    positions each, key-only (no sequence covers them), row b's prefix the ``pasts[b]`` rows
    from ``starts[b]`` of its own block. Returns ``(layout, rows of q)``."""
    b, t = len(news), max(p + m for p, m in zip(pads, news))
    p = max(s + m for s, m in zip(starts, pasts))
    seqs = [[r * t + pads[r], news[r], b * t + r * p + starts[r], pasts[r]] for r in range(b)]
    n = b * (t + p)
    pad = np.setdiff1d(np.arange(b * t), [x for s in seqs for x in range(s[0], s[0] + s[1])])
    seqs = np.array(seqs, np.int32).reshape(-1, 4)
    return (n, seqs, np.zeros(b + 1, np.int32), np.zeros(1, np.int32), pad), b * t


@pytest.mark.parametrize("dtype,hq,hkv,d", [("f32", 7, 1, 64), ("f32", 4, 2, 128),
                                            ("bf16", 2, 1, 64)])
def test_key_only_prefixes_forward(dtype, hq, hkv, d):
    """The forward with each sequence's prefix in key-only rows after the query rows (a KV
    cache's past positions; q and o hold only the B·T new rows): uneven new lengths (1 to 40,
    blocks of 16), an empty past, a past of one key, and sentinels in the rows no sequence
    covers, which the output must keep."""
    lay, nq = _kept_layout(news=[3, 1, 40, 17], pads=[37, 0, 0, 23], pasts=[9, 0, 33, 1],
                           starts=[24, 0, 0, 32])
    n, seqs, _, _, pad = lay
    q, k, v, _ = _inputs(n, hq, hkv, d, 12, dtype)
    q[pad] = np.nan
    scale = 1.0 / math.sqrt(d)
    o, lse, _, _, _ = run_attention(q[:nq], k, v, None, lay, scale, dtype, bwd=False)
    ref_o, ref_lse = attention_ref_fwd(np.nan_to_num(q), k, v, seqs, scale)
    rows = np.setdiff1d(np.arange(nq), pad)
    tol = F32_TOL if dtype == "f32" else BF16_TOL
    e_o, e_lse = _rel(o, ref_o[:nq], rows), _rel(lse.T, ref_lse.T, rows)
    print(f"\nkept {dtype} d{d} Hq{hq}/Hkv{hkv}: O {e_o:.2e} LSE {e_lse:.2e}")
    assert e_o <= tol and e_lse <= tol, (e_o, e_lse)
    sentinel = _value(_out((1,), dtype), dtype)[0]  # 777 as the output dtype holds it
    assert np.all(o[pad] == sentinel) and np.all(lse[:, nq:] == SENTINEL)


def test_backward_deterministic():
    lay = attention_layout(SMALL)
    q, k, v, do = _inputs(lay[0], 2, 1, 64, 11, "bf16")
    a = run_attention(q, k, v, do, lay, 0.125, "bf16")
    b = run_attention(q, k, v, do, lay, 0.125, "bf16")
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()


def test_variants_well_formed():
    seen = set()
    for v in A.VARIANTS:
        assert list(v.signature) == v.fn.arg_names, v.name
        for name, ty in v.signature.items():
            assert (ty == "constexpr") == (name in v.constexprs), (v.name, name)
        for t in v.targets:
            assert (v.name, t) not in seen, (v.name, t)
            seen.add((v.name, t))
    names = {v.name for v in A.VARIANTS}
    for dt in ("f32", "bf16"):
        for hd in (64, 128):
            for kern in ("fwd", "bwd_pre", "bwd_dkdv", "bwd_dq"):
                n = f"attn_{kern}_{dt}_d{hd}"
                assert n in names and {"sm90a", "sm80"} <= {
                    t for v in A.VARIANTS if v.name == n for t in v.targets}, n
