"""Reads rlvr run directories' TensorBoard event files with TensorBoard's own reader
(EventAccumulator) and checks that they hold exactly the scalars of metrics.jsonl, eval.jsonl and
diagnostics.jsonl (as float32), under rlvr's tags (crates/rlvr-train/src/store/tensorboard.rs),
plus the config text. Usage: check_tensorboard.py RUN_DIR... (run by scripts/ci_tensorboard.sh)."""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def expected(run):
    want = {}
    for name, prefix in (("metrics.jsonl", ""), ("eval.jsonl", "eval/"),
                         ("diagnostics.jsonl", "diagnostics/")):
        path = os.path.join(run, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for n, line in enumerate(f, 1):
                rec = json.loads(line)
                step = rec["step"]
                for k, v in rec.items():
                    if k == "step" or (name == "metrics.jsonl" and k.startswith("eval/")):
                        continue
                    if isinstance(v, bool):
                        v = 1.0 if v else 0.0
                    elif not isinstance(v, (int, float)):
                        continue
                    tag = k if k.startswith(prefix) else prefix + k
                    want[(tag, step)] = f32(float(v))
    return want


def check(run):
    acc = ea.EventAccumulator(os.path.join(run, "tensorboard"),
                              size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    got = {}
    for tag in tags["scalars"]:
        for e in acc.Scalars(tag):
            key = (tag, e.step)
            if key in got:
                sys.exit(f"{run}: {tag} at step {e.step} twice")
            got[key] = e.value
    want = expected(run)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if got[k] != want[k])
    if missing or extra or wrong:
        sys.exit(f"{run}: missing {missing[:5]}, extra {extra[:5]}, "
                 f"different {[(k, got[k], want[k]) for k in wrong[:5]]}")
    if "config" not in tags["tensors"]:
        sys.exit(f"{run}: no config text (tensor tags {tags['tensors']})")
    text = acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
    if "[train]" not in text:
        sys.exit(f"{run}: the config text has no [train] table")
    steps = sorted({s for (_, s) in want})
    print(f"{run}: {len(want)} scalars over steps {steps[0]}-{steps[-1]} equal the JSONL files; "
          f"config text {len(text)} chars")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for run in sys.argv[1:]:
        check(run)
