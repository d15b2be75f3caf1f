"""Compares two output trees of bench/same_runs.sh (see there).

- every *.jsonl file (metrics, rollouts, eval, diagnostics, experiences, a checkpoint's
  buffer.jsonl) line by line as JSON, outside the measurement keys: wall-clock times (time/*,
  *_s, tokens_per_s) and the live-heap samples (memory/*: sampled every 5 ms, so timing too);
- the files that name the output directory (config.toml, a checkpoint's manifest.json, a LoRA
  adapter_config.json, summary.json, warm_start.json) as text with each tree's root replaced by
  <ROOT> (JSON ones also outside the measurement keys and summary.json's loadavg);
- every other file (safetensors weights and optimizer state, state.json, tokenizer files, ...)
  byte for byte;
- never: run.json (start time, host, the build's git commit), logs, figures, TensorBoard events.

    python3 bench/same_runs.py A B [EXPECTED]
                                       exit 0 when equal, 1 with the differences listed

EXPECTED: a file of differences a later change made on purpose (scripts/compare/, e.g.
since-977a3a4.txt), one per line: a glob over the path in the tree (fnmatch: `*` crosses `/`),
then the commit and why; a difference whose path matches is listed as expected, not counted.
"""
import fnmatch
import json
import os
import sys

# Keys whose values are wall-clock time: metrics' time/* and the step's sampling and training
# seconds, summary.json's wall_s, eval's timing.
TIMING_PREFIXES = ("time/", "memory/")
# Text files that record the output directory's path.
PATH_FILES = {"config.toml", "manifest.json", "adapter_config.json", "summary.json",
              "warm_start.json"}
TIMING_KEYS = {"tokens_per_s", "samples_per_s", "loadavg"}
# Files that record when or by which build they were written (never compared byte for byte):
# run.json (start time, git commit, host), the logs, the TensorBoard event files.
SKIP_NAMES = {"run.json", "train.log"}
SKIP_SUFFIXES = (".log", ".svg", ".png", ".lock")


def is_timing(key):
    return key in TIMING_KEYS or key.startswith(TIMING_PREFIXES) or key.endswith("_s")


def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not is_timing(k)}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def files(root):
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            out.add(os.path.relpath(os.path.join(d, n), root))
    return out


def rooted(path, root):
    return open(path).read().replace(os.path.abspath(root), "<ROOT>")


def expected_list(path):
    """(glob, why) pairs of an EXPECTED file (blank lines and # comments skipped)."""
    out = []
    for line in open(path) if path else []:
        line = line.strip()
        if line and not line.startswith("#"):
            glob, _, why = line.partition(" ")
            out.append((glob, why.strip()))
    return out


def main(a, b, expected=None):
    allow = expected_list(expected)
    fa, fb = files(a), files(b)
    bad = []
    for p in sorted(fa ^ fb):
        if not p.endswith(SKIP_SUFFIXES) and "events.out" not in p:
            bad.append((p, f"only in {'A' if p in fa else 'B'}: {p}"))
    counts = {"jsonl lines": 0, "byte-identical files": 0, "path-normalised files": 0,
              "skipped": 0}
    for p in sorted(fa & fb):
        pa, pb = os.path.join(a, p), os.path.join(b, p)
        name = os.path.basename(p)
        if name in SKIP_NAMES or p.endswith(SKIP_SUFFIXES) or "events.out" in p:
            counts["skipped"] += 1
            continue
        if p.endswith(".jsonl"):
            la = open(pa).read().splitlines()
            lb = open(pb).read().splitlines()
            if len(la) != len(lb):
                bad.append((p, f"{p}: {len(la)} lines vs {len(lb)}"))
            for i, (x, y) in enumerate(zip(la, lb)):
                if strip(json.loads(x)) != strip(json.loads(y)):
                    bad.append((p, f"{p}:{i + 1}: differs\n  A {x[:300]}\n  B {y[:300]}"))
                    break
            counts["jsonl lines"] += min(len(la), len(lb))
        elif name in PATH_FILES:
            ta, tb = rooted(pa, a), rooted(pb, b)
            if name.endswith(".json"):
                ta, tb = strip(json.loads(ta)), strip(json.loads(tb))
            if name == "manifest.json":
                # The checksums of files compared above outside paths and measurements.
                for m in (ta, tb):
                    for f in ("adapter/adapter_config.json", "trainer_state/buffer.jsonl"):
                        m.get("files", {}).pop(f, None)
            if ta != tb:
                bad.append((p, f"{p}: differs (paths as <ROOT>, measurements aside)"))
            counts["path-normalised files"] += 1
        else:
            if open(pa, "rb").read() != open(pb, "rb").read():
                bad.append((p, f"{p}: bytes differ"))
            counts["byte-identical files"] += 1
    known = []
    for p, line in bad:
        why = next((w for g, w in allow if fnmatch.fnmatch(p, g)), None)
        if why is None:
            print("DIFF", line)
        else:
            known.append(why)
    bad = [x for x in bad if not any(fnmatch.fnmatch(x[0], g) for g, _ in allow)]
    for why in sorted(set(known)):
        print(f"EXPECTED {known.count(why)} file(s): {why}")
    print(f"same_runs: {a} vs {b}: " + ", ".join(f"{v} {k}" for k, v in counts.items())
          + (f", {len(known)} expected difference(s)" if known else "")
          + (" -- EQUAL" if not bad else f" -- {len(bad)} difference(s)"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
