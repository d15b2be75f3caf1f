"""The committed manifest against the kernel sources, without compiling (fast; ``generate.py
--check`` in CI recompiles everything): every variant of every module has an entry per target,
its parameters are the signature's plus the two scratch pointers, its source hash is the current
file's (an edited kernel without regenerated artifacts fails here too), the PTX ``.entry``
parameter list matches, and the limits hold."""

import hashlib
import json
import os

import pytest

from kernels import generate
from kernels.variant import ALIGNED_SUFFIX

MANIFEST = os.path.join(generate.BUILD, "manifest.json")


@pytest.fixture(scope="module")
def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def test_header(manifest):
    assert manifest["format"] == generate.FORMAT
    assert manifest["triton"] == "3.9.0"
    assert manifest["ptxas"] == generate.PTXAS_VERSION
    keys = [(k["name"], k["target"]) for k in manifest["kernels"]]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_every_variant_is_built(manifest):
    entries = {(k["name"], k["target"]): k for k in manifest["kernels"]}
    want = set()
    for path, v in generate.load_variants():
        sha = generate.source_sha256(path)
        for t in v.targets:
            want.add((v.name, t))
            e = entries.get((v.name, t))
            assert e is not None, f"{v.name} ({t}) is not in kernels/build/: run kernels/generate.py"
            assert e["source_sha256"] == sha, f"{e['source']} changed since kernels/build/ was generated"
            assert e["source"] == generate.rel(path) and e["family"] == os.path.basename(path)[:-3]
            sig = [(n, t2) for n, t2 in v.signature.items() if t2 != "constexpr"]
            got = [(p["name"], ("*" if p["kind"] == "ptr" else "") + p["dtype"]) for p in e["params"]]
            assert got[:-2] == sig
            assert [p["name"] for p in e["params"][-2:]] == list(generate.SCRATCH_PARAMS)
            assert e["constexprs"] == json.loads(json.dumps(v.constexprs))
            assert (e["num_warps"], e["num_stages"], e["fp_fusion"]) == (v.num_warps, v.num_stages, v.fp_fusion)
            div = {p["name"]: p["divisibility"] for p in e["params"] if "divisibility" in p}
            assert div == {n: generate.DIVISIBILITY for n in v.divisible}, (v.name, div)
    assert set(entries) == want, f"stale entries: {set(entries) - want}"


def test_entries_fit_their_targets(manifest):
    for e in manifest["kernels"]:
        cc, _, smem = generate.TARGET_INFO[e["target"]]
        with open(os.path.join(generate.BUILD, e["ptx"])) as f:
            ptx = f.read()
        assert f".target sm_{cc}{'a' if cc >= 90 else ''}" in ptx
        assert ".version 9.0" in ptx and e["ptx_version"] == "9.0"
        assert f".reqntid {e['threads']}" in ptx and e["threads"] == 32 * e["num_warps"] <= 1024
        params = generate.ptx_params(ptx, e["entry"])
        assert len(params) == len(e["params"])
        for (ty, ptr, _), p in zip(params, e["params"]):
            assert bool(ptr) == (p["kind"] != "scalar")
        assert e["shared_bytes"] <= smem and e["spills"] == 0
        assert e["global_scratch_bytes"] == 0 and e["profile_scratch_bytes"] == 0
        assert e["num_ctas"] == 1 and e["cluster_dims"] == [1, 1, 1]
        assert os.path.getsize(os.path.join(generate.BUILD, e["cubin"])) > 0


def test_aligned_twins(manifest):
    """Every entry that assumes divisibility is an ``_a16`` twin of an entry (same target,
    entry point and parameters) that assumes none, and its PTX has vector accesses."""
    entries = {(k["name"], k["target"]): k for k in manifest["kernels"]}
    twins = 0
    for (name, target), e in entries.items():
        if not any("divisibility" in p for p in e["params"]):
            assert not name.endswith(ALIGNED_SUFFIX), name
            continue
        twins += 1
        assert name.endswith(ALIGNED_SUFFIX), name
        f = entries.get((name[:-len(ALIGNED_SUFFIX)], target))
        assert f is not None, f"{name} ({target}) has no fallback"
        assert not any("divisibility" in p for p in f["params"])
        strip = lambda k: [(p["name"], p["kind"], p["dtype"]) for p in k["params"]]
        assert (strip(e), e["entry"]) == (strip(f), f["entry"]), name
        with open(os.path.join(generate.BUILD, e["ptx"])) as fh:
            assert generate.vector_accesses(fh.read()) > 0, f"{name} ({target}): no vector access"
    assert twins > 0


def test_source_hash_covers_shared_helpers():
    """A module that imports kernels/src/_bf16.py is hashed with it: its hash is not the module
    file's alone, and equals the hash of the module's bytes followed by the helper's."""
    path = os.path.join(generate.SRC, "adamw.py")
    with open(path, "rb") as f:
        module = f.read()
    with open(os.path.join(generate.SRC, "_bf16.py"), "rb") as f:
        helper = f.read()
    assert b"from kernels.src._bf16 import" in module
    assert generate.source_sha256(path) == hashlib.sha256(module + helper).hexdigest()
    assert generate.source_sha256(path) != hashlib.sha256(module).hexdigest()
