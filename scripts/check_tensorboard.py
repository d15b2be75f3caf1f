"""Reads rlvr run directories' TensorBoard event files with TensorBoard's own reader
(EventAccumulator) and checks that they hold exactly the scalars of metrics.jsonl, eval.jsonl and
diagnostics.jsonl (as float32), under rlvr's tags (crates/rlvr-train/src/store/tensorboard.rs),
the log-ratio histograms of diagnostics.jsonl (`hist/*`: the same counts, the right edges
RATIO_HIST_EDGES then 20), plus the config text. Usage: check_tensorboard.py RUN_DIR... (run by scripts/ci_tensorboard.sh)."""
import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator as ea


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


EDGES = [-10.0, -1.0, -0.1, -0.01, -1e-3, -1e-4, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 20.0]


def expected(run):
    want = {}
    hists = {}
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
                    if name == "diagnostics.jsonl" and k.startswith("hist/"):
                        if isinstance(v, list) and sum(v) > 0:
                            hists[("diagnostics/" + k, step)] = [float(c) for c in v]
                        continue
                    if isinstance(v, bool):
                        v = 1.0 if v else 0.0
                    elif not isinstance(v, (int, float)):
                        continue
                    tag = k if k.startswith(prefix) else prefix + k
                    want[(tag, step)] = f32(float(v))
    return want, hists


def check(run, require_hist):
    acc = ea.EventAccumulator(os.path.join(run, "tensorboard"),
                              size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    got = {}
    for tag in tags["scalars"]:
        for e in acc.Scalars(tag):
            key = (tag, e.step)
            if key in got:
                sys.exit(f"{run}: {tag} at step {e.step} twice")
            got[key] = e.value
    want, want_h = expected(run)
    got_h = {}
    for tag in tags["histograms"]:
        for e in acc.Histograms(tag):
            h = e.histogram_value
            if list(h.bucket_limit) != EDGES or (h.min, h.max) != (-20.0, 20.0):
                sys.exit(f"{run}: {tag} at step {e.step}: edges {list(h.bucket_limit)}, "
                         f"min/max {h.min}/{h.max}")
            if h.num != sum(h.bucket):
                sys.exit(f"{run}: {tag} at step {e.step}: num {h.num} != {sum(h.bucket)}")
            got_h[(tag, e.step)] = list(h.bucket)
    if got_h != want_h:
        diff = sorted(set(got_h) ^ set(want_h)) or sorted(
            k for k in want_h if got_h.get(k) != want_h[k])
        sys.exit(f"{run}: histograms differ from diagnostics.jsonl at {diff[:5]}")
    if require_hist and not want_h:
        sys.exit(f"{run}: no ratio histogram with counts in diagnostics.jsonl to check")
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
    print(f"{run}: {len(want)} scalars over steps {steps[0]}-{steps[-1]} and {len(want_h)} "
          f"histograms equal the JSONL files; config text {len(text)} chars")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for run in sys.argv[1:]:
        # Every run the CI script makes trains tokens from step 1 on (skip_zero_gradient_rows = false).
        check(run, require_hist=True)
