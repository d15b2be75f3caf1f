"""The chunked log-prob head (kernels/src/logprob_head.py) under the interpreter, against float64.

The host's part is played as the Rust launcher will play it: per vocabulary chunk, the chunk's
logits ``[rows, C]`` (here cut from a full matrix and copied into a buffer whose row stride is
wider than C, so strides matter), ``logprob_fwd`` with ``first`` on the first chunk, then
``logprob_finish``; backward: per chunk, ``logprob_bwd`` in place. The reference is
``log_softmax(z/T)[y]``, ``H = −Σ p log p`` and ``∂/∂z_j = (g_ℓ·(δ_jy − p_j) − g_H·p_j·(log p_j + H))/T``
in float64 on the same (f32, or bf16-rounded) logits. The ``_softcap`` variants against the same
reference through Gemma 2's final-logit cap: ``s = cap·tanh(z/cap)/T`` and
``∂/∂z_j = (1 − tanh²(z_j/cap))·(…)/T``, at caps that leave the logits nearly linear (30) and that
saturate them (2).
"""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src.logprob_head import BWD_BLOCK, FINISH_BLOCK, FWD_BLOCK
from kernels.tests.launch import run

PAD = 3  # extra columns per row of a chunk buffer: the row stride is C + PAD


def reference(z, y, T, gl, gh, cap=None):
    z = z.astype(np.float64)
    zc = z if cap is None else cap * np.tanh(z / cap)
    s = zc / T
    m = s.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(s - m).sum(axis=1))
    logp = s - lse[:, None]
    p = np.exp(logp)
    lp_y = logp[np.arange(len(y)), y]
    H = -(p * logp).sum(axis=1)
    onehot = np.zeros_like(s)
    onehot[np.arange(len(y)), y] = 1.0
    dz = (gl[:, None] * (onehot - p) - gh[:, None] * p * (logp + H[:, None])) / T
    if cap is not None:
        dz *= 1.0 - np.tanh(z / cap) ** 2
    return lp_y, H, dz


def chunk_buffer(z, c0, c, dt):
    rows = z.shape[0]
    if dt == "bf16":
        buf = np.full((rows, c + PAD), 0x7FC0, np.uint16)  # NaN padding: must stay untouched
        buf[:, :c] = z[:, c0:c0 + c]
        return Tensor(buf, bf16=True)
    buf = np.full((rows, c + PAD), np.nan, np.float32)
    buf[:, :c] = z[:, c0:c0 + c]
    return Tensor(buf)


def head(z, y, T, chunk, dt, gl, gh, cap=None):
    """The kernels over ``z`` (f32 values; bf16 bits when dt is bf16) chunk by chunk; with ``cap``
    the ``_softcap`` variants."""
    rows, V = z.shape
    inv_t = float(np.float32(1.0 / T))
    kind = dt if cap is None else f"softcap_{dt}"
    capf = float(np.float32(cap if cap is not None else 0.0))
    targets = Tensor(y.astype(np.int32))
    state = Tensor(np.full((rows, 4), np.nan, np.float32))
    for c0 in range(0, V, chunk):
        c = min(chunk, V - c0)
        buf = chunk_buffer(z, c0, c, dt)
        run(f"logprob_fwd_{kind}", (rows,), z=buf, targets=targets, state=state, n_cols=c,
            stride_z=c + PAD, col0=c0, first=int(c0 == 0), inv_t=inv_t, cap=capf)
    out = Tensor(np.full((rows, 2), np.nan, np.float32))
    run("logprob_finish", (-(-rows // FINISH_BLOCK),), state=state, out=out, n_rows=rows)
    grad = Tensor(np.stack([gl, gh], axis=1).astype(np.float32))
    dz = np.zeros((rows, V), np.float64)
    for c0 in range(0, V, chunk):
        c = min(chunk, V - c0)
        buf = chunk_buffer(z, c0, c, dt)
        run(f"logprob_bwd_{kind}", (rows, -(-c // BWD_BLOCK)), z=buf, targets=targets, state=state,
            out=out, grad=grad, n_cols=c, stride_z=c + PAD, col0=c0, inv_t=inv_t, cap=capf)
        if dt == "bf16":
            assert (buf.arr[:, c:] == 0x7FC0).all()
            dz[:, c0:c0 + c] = from_bf16(buf.arr[:, :c])
        else:
            assert np.isnan(buf.arr[:, c:]).all()
            dz[:, c0:c0 + c] = buf.arr[:, :c]
    return out.arr[:, 0], out.arr[:, 1], dz


CASES = [
    # rows, vocabulary, chunk width, temperature
    (1, 700, 700, 1.0),                     # one row, one chunk smaller than the block
    (5, 3000, 300, 0.7),                    # chunks smaller than the block, T != 1
    (4, 2 * FWD_BLOCK + 77, 2500, 1.3),     # a chunk wider than the block, a ragged last chunk
    (3, 40, 1, 1.0),                        # one-column chunks
    (6, 4099, 4099, 0.6),                   # one chunk of several blocks
    (FINISH_BLOCK + 2, 50, 30, 1.0),        # more rows than one finish program covers
]


def targets_for(rows, V, chunk, rng):
    """Targets at chunk edges (first and last column of a chunk), the vocabulary's ends, random."""
    edges = [0, V - 1, min(chunk, V) - 1, min(chunk, V - 1), (V // chunk) * chunk - 1, V // 2]
    y = np.array([edges[i % len(edges)] for i in range(rows)])
    y[-1] = rng.integers(0, V) if rows > len(edges) else y[-1]
    return np.clip(y, 0, V - 1)


@pytest.mark.parametrize("cap", [None, 30.0, 2.0])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("rows,V,chunk,T", CASES)
def test_head(rows, V, chunk, T, dt, cap):
    rng = np.random.default_rng(rows * 1000 + V)
    z = (rng.standard_normal((rows, V)) * 3.0).astype(np.float32)
    z[0, rng.integers(0, V)] = 25.0  # one dominant logit: p close to 1
    if dt == "bf16":
        bits = bf16(z)
        z, zin = from_bf16(bits), bits
    else:
        zin = z
    y = targets_for(rows, V, chunk, rng)
    gl = rng.standard_normal(rows)
    gh = rng.standard_normal(rows)
    gl[0] = 1.0
    if rows > 1:
        gh[1] = 0.0  # no entropy gradient on one row
    lp, H, dz = head(zin, y, T, chunk, dt, gl, gh, cap)
    # The reference sees exactly the values the kernel read (f32 1/T, as the host passes it).
    ref_lp, ref_H, ref_dz = reference(z, y, 1.0 / float(np.float32(1.0 / T)), gl, gh, cap)
    e_lp = np.max(np.abs(lp - ref_lp) / np.maximum(np.abs(ref_lp), 1.0))
    e_H = np.max(np.abs(H - ref_H) / np.maximum(np.abs(ref_H), 1.0))
    # Gradient: per row, relative to the row's largest entry.
    scale = np.abs(ref_dz).max(axis=1, keepdims=True)
    e_dz = np.max(np.abs(dz - ref_dz) / scale)
    print(f"{dt} cap={cap} rows={rows} V={V} chunk={chunk} T={T}: log p {e_lp:.1e}, H {e_H:.1e}, dz {e_dz:.1e}")
    # f32 arithmetic on ~10-magnitude logits: a few ulp of the scaled logits. With a cap, tanh's
    # absolute error (≤ 1.5e-7: the 1 − e of its exp form) scaled by cap/T moves every scaled
    # logit, hence every p_j relatively, by up to that much more.
    tol = 2e-6 if cap is None else 2e-6 + 1.5e-7 * cap / T
    assert e_lp < tol and e_H < tol
    if dt == "f32":
        assert e_dz < tol
    else:
        # The gradient is rounded to bf16 (8 significant bits) when stored: at most half an ulp,
        # i.e. 2^-8 relative to each entry (so to the row's largest), plus the f32 error above.
        assert e_dz < 2.0**-8 + tol
        rel = np.abs(dz - ref_dz) / np.maximum(np.abs(ref_dz), 1e-30)
        big = np.abs(ref_dz) > 1e-3 * scale  # per entry, where f32 cancellation cannot dominate
        assert np.max(rel[big]) < 2.0**-8 + 1e-4


def test_two_runs_are_bit_identical():
    rng = np.random.default_rng(3)
    z = (rng.standard_normal((3, 2200)) * 2).astype(np.float32)
    y = np.array([5, 1024, 2199])
    args = (z, y, 0.8, 1000, "f32", np.ones(3), np.full(3, 0.5))
    a, b = head(*args), head(*args)
    for x1, x2 in zip(a, b):
        assert x1.tobytes() == x2.tobytes()
