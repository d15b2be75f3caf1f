"""AdamW and the gradient norm's sum of squares (kernels/src/adamw.py) under the interpreter.

References: rlvr's AdamW (``rlvr_model::optim::AdamW::step`` with the f32 passes of
``rlvr_kernels::adamw``) in float64 over several steps, and the same f32 operations replayed in
numpy float32, which the kernel must equal bit for bit (what the CPU op computes)."""

import numpy as np
import pytest

from kernels.np_tensor import Tensor, bf16, from_bf16
from kernels.src.adamw import SUMSQ_BLOCK, SUMSQ_ITERS, ADAMW_BLOCK
from kernels.tests.launch import run

F32 = np.float32


def host_scalars(lr, beta1, beta2, eps, wd, t, scale=1.0):
    """The kernel's f32 scalars, computed as AdamW::step and adamw_update_f32 compute them."""
    b1, b2 = F32(beta1), F32(beta2)
    return dict(grad_scale=F32(scale), beta1=b1, one_minus_beta1=F32(1) - b1, beta2=b2,
                one_minus_beta2=F32(1) - b2, lr=F32(lr), decay=F32(1.0 - lr * wd),
                inv_bc1=F32(1.0 / (1.0 - beta1**t)), inv_bc2=F32(1.0 / (1.0 - beta2**t)),
                eps=F32(eps))


def cpu_f32_step(p, m, v, g, s):
    """MomentUpdate (twice) then ParamUpdate, in f32, in the Rust code's order of operations."""
    g = (g.astype(F32) * s["grad_scale"]).astype(F32)
    m = s["beta1"] * m + s["one_minus_beta1"] * g
    v = s["beta2"] * v + s["one_minus_beta2"] * (g * g)
    p = p * s["decay"] - s["lr"] * (m * s["inv_bc1"]) / (np.sqrt(v * s["inv_bc2"]) + s["eps"])
    return p, m, v


def f64_step(p, m, v, g, lr, beta1, beta2, eps, wd, t, scale):
    """torch.optim.AdamW as rlvr computes it, in float64: the moments' β are rlvr's f32 ones
    (``MomentUpdate { beta: β as f32 }``, 1 − β exact), the bias corrections f64 β's."""
    g = g * scale
    b1, b2 = float(F32(beta1)), float(F32(beta2))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh, vh = m / (1 - beta1**t), v / (1 - beta2**t)
    return p * (1 - lr * wd) - lr * mh / (np.sqrt(vh) + eps), m, v


def kernel_step(name, p, g, m, v, s, copy=None):
    n = p.arr.size
    args = dict(param=p, grad=g, exp_avg=m, exp_avg_sq=v, n=n, **{k: float(x) for k, x in s.items()})
    if copy is not None:
        args["copy"] = copy
    run(name, (-(-n // ADAMW_BLOCK),), **args)


@pytest.mark.parametrize("wd", [0.0, 0.1])
@pytest.mark.parametrize("name", ["adamw_f32", "adamw_master_bf16", "adamw_master_bf16_gbf16"])
@pytest.mark.parametrize("n", [1, 1000, 2 * ADAMW_BLOCK + 37])
def test_adamw_steps(name, n, wd):
    rng = np.random.default_rng(n + int(wd * 10))
    lr, beta1, beta2, eps = 1e-3, 0.9, 0.999, 1e-8
    p0 = rng.normal(0, 0.5, n).astype(F32)
    p, m, v = Tensor(p0.copy()), Tensor(np.zeros(n, F32)), Tensor(np.zeros(n, F32))
    copy = Tensor(np.zeros(n, np.uint16), bf16=True) if "master" in name else None
    cpu = (p0.copy(), np.zeros(n, F32), np.zeros(n, F32))
    ref = (p0.astype(np.float64), np.zeros(n), np.zeros(n))
    worst = 0.0
    for t in range(1, 6):
        scale = 0.37 if t == 3 else 1.0  # a clipped step
        g32 = rng.normal(0, 1e-2, n).astype(F32)
        if name.endswith("gbf16"):
            gbits = bf16(g32)
            g, g32 = Tensor(gbits, bf16=True), from_bf16(gbits)
        else:
            g = Tensor(g32.copy())
        s = host_scalars(lr, beta1, beta2, eps, wd, t, scale)
        kernel_step(name, p, g, m, v, s, copy)
        cpu = cpu_f32_step(*cpu, g32, s)
        ref = f64_step(*ref, g32.astype(np.float64), lr, beta1, beta2, eps, wd, t, scale)
        # Bit for bit what the CPU's f32 passes compute.
        np.testing.assert_array_equal(p.arr.view(np.uint32), cpu[0].view(np.uint32))
        np.testing.assert_array_equal(m.arr.view(np.uint32), cpu[1].view(np.uint32))
        np.testing.assert_array_equal(v.arr.view(np.uint32), cpu[2].view(np.uint32))
        if copy is not None:
            np.testing.assert_array_equal(copy.arr, bf16(p.arr))
        # And rlvr's formulas in float64: the parameter within f32 rounding of the state.
        err = np.abs(p.arr - ref[0]).max() / np.abs(ref[0]).max()
        worst = max(worst, err)
        assert err < 1e-6, (t, err)
        for got, want in ((m.arr, ref[1]), (v.arr, ref[2])):
            assert np.abs(got - want).max() / np.abs(want).max() < 1e-6
    print(f"{name} n={n} wd={wd}: max |θ − θ_f64| / max|θ| = {worst:.2e}")


def sumsq(name, g, n):
    """Partials then total, as the host launches them for one tensor."""
    per = SUMSQ_BLOCK * SUMSQ_ITERS
    k = -(-n // per)
    partials = Tensor(np.full(k, np.nan, F32))
    run(name, (k,), grad=g, partials=partials, n=n)
    out = Tensor(np.zeros(1, np.float64))
    run("grad_sumsq_total", (1,), partials=partials, out=out, n_partials=k)
    return out.arr[0], partials.arr


@pytest.mark.parametrize("n", [1, 777, SUMSQ_BLOCK * SUMSQ_ITERS, 3 * SUMSQ_BLOCK * SUMSQ_ITERS + 5])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_grad_norm(n, dt):
    rng = np.random.default_rng(n)
    x = rng.normal(0, 3e-3, n).astype(F32)
    if dt == "bf16":
        bits = bf16(x)
        g, x = Tensor(bits, bf16=True), from_bf16(bits)
    else:
        g = Tensor(x)
    got, parts = sumsq(f"grad_sumsq_{dt}", g, n)
    want = np.sum(x.astype(np.float64) ** 2)
    rel = abs(got - want) / want
    print(f"grad_sumsq_{dt} n={n}: relative error {rel:.2e}")
    assert rel < 1e-6
    # Two runs: the same bits (the order of every addition is fixed).
    again, parts2 = sumsq(f"grad_sumsq_{dt}", g, n)
    assert np.float64(got).tobytes() == np.float64(again).tobytes()
    np.testing.assert_array_equal(parts.view(np.uint32), parts2.view(np.uint32))


def test_grad_norm_over_several_tensors():
    """Several gradients' partials in consecutive slots of one buffer, then one total."""
    rng = np.random.default_rng(7)
    per = SUMSQ_BLOCK * SUMSQ_ITERS
    grads = [rng.normal(0, s, n).astype(F32) for s, n in ((1e-2, 5), (2e-3, per + 1), (1.0, 3000))]
    counts = [-(-g.size // per) for g in grads]
    buf = np.full(sum(counts), np.nan, F32)
    at = 0
    for g, k in zip(grads, counts):
        run("grad_sumsq_f32", (k,), grad=Tensor(g), partials=Tensor(buf[at:at + k]), n=g.size)
        at += k
    assert not np.isnan(buf).any()
    out = Tensor(np.zeros(1, np.float64))
    run("grad_sumsq_total", (1,), partials=Tensor(buf), out=out, n_partials=buf.size)
    want = sum(np.sum(g.astype(np.float64) ** 2) for g in grads)
    assert abs(out.arr[0] - want) / want < 1e-6
