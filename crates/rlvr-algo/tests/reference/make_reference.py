#!/usr/bin/env python3
"""Reference values for rlvr-algo's tests, computed independently of the Rust code.

Advantages: NumPy (float64), written directly from the formulas of DESIGN.md sections 4-5.
Losses: PyTorch (float64) autograd, written the way the papers write them (torch.min / torch.clamp
surrogates, .detach() for stop-gradients), aggregated by the normaliser formulas of DESIGN.md section 4
over the whole batch (not through per-row weights, as the Rust code does).

Output: reference.json next to this file (committed; the cargo tests read it, CI needs no Python).
Run:  /path/to/python make_reference.py   (needs numpy and torch)
"""

import json
import math
import os

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------------
def std(vals, mode):
    vals = np.asarray(vals, dtype=np.float64)
    if mode == "none":
        return 0.0
    if mode == "sample":
        return float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
    return float(np.std(vals, ddof=0)) if len(vals) > 0 else 0.0


def advantages(rewards, groups, cfg):
    """Group-relative advantages; see the Rust module doc of advantage.rs for the rules."""
    baseline = cfg.get("baseline", "mean")
    std_norm = cfg.get("std_norm", "sample")
    level = cfg.get("std_level", "group")
    eps = cfg.get("std_eps", 1e-6)
    shift = cfg.get("baseline_shift", 0.0)
    temp = cfg.get("lme_temperature", 1.0)
    exclude = cfg.get("exclude_zero_std", True)
    n = len(rewards)
    out = [0.0] * n
    keep = [False] * n
    scored = [i for i in range(n) if rewards[i] is not None]
    batch_sd = std([rewards[i] for i in scored], std_norm)
    for g in sorted(set(groups), key=str):
        rows = [i for i in scored if groups[i] == g]
        if not rows:
            continue
        r = np.array([rewards[i] for i in rows], dtype=np.float64)
        zero_var = bool(np.all(r == r[0]))
        if zero_var:
            for i in rows:
                out[i] = 0.0 - shift
                keep[i] = not exclude
            continue
        k = len(r)
        if baseline == "mean":
            b = np.full(k, r.mean())
        elif baseline == "leave-one-out":
            b = np.array([(r.sum() - r[j]) / (k - 1) for j in range(k)])
        else:  # log-mean-exp
            b = np.full(k, temp * math.log(np.mean(np.exp(r / temp))))
        centred = r - b
        if std_norm != "none":
            sd = std(r, std_norm) if level == "group" else batch_sd
            centred = centred / (sd + eps)
        for j, i in enumerate(rows):
            out[i] = float(centred[j] - shift)
            keep[i] = True
    return out, keep


def advantage_cases():
    cases = []

    def add(name, rewards, groups, cfg):
        vals, keep = advantages(rewards, groups, cfg)
        cases.append(dict(name=name, rewards=rewards, groups=groups,
                          config=dict(preset="none", **cfg), values=vals, in_normaliser=keep))

    sample = dict(baseline="mean", std_norm="sample", std_eps=1e-6)
    add("design_1_of_8", [1.0] + [0.0] * 7, ["g"] * 8, sample)
    add("design_3_of_8", [1.0] * 3 + [0.0] * 5, ["g"] * 8, sample)
    add("design_pair_sample", [1.0, 0.0], ["g", "g"], sample)
    add("design_pair_population", [1.0, 0.0], ["g", "g"],
        dict(baseline="mean", std_norm="population", std_eps=1e-6))
    rng = np.random.default_rng(7)
    rw = [float(x) for x in rng.uniform(0, 1, 12).round(3)]
    gid = ["p1", "p2", "p3"] * 4
    rw_null = list(rw)
    rw_null[4] = None
    rw_null[9] = None
    add("interleaved_sample_nulls", rw_null, gid, sample)
    add("interleaved_population", rw, gid, dict(baseline="mean", std_norm="population", std_eps=1e-6))
    add("no_std", rw, gid, dict(baseline="mean", std_norm="none"))
    add("rloo", rw, gid, dict(baseline="leave-one-out", std_norm="none"))
    add("rloo_std", rw, gid, dict(baseline="leave-one-out", std_norm="sample", std_eps=1e-6))
    add("log_mean_exp", rw, gid, dict(baseline="log-mean-exp", std_norm="none", lme_temperature=0.5))
    add("batch_std", rw, gid, dict(baseline="mean", std_norm="sample", std_level="batch", std_eps=1e-6))
    add("shift_no_std", rw, gid, dict(baseline="mean", std_norm="none", baseline_shift=-0.1))
    mixed = [1.0, 0.5, 0.5, 0.5, 2.0, 0.0, 1.0, None]
    mgid = ["a", "b", "b", "b", "k1", "c", "c", "d"]
    add("zero_var_k1_excluded", mixed, mgid, dict(baseline="mean", std_norm="sample", std_eps=1e-6,
                                                  exclude_zero_std=True))
    add("zero_var_k1_kept", mixed, mgid, dict(baseline="mean", std_norm="sample", std_eps=1e-6,
                                              exclude_zero_std=False))
    return cases


# ----------------------------------------------------------------------------------------------
# Losses
# ----------------------------------------------------------------------------------------------
def make_batch():
    rng = np.random.default_rng(2026)
    B, T = 6, 7
    lengths = [7, 5, 3, 6, 7, 2]
    mask = np.zeros((B, T))
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    logp = rng.uniform(-3.0, -0.05, (B, T))
    # Log-ratios spread over [-1.6, 1.4]: ratios 0.2 .. 4, so every clip/keep branch is hit.
    logp_old = logp - rng.uniform(-1.6, 1.4, (B, T))
    logp_ref = logp - rng.normal(0.0, 0.3, (B, T))
    entropy = rng.uniform(0.1, 2.0, (B, T))
    # Padding holds finite garbage: the loss must ignore it.
    for arr in (logp, logp_old, logp_ref, entropy):
        arr[mask == 0] = rng.uniform(-50, 50, int((mask == 0).sum()))
    adv = np.array([1.3, -0.7, 0.45, -1.9, 0.15, 0.8])
    return dict(B=B, T=T, mask=mask, logp=logp, logp_old=logp_old, logp_ref=logp_ref,
                entropy=entropy, advantages=adv,
                in_normaliser=[True, True, True, True, False, True],
                truncated=[False, False, False, True, False, False],
                max_new_tokens=8)


def loss_torch(cfg, batch, logp, adv, ent):
    c = cfg.get("log_ratio_clamp", 20.0)
    el, eh = cfg.get("clip_low", 0.2), cfg.get("clip_high", 0.2)
    cap = cfg.get("is_cap")
    dual = cfg.get("dual_clip")
    mask = torch.tensor(batch["mask"])
    old = torch.tensor(batch["logp_old"])
    ref = torch.tensor(batch["logp_ref"])
    A = adv[:, None]

    def capped(r):
        return r if cap is None else r * torch.clamp(cap / r.detach(), max=1.0)

    def surrogate(r, a):
        s1 = r * a
        s2 = torch.clamp(r, 1 - el, 1 + eh) * a
        pg = -torch.min(s1, s2)
        if dual is not None:
            pg = torch.where(a < 0, torch.min(pg, -dual * a), pg)
        return pg

    x = torch.clamp(logp - old, -c, c)
    ratio = torch.exp(x)
    rbar = ratio.detach()
    n_tok = mask.sum(1, keepdim=True)
    sbar = torch.exp((x * mask).sum(1, keepdim=True) / n_tok).detach()
    kind = cfg.get("loss", "ppo")
    if kind == "ppo":
        pg = surrogate(capped(ratio), A)
    elif kind == "gspo":
        s = torch.exp((x * mask).sum(1, keepdim=True) / n_tok)
        pg = surrogate(capped(s), A).expand_as(logp)
    elif kind == "cispo":
        w = torch.clamp(capped(ratio), max=1 + eh).detach()
        pg = -w * A * logp
    elif kind == "reinforce":
        pg = -A * logp
    else:  # rec
        km = cfg.get("keep_mask", "none")
        r = sbar if km == "gspo-one-side" else rbar
        one = ((A >= 0) & (r <= 1 + eh)) | ((A <= 0) & (r >= 1 - el))
        two = (r >= 1 - el) & (r <= 1 + eh)
        if km == "none":
            k = torch.ones_like(logp, dtype=torch.bool)
        elif km in ("one-side", "gspo-one-side"):
            k = one
        elif km == "two-side":
            k = two
        else:
            elp, ehp = cfg.get("clip_low_prime", 0.6), cfg.get("clip_high_prime", 2.0)
            k = two | ((A >= 0) & (r <= 1 - elp)) | ((A <= 0) & (r >= 1 + ehp))
        k = k.expand_as(logp).double()
        wk = cfg.get("rec_weight", "none")
        if wk == "none":
            w = A
        elif wk == "is":
            w = A * capped(rbar)
        elif wk == "seq-is":
            w = A * capped(sbar)
        else:
            w = A * torch.exp(A / cfg.get("adv_temperature", 1.0))
        pg = -w * k * logp
    L = pg
    tau = cfg.get("tau", 0.1)
    reg = cfg.get("regulariser", "none")
    if reg == "opmd":
        L = L + tau * (logp - old) ** 2
    elif reg == "asymre":
        L = L - tau * logp
    beta = cfg.get("kl_coef", 0.0)
    if beta:
        xr = torch.clamp(ref - logp, -c, c)
        est = cfg.get("kl_estimator", "k3")
        k = {"k1": -xr, "k2": 0.5 * xr ** 2, "k3": torch.exp(xr) - xr - 1}[est]
        if cfg.get("kl_ratio_weighted", False):
            k = k * rbar
        L = L + beta * k
    L = L - cfg.get("entropy_coef", 0.0) * ent
    # Normaliser over the whole batch (DESIGN.md section 4).
    live = torch.tensor([
        keep and not (trunc and cfg.get("overlong", "none") == "mask")
        for keep, trunc in zip(batch["in_normaliser"], batch["truncated"])
    ])
    m = mask * live[:, None].double()
    ML = torch.where(m > 0, L, torch.zeros_like(L))  # padding garbage never reaches the sum
    agg = cfg.get("aggregation", "token-mean")
    n_rows = live.sum()
    if agg == "token-mean":
        return ML.sum() / m.sum()
    if agg == "seq-mean-token-mean":
        per = ML.sum(1) / mask.sum(1)
        return per[live].sum() / n_rows
    if agg == "seq-mean-token-sum":
        return ML.sum(1)[live].sum() / n_rows
    # constant (Dr.GRPO): every row of the update counts, live or not (B*K*L_max, fixed per update).
    return ML.sum() / (mask.shape[0] * batch["max_new_tokens"])


def loss_cases(batch):
    cfgs = {
        "ppo_token_mean": dict(loss="ppo"),
        "ppo_asym_dual_seq_mean": dict(loss="ppo", clip_low=0.2, clip_high=0.28, dual_clip=3.0,
                                       aggregation="seq-mean-token-mean"),
        "ppo_is_cap_constant": dict(loss="ppo", is_cap=1.5, aggregation="constant"),
        "ppo_kl_k3_entropy_seq_sum": dict(loss="ppo", kl_coef=0.05, kl_estimator="k3",
                                          entropy_coef=0.01, aggregation="seq-mean-token-sum"),
        "ppo_kl_k1_weighted": dict(loss="ppo", kl_coef=0.1, kl_estimator="k1", kl_ratio_weighted=True),
        "ppo_kl_k2": dict(loss="ppo", kl_coef=0.1, kl_estimator="k2"),
        "ppo_kl_k3_weighted_overlong_mask": dict(loss="ppo", kl_coef=0.1, kl_estimator="k3",
                                                 kl_ratio_weighted=True, overlong="mask"),
        "ppo_clamp_small": dict(loss="ppo", log_ratio_clamp=0.5, clip_low=0.1, clip_high=0.1),
        "gspo": dict(loss="gspo", clip_low=0.1, clip_high=0.15, aggregation="seq-mean-token-mean"),
        "gspo_dual_cap": dict(loss="gspo", clip_low=0.1, clip_high=0.15, dual_clip=1.2, is_cap=1.3,
                              aggregation="seq-mean-token-mean"),
        "cispo": dict(loss="cispo", clip_high=0.28),
        "cispo_cap": dict(loss="cispo", clip_high=0.28, is_cap=1.1),
        "reinforce": dict(loss="reinforce"),
        "opmd": dict(loss="reinforce", regulariser="opmd", tau=0.1),
        "asymre": dict(loss="reinforce", regulariser="asymre", tau=0.1),
    }
    for km in ["none", "one-side", "two-side", "ring", "gspo-one-side"]:
        for wk in ["none", "is", "seq-is", "advantage-exp"]:
            cfgs[f"rec_{km}_{wk}"] = dict(loss="rec", keep_mask=km, rec_weight=wk, clip_low=0.2,
                                          clip_high=0.25, adv_temperature=0.7)
    cfgs["rec_ring_is_cap_primes"] = dict(loss="rec", keep_mask="ring", rec_weight="is", is_cap=2.0,
                                          clip_low_prime=0.5, clip_high_prime=1.5)
    out = []
    for name, cfg in cfgs.items():
        logp = torch.tensor(batch["logp"], requires_grad=True)
        adv = torch.tensor(batch["advantages"], requires_grad=True)
        ent = torch.tensor(batch["entropy"], requires_grad=True)
        loss = loss_torch(cfg, batch, logp, adv, ent)
        loss.backward()
        assert torch.isfinite(loss), name
        out.append(dict(name=name, config=dict(preset="none", **cfg), loss=loss.item(),
                        grad_logp=logp.grad.tolist(), grad_advantages=adv.grad.tolist(),
                        grad_entropy=ent.grad.tolist()))
    return out


def main():
    batch = make_batch()
    doc = dict(
        generator="crates/rlvr-algo/tests/reference/make_reference.py",
        torch=torch.__version__,
        numpy=np.__version__,
        advantage_cases=advantage_cases(),
        loss_batch={k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in batch.items()},
        loss_cases=loss_cases(batch),
    )
    path = os.path.join(HERE, "reference.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(doc['advantage_cases'])} advantage cases, {len(doc['loss_cases'])} loss cases")


if __name__ == "__main__":
    main()
