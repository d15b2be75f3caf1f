#!/usr/bin/env python3
"""Fixtures that hold rlvr's Trinity-named presets to Trinity-RFT 0.6.0's own classes (issue 47).

Source: Trinity-RFT 0.6.0 (https://github.com/modelscope/Trinity-RFT, Apache License 2.0), the
PyPI wheel `trinity-rft==0.6.0`. This script imports and runs its classes unchanged:

- advantages: `trinity.algorithm.advantage_fn.rec_advantage.RECGroupedAdvantage` (the REC recipes'
  advantage: no std, or population std + 1e-6 for `grpo_rec`) and
  `trinity.algorithm.advantage_fn.grpo_advantage.GRPOGroupedAdvantage` (sample std + 1e-6), run on
  `trinity.common.experience.Experience` objects grouped by task;
- losses: `trinity.algorithm.policy_loss_fn.rec_policy_loss.RECPolicyLossFn` (clip modes none,
  one-side, two-side, ring, gspo-one-side; weights none, importance_sampling,
  gspo_importance_sampling, advantage; regularisers k2 and forward-kl) and
  `trinity.algorithm.policy_loss_fn.ppo_policy_loss.PPOPolicyLossFn` (verl's clipped surrogate with
  dual clip), called on fixed per-token log-probs (a float64 leaf tensor), behaviour log-probs,
  mask and advantages; the loss and d loss / d log-prob (autograd) are recorded.

Precision: Trinity computes advantages in float32 (its advantage classes build the reward tensor
with `dtype=torch.float32`); the rewards here are dyadic, so means and population stds are exact,
but a sample std (sqrt(1/3)) is float32-rounded: the JSON records Trinity's float32 advantages
(widened to f64). The losses are computed in float64 from those advantages (the log-prob tensors
are float64; Trinity's code is dtype-generic), so rlvr's loss is compared at ~1e-10.

Stubbed (only imports Trinity needs for other parts; no code that computes a number is replaced):
- `ray`: imported by trinity/utils/log.py for the node address in log records (distributed
  runtime, not installed here);
- `trinity.buffer.operators`: imported by advantage_fn.py only for the `ExperienceOperator` base
  class (an ABC with one abstract `process`, which `GroupAdvantage` implements); the real package
  pulls in Trinity's buffers (readers, writers, storage);
- `trinity.algorithm.sample_strategy`: imported by trinity/algorithm/__init__.py; it reads batches
  from the experience buffer (above), which nothing here uses.
Installed besides the wheel (--no-deps) and torch: omegaconf (trinity/common/dataclass_utils.py
imports it for Experience) and whatever its import chain needs (numpy, safetensors).

Output: trinity.json next to this file (committed; `cargo test -p rlvr-algo --test it --
trinity::` reads it, CI needs no Python). Run (torch from any CPU install):

    python3 -m venv target/trin
    target/trin/bin/pip install --no-deps trinity-rft==0.6.0
    target/trin/bin/pip install torch numpy safetensors omegaconf
    target/trin/bin/python crates/rlvr-algo/tests/reference/make_trinity_fixtures.py [--check]

`--check` recomputes everything and fails unless it equals the committed trinity.json.
"""

import abc
import json
import os
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trinity.json")

# --- stubs (see the header) ---------------------------------------------------------------
_ray = types.ModuleType("ray")
_ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1")
sys.modules["ray"] = _ray
_buffer = types.ModuleType("trinity.buffer")
_buffer.__path__ = []
_ops = types.ModuleType("trinity.buffer.operators")


class ExperienceOperator(abc.ABC):
    @abc.abstractmethod
    def process(self, exps):
        """As trinity/buffer/operators/experience_operator.py: transform a list of experiences."""


_ops.ExperienceOperator = ExperienceOperator
sys.modules["trinity.buffer"] = _buffer
sys.modules["trinity.buffer.operators"] = _ops
_sample = types.ModuleType("trinity.algorithm.sample_strategy")
_sample.SAMPLE_STRATEGY = None
_sample.SampleStrategy = object
sys.modules["trinity.algorithm.sample_strategy"] = _sample
# ------------------------------------------------------------------------------------------

from importlib.metadata import version  # noqa: E402

from trinity.algorithm.advantage_fn.grpo_advantage import GRPOGroupedAdvantage  # noqa: E402
from trinity.algorithm.advantage_fn.rec_advantage import RECGroupedAdvantage  # noqa: E402
from trinity.algorithm.policy_loss_fn.ppo_policy_loss import PPOPolicyLossFn  # noqa: E402
from trinity.algorithm.policy_loss_fn.rec_policy_loss import RECPolicyLossFn  # noqa: E402
from trinity.common.experience import EID, Experience  # noqa: E402

assert version("trinity-rft") == "0.6.0", f"these fixtures are Trinity-RFT 0.6.0's; found {version('trinity-rft')}"

K = 4  # completions per prompt
T = 6  # completion tokens (padded)
# 3 prompts x K: a mixed binary group, a zero-variance group, a continuous group (dyadic values).
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.25, 0.875, 0.0, 0.5]
GROUPS = [i // K for i in range(len(REWARDS))]
LENGTHS = [6, 3, 1, 4, 2, 6, 5, 3, 4, 1, 6, 2]
N = len(REWARDS)


def advantages(fn):
    """Trinity's per-row advantage (its float32 value, widened), rows in input order."""
    exps = [
        Experience(eid=EID(batch=0, task=g, run=i), tokens=torch.zeros(1 + T, dtype=torch.long), reward=r, prompt_length=1)
        for i, (g, r) in enumerate(zip(GROUPS, REWARDS))
    ]
    out, _ = fn(exps)
    by_run = {e.eid.run: e for e in out}
    assert len(by_run) == N
    return [float(by_run[i].advantages[0]) for i in range(N)]


def mask():
    return [[1.0 if t < n else 0.0 for t in range(T)] for n in LENGTHS]


def logps(scale, seed):
    """Fixed log-probs and behaviour log-probs, log-ratio spread `scale` (float64)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2.0 - 0.05
    old = logp + torch.randn(N, T, generator=g, dtype=torch.float64) * scale
    return logp.tolist(), old.tolist()


def loss_and_grad(fn, adv, logp, old):
    m = torch.tensor(mask(), dtype=torch.float64)
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    a = torch.tensor(adv, dtype=torch.float64).unsqueeze(-1) * m
    loss, _ = fn(logprob=lp, old_logprob=torch.tensor(old, dtype=torch.float64), action_mask=m, advantages=a)
    loss.backward()
    return float(loss.detach()), lp.grad.tolist()


REC_ADV = RECGroupedAdvantage(**RECGroupedAdvantage.default_args())  # std_normalize false, eps 1e-6
GRPO_REC_ADV = RECGroupedAdvantage(epsilon=1e-6, std_normalize=True)
GRPO_ADV = GRPOGroupedAdvantage(**GRPOGroupedAdvantage.default_args())


def rec(**kw):
    args = RECPolicyLossFn.default_args()
    args.update(kw)
    return RECPolicyLossFn(backend="verl", **args), args


def ppo():
    args = PPOPolicyLossFn.default_args()
    return PPOPolicyLossFn(backend="verl", **args), args


# (rlvr preset, extra rlvr keys, Trinity advantage class, its name, loss fn + args, log-ratio scale)
# Trinity's REC recipes (examples/rec_gsm8k/README.md, PR #292) map onto RECPolicyLossFn's
# clip_mode / weight / regularizer as rlvr's presets.rs says per preset; the ring's primed bounds
# are Trinity's default_args (0.6, 2), equal to rlvr's defaults.
CASES = [
    ("reinforce", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="none", weight="none"), 0.4),
    ("rec_oneside_nois", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="one-side", weight="none"), 0.4),
    ("rec_oneside_is", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="one-side", weight="importance_sampling"), 0.4),
    ("rec_twoside_nois", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="two-side", weight="none"), 0.4),
    ("rec_twoside_is", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="two-side", weight="importance_sampling"), 0.4),
    ("rec_ring_nois", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="ring", weight="none"), 0.9),
    ("rec_ring_is", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="ring", weight="importance_sampling"), 0.9),
    (
        "rec_gspo_nois",
        {},
        REC_ADV,
        "RECGroupedAdvantage()",
        rec(clip_mode="gspo-one-side", weight="none", epsilon_low=3e-4, epsilon_high=4e-4),
        6e-4,
    ),
    (
        "rec_gspo_is",
        {},
        REC_ADV,
        "RECGroupedAdvantage()",
        rec(clip_mode="gspo-one-side", weight="gspo_importance_sampling", epsilon_low=3e-4, epsilon_high=4e-4),
        6e-4,
    ),
    ("opmd", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="none", weight="none", regularizer="k2", regularizer_coef=0.1), 0.4),
    (
        "asymre",
        {},
        REC_ADV,
        "RECGroupedAdvantage()",
        rec(clip_mode="none", weight="none", regularizer="forward-kl", regularizer_coef=0.1),
        0.4,
    ),
    ("red_weight", {}, REC_ADV, "RECGroupedAdvantage()", rec(clip_mode="none", weight="advantage", temp=1.0), 0.4),
    (
        "grpo_rec",
        {},
        GRPO_REC_ADV,
        "RECGroupedAdvantage(std_normalize=True)",
        rec(clip_mode="one-side", weight="importance_sampling"),
        0.4,
    ),
    ("grpo_verl", {}, GRPO_ADV, "GRPOGroupedAdvantage()", ppo(), 0.4),
]


def build():
    cases = []
    for k, (preset, keys, adv_fn, adv_name, (loss_fn, loss_args), scale) in enumerate(CASES):
        adv = advantages(adv_fn)
        logp, old = logps(scale, seed=100 + k)
        loss, grad = loss_and_grad(loss_fn, adv, logp, old)
        cases.append(
            {
                "preset": preset,
                "set": keys,
                "advantage_fn": adv_name,
                "policy_loss_fn": type(loss_fn).__name__,
                "policy_loss_args": loss_args,
                "rewards": REWARDS,
                "groups": GROUPS,
                "advantages": adv,
                "mask": mask(),
                "logp": logp,
                "logp_old": old,
                "loss": loss,
                "grad_logp": grad,
            }
        )
    return {
        "source": "Trinity-RFT 0.6.0 (pip trinity-rft==0.6.0) RECGroupedAdvantage, GRPOGroupedAdvantage, "
        "RECPolicyLossFn, PPOPolicyLossFn; written by make_trinity_fixtures.py",
        "torch": torch.__version__.split("+")[0],
        "cases": cases,
    }


def main():
    torch.set_num_threads(1)
    out = build()
    text = json.dumps(out, indent=1) + "\n"
    if "--check" in sys.argv[1:]:
        with open(OUT) as f:
            old = json.load(f)
        new = json.loads(text)
        old.pop("torch", None)
        new.pop("torch", None)
        if old != new:
            sys.exit(f"{OUT} differs from what Trinity-RFT 0.6.0 computes now; rerun without --check")
        print(f"{OUT}: reproduced")
        return
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {OUT} ({len(out['cases'])} cases)")


if __name__ == "__main__":
    main()
