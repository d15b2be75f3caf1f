"""Replays the Rust launch recorder's records under Triton's CPU interpreter.

``crates/rlvr-kernels`` (``triton::record``) writes what its launcher would launch: the variant,
the grid, every argument in the PTX parameter order (pointers as named buffers with their
contents, scalars by value), and the CPU op's expected outputs. This runs each record's kernel
on exactly that grid with exactly those arguments and compares the outputs: a wrong grid,
stride or argument order in a Rust plan builder fails here, without a GPU.

    RLVR_KERNEL_RECORD=$PWD/target/kernel-records cargo test -p rlvr-kernels --lib triton
    TRITON_INTERPRET=1 python kernels/replay.py target/kernel-records     # or a record's dir

The record format is in ``crates/rlvr-kernels/src/triton/record.rs``. The variant is looked up
by name in the record's ``source`` module (a ``kernels/src/*.py`` module or a test fixture),
else in every ``kernels/src/*.py``; its function, non-constexpr parameters, pointer dtypes and
constexprs must agree with the record before anything runs.
"""

import importlib
import importlib.util
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from kernels import np_tensor  # noqa: E402



def _interpreter_fixes():
    """The interpreter's bf16 tl.dot fix the kernel tests apply (kernels/tests/conftest.py), when
    this np_tensor has it: records of bf16 variants must replay with the same arithmetic. Done on
    first use, so that importing this module needs no triton (``replay_gpu.py`` reuses it)."""
    if hasattr(np_tensor, "interpreter_bf16_dot_as_f32"):
        np_tensor.interpreter_bf16_dot_as_f32()

# Record dtype -> numpy dtype of the raw file (bf16 is held as its uint16 bits).
NP_DTYPE = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16, "bf16": np.uint16,
            "i32": np.int32, "i64": np.int64, "u8": np.uint8, "i8": np.int8, "i16": np.int16,
            "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "i1": np.uint8}
# Record scalar kind -> the Triton signature types it may be passed for.
SCALAR_TYPES = {"i32": ("i32", "u32"), "i64": ("i64", "u64"), "f32": ("fp32",)}


class ReplayError(Exception):
    pass


def find_records(path):
    """Every record directory at or under ``path`` (a directory holding ``record.json``)."""
    if os.path.isfile(os.path.join(path, "record.json")):
        return [path]
    out = []
    for base, _, files in os.walk(path):
        if "record.json" in files:
            out.append(base)
    return sorted(out)


def _module(source):
    path = os.path.join(ROOT, source)
    rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
    if rel.startswith("kernels/src/") and rel.endswith(".py"):
        return importlib.import_module("kernels.src." + rel[len("kernels/src/"):-3])
    name = "replay_" + rel.replace("/", "_").replace(".", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def find_variant(rec):
    """The ``Variant`` named ``rec["name"]`` built for ``rec["target"]`` (a name may have one
    variant per target, with different block sizes): in the record's source module, else in any
    ``kernels/src/*.py``."""
    sources = []
    if rec.get("source") and os.path.isfile(os.path.join(ROOT, rec["source"])):
        sources.append(rec["source"])
    src_dir = os.path.join(ROOT, "kernels", "src")
    sources += [f"kernels/src/{f}" for f in sorted(os.listdir(src_dir))
                if f.endswith(".py") and not f.startswith("_")]
    for s in sources:
        for v in getattr(_module(s), "VARIANTS", []):
            if v.name == rec["name"] and rec["target"] in v.targets:
                return v
    raise ReplayError(f"no variant {rec['name']} for {rec['target']} in {rec.get('source')} or "
                      "kernels/src/*.py")


def check_agreement(rec, v):
    """The variant's function, parameters, pointer dtypes and constexprs equal the record's."""
    label = rec["label"]
    fn_name = getattr(v.fn, "__name__", None) or v.fn.fn.__name__
    if fn_name != rec["entry"]:
        raise ReplayError(f"{label}: variant {v.name} is {fn_name}, the record launches "
                          f"{rec['entry']}")
    params = [n for n, t in v.signature.items() if t != "constexpr"]
    args = [a for a in rec["args"] if a["kind"] != "scratch"]
    got = [a["param"] for a in args]
    if got != params:
        raise ReplayError(f"{label}: the record passes {got}, {fn_name} takes {params}")
    for a in args:
        t = v.signature[a["param"]]
        if a["kind"] == "ptr":
            if t != "*" + a["dtype"]:
                raise ReplayError(f"{label}: {a['param']} is {t}, the record passes *{a['dtype']}")
        elif t not in SCALAR_TYPES[a["kind"]]:
            raise ReplayError(f"{label}: {a['param']} is {t}, the record passes {a['kind']}")
    kinds = [a["kind"] for a in rec["args"]]
    if kinds.count("scratch") != 2 or kinds[-2:] != ["scratch", "scratch"]:
        raise ReplayError(f"{label}: expected the two scratch pointers last, got kinds {kinds}")
    if dict(v.constexprs) != rec["constexprs"]:
        raise ReplayError(f"{label}: the variant's constexprs {v.constexprs} are not the "
                          f"manifest's {rec['constexprs']} (regenerate kernels/build/)")
    if v.num_warps * 32 != rec["block"][0] or rec["block"][1:] != [1, 1]:
        raise ReplayError(f"{label}: block {rec['block']} for {v.num_warps} warps")


def _load(dir_, b):
    arr = np.fromfile(os.path.join(dir_, b["file"]), dtype=NP_DTYPE[b["dtype"]])
    n = int(np.prod(b["shape"], dtype=np.int64))
    if arr.size != n:
        raise ReplayError(f"{b['file']}: {arr.size} elements for shape {b['shape']}")
    return arr


# Guard bands around every buffer: the interpreter does not bounds-check, so a plan whose grid
# or strides reach past a buffer would read or write other memory (or crash). Each buffer sits
# between two bands of GUARD_MIN or its own length in elements, whichever is larger, filled with
# a byte pattern; a write past either end changes a band and fails the record.
GUARD_MIN = 4096
GUARD_BYTE = 0x5A


def _guarded(arr):
    """(backing array with guard bands, the view of ``arr``'s elements inside it, band length).
    The band is a multiple of 16 elements, so the view starts 16-byte aligned on the device
    (``replay_gpu.py``) when the backing allocation does, as the aligned (``_a16``) variants
    assume."""
    g = -(-max(GUARD_MIN, arr.size) // 16) * 16
    back = np.empty(arr.size + 2 * g, dtype=arr.dtype)
    back.view(np.uint8)[:] = GUARD_BYTE
    back[g:g + arr.size] = arr
    return back, back[g:g + arr.size], g


def _as_f32(arr, dtype):
    return np_tensor.from_bf16(arr) if dtype == "bf16" else arr.astype(np.float64)


def load_record(dir_):
    """The record.json of ``dir_``, format checked."""
    with open(os.path.join(dir_, "record.json")) as f:
        rec = json.load(f)
    if rec.get("format") != 1:
        raise ReplayError(f"{dir_}: record format {rec.get('format')}, this replayer reads 1")
    return rec


def measure(dir_, rec, guarded):
    """Checks the guard bands of every buffer and measures the expected outputs. ``guarded``:
    {buffer: (backing array, view, band length)} after the launch. Returns (stats, failures):
    stats {buffer: {"max_err", "atol", "rtol", "scale", "ratio"}} (``scale`` max |CPU op|,
    ``ratio`` the largest ``|got - want| / (atol + rtol·|want|)``: at most 1 passes), and the
    list of failure messages."""
    bufs = {name: view for name, (_, view, _) in guarded.items()}
    stats, failures = {}, []
    for name, (back, _, g) in guarded.items():
        bands = np.concatenate([back[:g].view(np.uint8), back[-g:].view(np.uint8)])
        if (bands != GUARD_BYTE).any():
            failures.append(f"the kernel wrote outside buffer {name} (grid or strides too large)")
    for name, e in rec["expected"].items():
        want = _as_f32(_load(dir_, e), e["dtype"]).astype(np.float64)
        got = _as_f32(bufs[name], e["dtype"]).astype(np.float64)
        err = np.abs(got - want)
        bound = e["atol"] + e["rtol"] * np.abs(want)
        bad = ~(err <= bound)
        max_err = float(err.max()) if err.size else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            r = err / bound  # bound >= atol > 0; a NaN result counts as infinitely off
        ratio = float(np.where(np.isnan(r), np.inf, r).max()) if r.size else 0.0
        stats[name] = {"max_err": max_err, "atol": e["atol"], "rtol": e["rtol"],
                       "scale": float(np.abs(want).max()) if want.size else 0.0,
                       "ratio": ratio if np.isfinite(ratio) else None}
        if bad.any():
            i = int(np.argmax(bad))
            failures.append(f"{name}: {int(bad.sum())} of {err.size} elements off (first at flat "
                            f"index {i}: got {got[i]!r}, CPU op {want[i]!r}; max error "
                            f"{max_err:.3g}, atol {e['atol']}, rtol {e['rtol']})")
    return stats, failures


def compare(dir_, rec, guarded):
    """Checks the guard bands of every buffer and the expected outputs. ``guarded``: {buffer:
    (backing array, view, band length)} after the launch. Returns {buffer: max abs error};
    raises ReplayError naming every failure."""
    stats, failures = measure(dir_, rec, guarded)
    if failures:
        raise ReplayError(f"{rec['label']} ({rec['name']}, grid {rec['grid']}): "
                          + "; ".join(failures))
    return {name: s["max_err"] for name, s in stats.items()}


def replay(dir_):
    """Runs one record; returns {buffer: max abs error}. Raises ReplayError on a mismatch."""
    _interpreter_fixes()
    rec = load_record(dir_)
    v = find_variant(rec)
    check_agreement(rec, v)
    guarded = {name: _guarded(_load(dir_, b)) for name, b in rec["buffers"].items()}
    bufs = {name: view for name, (_, view, _) in guarded.items()}
    call = {}  # by name: a constexpr (e.g. a None pointer) may sit between the arguments
    for a in rec["args"]:
        k = a["kind"]
        if k == "scratch":
            continue  # Triton's launcher adds these; the Python kernel has no such parameters
        if k == "ptr":
            arr = bufs[a["buffer"]]
            if a["dtype"] != rec["buffers"][a["buffer"]]["dtype"]:
                raise ReplayError(f"{rec['label']}: {a['param']} passes {a['buffer']} as "
                                  f"{a['dtype']}")
            view = arr[a["offset_elems"]:]  # a view: the kernel writes into bufs
            call[a["param"]] = np_tensor.Tensor(view, bf16=a["dtype"] == "bf16")
        elif k == "f32":
            call[a["param"]] = float(np.float32(a["value"]))
        else:
            call[a["param"]] = int(a["value"])
    grid = tuple(rec["grid"])
    v.fn[grid](**call, **v.constexprs)
    return compare(dir_, rec, guarded)


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    dirs = [d for p in argv[1:] for d in find_records(p)]
    if not dirs:
        print(f"replay: no record.json under {' '.join(argv[1:])}", file=sys.stderr)
        return 2
    failed = 0
    for d in dirs:
        try:
            errs = replay(d)
            print(f"ok    {os.path.basename(d):40} " +
                  " ".join(f"{k} max err {e:.2g}" for k, e in errs.items()))
        except ReplayError as e:
            failed += 1
            print(f"FAIL  {e}")
    print(f"replay: {len(dirs) - failed} of {len(dirs)} records give the CPU op's result")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
