"""float64 numpy references for the kernel tests.

Attention: the semantics of ``crates/rlvr-model/src/layers.rs`` (``Attention::attend`` and
``attend_shared``): scores ``q·kᵀ/√d`` (here any ``scale``), query head ``h`` reads kv head
``h // (Hq/Hkv)``, and the varlen shared-prefix layout of ``kernels/src/attention.py``.
"""

import numpy as np


def attention_layout(seq_specs, gaps=None):
    """Descriptors of a flat layout.

    ``seq_specs``: list of ``(length, prefix_owner)`` in flat order, ``prefix_owner`` the index of
    the sequence whose whole range is this one's prefix (or ``None``). ``gaps[i]``: padding rows
    before sequence ``i``. Returns ``(n_tokens, seqs [S,4] i32, viewer_off [S+1] i32, viewers
    [max(V,1)] i32, pad_rows)``.
    """
    gaps = gaps or [0] * len(seq_specs)
    seqs, pad, pos = [], [], 0
    for (length, _), g in zip(seq_specs, gaps):
        pad.extend(range(pos, pos + g))
        pos += g
        seqs.append([pos, length, 0, 0])
        pos += length
    for i, (_, owner) in enumerate(seq_specs):
        if owner is not None:
            seqs[i][2], seqs[i][3] = seqs[owner][0], seqs[owner][1]
    viewer_lists = [[i for i, (_, o) in enumerate(seq_specs) if o == s] for s in range(len(seqs))]
    viewer_off = np.cumsum([0] + [len(v) for v in viewer_lists]).astype(np.int32)
    viewers = np.array([w for v in viewer_lists for w in v] or [0], np.int32)
    return pos, np.array(seqs, np.int32).reshape(-1, 4), viewer_off, viewers, np.array(pad, int)


def attention_blocks(seqs, block):
    """``[NB, 2]`` i32: ``(s, m0)`` for every block of ``block`` rows of every sequence."""
    out = [(s, m0) for s, (_, length, _, _) in enumerate(seqs) for m0 in range(0, length, block)]
    return np.array(out, np.int32).reshape(-1, 2)


def _keys(seq, window=0):
    """Query rows, key rows and the ``[queries, keys]`` visibility of one sequence: the prefix,
    then its own keys causally; with a ``window`` (> 0) only keys at positions ``p`` with
    ``q − window < p`` (prefix key ``j`` at position ``j``, own row ``i`` at ``p_len + i``)."""
    start, length, p_start, p_len = (int(x) for x in seq)
    rows = np.concatenate([np.arange(p_start, p_start + p_len), np.arange(start, start + length)])
    mask = np.zeros((length, p_len + length), bool)
    mask[:, :p_len] = True
    mask[:, p_len:] = np.tril(np.ones((length, length), bool))
    if window > 0:
        qpos = p_len + np.arange(length)
        kpos = np.arange(p_len + length)
        mask &= (qpos[:, None] - kpos[None, :]) < window
    return np.arange(start, start + length), rows, mask


def attention_ref_fwd(q, k, v, seqs, scale, window=0):
    """O ``[N, Hq, D]`` and LSE ``[Hq, N]`` (natural log of the scaled scores), float64; rows
    outside every sequence are NaN; ``window``: a sliding window (0: none; see ``_keys``)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    n, hq, d = q.shape
    rep = hq // k.shape[1]
    o = np.full(q.shape, np.nan)
    lse = np.full((hq, n), np.nan)
    for seq in seqs:
        qr, kr, mask = _keys(seq, window)
        for h in range(hq):
            s = q[qr, h] @ k[kr, h // rep].T * scale
            s = np.where(mask, s, -np.inf)
            m = s.max(1, keepdims=True)
            e = np.exp(s - m)
            l = e.sum(1, keepdims=True)
            o[qr, h] = (e / l) @ v[kr, h // rep]
            lse[h, qr] = (m + np.log(l))[:, 0]
    return o, lse


def attention_ref_bwd(q, k, v, do, seqs, scale, window=0):
    """dQ, dK, dV (float64) of ``Σ O·dO``; rows outside every sequence are 0."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    hq = q.shape[1]
    rep = hq // k.shape[1]
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for seq in seqs:
        qr, kr, mask = _keys(seq, window)
        for h in range(hq):
            hk = h // rep
            s = np.where(mask, q[qr, h] @ k[kr, hk].T * scale, -np.inf)
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            dp = do[qr, h] @ v[kr, hk].T
            ds = p * (dp - (p * dp).sum(1, keepdims=True))
            dq[qr, h] += ds @ k[kr, hk] * scale
            np.add.at(dk[:, hk], kr, ds.T @ q[qr, h] * scale)
            np.add.at(dv[:, hk], kr, p.T @ do[qr, h])
    return dq, dk, dv
