"""Writes this directory's fixture ``manifest.json`` and PTX from ``fixture.py``.

PTX only (the fixture has no cubin: Triton's bundled ptxas is not CUDA 13.0's). The compile
options and the manifest's format are those of ``kernels/generate.py`` and ``kernels/README.md``.
Rerun after editing ``fixture.py``, with the pinned Triton:

    python crates/rlvr-kernels/testdata/triton/make_fixture.py
"""

import hashlib
import importlib.util
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
sys.path.insert(0, ROOT)

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGETS = {"sm90a": 90, "sm80": 80}
SCRATCH = ("global_scratch", "profile_scratch")


def _ptx_only(backend=None, stages=None, options=None, language=None, capability=None):
    """Triton's stage hook: drop the cubin stage (no ptxas run)."""
    if backend is None:
        return "ptx-only", "ptx-only"
    stages["cubin"] = lambda src, metadata: b""


def main():
    knobs.runtime.add_stages_inspection_hook = _ptx_only
    path = os.path.join(HERE, "fixture.py")
    spec = importlib.util.spec_from_file_location("rlvr_kernels_fixture", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    source = os.path.relpath(path, ROOT)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    entries = []
    for v in sorted(mod.VARIANTS, key=lambda v: v.name):
        for target in sorted(v.targets):
            src = ASTSource(v.fn, dict(v.signature), constexprs=dict(v.constexprs))
            opts = {"num_warps": v.num_warps, "num_stages": v.num_stages, "ptx_version": 90,
                    "enable_fp_fusion": v.fp_fusion}
            k = triton.compile(src, target=GPUTarget("cuda", TARGETS[target], 32), options=opts)
            ptx, md = k.asm["ptx"], k.metadata
            os.makedirs(os.path.join(HERE, target), exist_ok=True)
            with open(os.path.join(HERE, target, f"{v.name}.ptx"), "w") as f:
                f.write(ptx)
            params = [{"name": n, "kind": "ptr" if t.startswith("*") else "scalar",
                       "dtype": t.lstrip("*")}
                      for n, t in v.signature.items() if t != "constexpr"]
            params += [{"name": s, "kind": "scratch", "dtype": "u8"} for s in SCRATCH]
            entries.append({
                "name": v.name, "family": "fixture", "source": source, "source_sha256": sha,
                "target": target, "entry": md.name,
                "cubin": f"{target}/{v.name}.cubin", "ptx": f"{target}/{v.name}.ptx",
                "ptx_version": re.search(r"^\.version\s+(\S+)", ptx, re.M).group(1),
                "params": params, "constexprs": dict(v.constexprs),
                "num_warps": v.num_warps, "threads": v.num_warps * 32,
                "num_stages": v.num_stages, "num_ctas": md.num_ctas, "cluster_dims": [1, 1, 1],
                "shared_bytes": md.shared, "global_scratch_bytes": md.global_scratch_size,
                "profile_scratch_bytes": md.profile_scratch_size, "fp_fusion": v.fp_fusion,
                "registers": 0, "spills": 0,
            })
    manifest = {"format": 1, "triton": triton.__version__, "ptxas": "none (fixture: PTX only)",
                "kernels": entries}
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
