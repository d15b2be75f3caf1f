"""Compiles every kernel variant ahead of time and writes ``kernels/build/`` (PTX, cubin, manifest).

    python kernels/generate.py            # regenerate kernels/build/ (the whole set, every module)
    python kernels/generate.py --check    # regenerate into a temporary directory and compare

Run it with the pinned toolchain (``kernels/requirements.txt``; ``scripts/ci_kernels.sh`` makes
that venv). Every ``kernels/src/*.py`` module is imported (sorted by name) and its ``VARIANTS``
collected; each (variant, target) is compiled by ``triton.compile`` for ``GPUTarget("cuda", cc,
32)`` with PTX ISA 9.0 (the lent machines' CUDA 13.0 driver cannot load Triton 3.9's default 9.4),
in this process or its forked workers (``-j``), never under the interpreter. The PTX is then assembled by the **CUDA 13.0
ptxas** (13.0.88, from PyPI's ``nvidia-cuda-nvcc`` wheel; fetched and cached on first use, or
``--ptxas``/``$PTXAS``), whose ``-v`` report gives the registers and spills. The manifest's format
is in ``kernels/README.md``; output is deterministic (sorted keys, entries sorted by name and
target, no timestamps, no absolute paths), so a regeneration equals the committed files.

Checks (both modes; exit status 1): the PTX ``.entry`` parameter list against the variant's
signature plus Triton's two trailing scratch pointers, and the cubin's own parameter table
(count and widths); ``.reqntid`` against the warps; no spill unless the variant allows it; an
aligned variant (``Variant.divisible``, compiled with ``tt.divisibility = 16``) has vector
accesses in its PTX;
shared memory within the target's limit; at most 1024 threads; no clusters. ``--check`` also
fails, naming each file, when the committed artifacts differ from the regeneration.
"""

import argparse
import concurrent.futures
import filecmp
import hashlib
import importlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.path.join(ROOT, "kernels", "build")
SRC = os.path.join(ROOT, "kernels", "src")
if __name__ == "__main__":
    # Run as the generator (not imported by a test): compile for real (the tests set
    # TRITON_INTERPRET), and leave no line info (it would put absolute source paths into the PTX).
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(ROOT, "target", "kernels-cache", "triton"))
    sys.path.insert(0, ROOT)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.variant import TARGETS, Variant  # noqa: E402

FORMAT = 1
PTX_VERSION = 90  # PTX ISA 9.0, what CUDA 13.0 (driver 580) loads
# target -> (compute capability, ptxas --gpu-name, max dynamic+static shared bytes per block)
TARGET_INFO = {
    "sm90a": (90, "sm_90a", 227 * 1024),
    "sm80": (80, "sm_80", 163 * 1024),
}
MAX_THREADS = 1024
# The CUDA 13.0 ptxas, from PyPI: wheel pinned by version and hash.
PTXAS_VERSION = "13.0.88"
PTXAS_WHEEL = "nvidia-cuda-nvcc==13.0.88"
PTXAS_WHEEL_SHA256 = "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03"
PTXAS_MEMBER = "nvidia/cu13/bin/ptxas"
PTXAS_CACHE = os.path.join(ROOT, "target", "kernels-ptxas", PTXAS_VERSION)
# Triton 3.9 appends two pointers to every kernel's parameters (global and profile scratch).
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")
# What ``Variant.divisible`` assumes: pointers 16-byte aligned, integers multiples of 16.
DIVISIBILITY = 16


class GenError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# ptxas


def fetch_ptxas():
    """Path of the cached CUDA 13.0.88 ptxas, downloading PyPI's wheel once (pip, no deps)."""
    exe = os.path.join(PTXAS_CACHE, "bin", "ptxas")
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return exe
    os.makedirs(PTXAS_CACHE, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PTXAS_CACHE) as d:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-cache-dir", "--no-deps", "-d", d, PTXAS_WHEEL]
        subprocess.run(cmd, check=True)
        (whl,) = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".whl")]
        with open(whl, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != PTXAS_WHEEL_SHA256:
            raise GenError(f"{os.path.basename(whl)}: sha256 {digest}, expected {PTXAS_WHEEL_SHA256}")
        with zipfile.ZipFile(whl) as z:
            data = z.read(PTXAS_MEMBER)
        os.makedirs(os.path.dirname(exe), exist_ok=True)
        tmp = exe + ".part"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, exe)
    return exe


def find_ptxas(explicit):
    exe = explicit or os.environ.get("PTXAS") or fetch_ptxas()
    out = subprocess.run([exe, "--version"], check=True, capture_output=True, text=True).stdout
    if f"V{PTXAS_VERSION}" not in out:
        raise GenError(f"{exe} is not ptxas {PTXAS_VERSION}:\n{out}")
    return exe


CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
_PARAM_BYTES = {"i32": 4, "u32": 4, "fp32": 4, "i64": 8, "u64": 8, "fp64": 8, "i1": 1}


def cubin_param_sizes(cubin):
    """The kernel parameters' byte sizes in ordinal order, from the cubin's EIATTR_KPARAM_INFO
    (read by the cuobjdump that Triton's wheel ships)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([CUOBJDUMP, "-elf", path], check=True, capture_output=True,
                             text=True).stdout
    found = re.findall(r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)", out)
    return [int(size, 16) for _, _, size in sorted(found, key=lambda x: int(x[0], 16))]


def assemble(ptxas, ptx, gpu_name, fp_fusion):
    """PTX text -> (cubin bytes, registers, spill bytes), by ptxas -v (the flags Triton uses,
    without line info)."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(ptx)
        cmd = [ptxas, *([] if fp_fusion else ["--fmad=false"]), "-v", "--regAllocOptLevel=2",
               f"--gpu-name={gpu_name}", "k.ptx", "-o", "k.cubin"]
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            raise GenError(f"ptxas failed ({' '.join(cmd)}):\n{r.stderr}")
        with open(os.path.join(d, "k.cubin"), "rb") as f:
            cubin = f.read()
    log = r.stderr + r.stdout
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not regs or not spill:
        raise GenError(f"cannot read registers/spills from ptxas -v:\n{log}")
    return cubin, int(regs.group(1)), int(spill.group(1)) + int(spill.group(2))


# ---------------------------------------------------------------------------------------------
# variants


def source_sha256(path):
    """SHA-256 over a kernel module's bytes followed by those of every shared helper module it
    imports (``from kernels.src._name import ...``, in the order imported), so that editing a
    helper such as ``_bf16.py`` changes the hash of each module compiled with it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        text = f.read()
    h.update(text)
    for helper in re.findall(rb"^from kernels\.src\.(_\w+) import", text, re.M):
        with open(os.path.join(SRC, helper.decode() + ".py"), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def rel(path):
    return os.path.relpath(path, ROOT).replace(os.sep, "/")


def load_variants():
    """[(module file, Variant)] over every kernels/src/*.py module, sorted by module name."""
    out, names, sigs = [], {}, {}
    for fname in sorted(os.listdir(SRC)):
        if not fname.endswith(".py") or fname.startswith("_"):
            continue
        mod = importlib.import_module(f"kernels.src.{fname[:-3]}")
        variants = getattr(mod, "VARIANTS", None)
        if variants is None:
            raise GenError(f"kernels/src/{fname} has no VARIANTS list")
        for v in variants:
            if not isinstance(v, Variant):
                raise GenError(f"kernels/src/{fname}: {v!r} is not a Variant")
            # A name may be listed once per target (a variant whose block sizes differ per target
            # is two Variants), always in one module and with one parameter list: the launcher
            # builds a name's arguments the same way whatever the target.
            typed = [(k, t) for k, t in v.signature.items() if t != "constexpr"]
            for t in v.targets:
                if (v.name, t) in names:
                    raise GenError(f"variant {v.name} ({t}) is in both {names[(v.name, t)]} and {fname}")
                names[(v.name, t)] = fname
            for (other, _), f2 in names.items():
                if other == v.name and f2 != fname:
                    raise GenError(f"variant {v.name} is in both {f2} and {fname}")
            if sigs.setdefault(v.name, typed) != typed:
                raise GenError(f"variant {v.name}: its targets' variants have different parameter lists")
            check_signature(v)
            out.append((os.path.join(SRC, fname), v))
    return out


def check_signature(v):
    args = list(v.fn.arg_names)
    if list(v.signature) != args:
        raise GenError(f"{v.name}: signature keys {list(v.signature)} are not {v.fn.__name__}'s "
                       f"parameters {args} in order")
    const = [k for k, t in v.signature.items() if t == "constexpr"]
    if sorted(const) != sorted(v.constexprs):
        raise GenError(f"{v.name}: constexpr parameters {const} but constexprs {sorted(v.constexprs)}")
    for t in v.targets:
        if t not in TARGETS:
            raise GenError(f"{v.name}: unknown target {t}")
    for p in v.divisible:
        t = v.signature.get(p)
        if t is None or t == "constexpr" or not (t.startswith("*") or t in ("i32", "i64")):
            raise GenError(f"{v.name}: divisible parameter {p} is {t or 'not a parameter'}; only "
                           "pointers and i32/i64 parameters can be assumed divisible by 16")
    if len(set(v.divisible)) != len(v.divisible):
        raise GenError(f"{v.name}: divisible lists a parameter twice: {v.divisible}")


def divisibility_attrs(v):
    """``ASTSource``'s ``attrs``: ``{(index,): [["tt.divisibility", 16]]}`` for each parameter of
    ``v.divisible``, keyed by its index in the kernel's full parameter list (constexprs included),
    the form Triton 3.9's own launcher builds from its "D" specialisation."""
    args = list(v.fn.arg_names)
    return {(args.index(p),): [["tt.divisibility", DIVISIBILITY]] for p in v.divisible}


# PTX parameter types a signature type compiles to.
_PTX_TYPE = {"i32": "u32", "u32": "u32", "i64": "u64", "u64": "u64", "fp32": "f32", "fp64": "f64",
             "i1": "u8"}


def ptx_params(ptx, entry):
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise GenError(f"no .entry {entry} in the PTX")
    return re.findall(r"\.param\s+\.(\w+)(\s+\.ptr)?[^,]*?\s(\w+)\s*(?:,|$)", m.group(1).strip())


def manifest_params(v, ptx, entry):
    """The ordered parameter list, checked against the PTX .entry."""
    want = []
    for name, t in v.signature.items():
        if t == "constexpr":
            continue
        if t.startswith("*"):
            want.append({"name": name, "kind": "ptr", "dtype": t[1:]})
        else:
            if t not in _PTX_TYPE:
                raise GenError(f"{v.name}: unsupported scalar type {t} for {name}")
            want.append({"name": name, "kind": "scalar", "dtype": t})
        if name in v.divisible:
            # Optional (absent = 1): pointer address in bytes / integer value, a multiple of it.
            want[-1]["divisibility"] = DIVISIBILITY
    want += [{"name": s, "kind": "scratch", "dtype": "u8"} for s in SCRATCH_PARAMS]
    got = ptx_params(ptx, entry)
    if len(got) != len(want):
        raise GenError(f"{v.name}: the PTX entry has {len(got)} parameters, the signature gives "
                       f"{len(want)} ({[p['name'] for p in want]})")
    for p, (ty, ptr, pname) in zip(want, got):
        expect = ("u64", True) if p["kind"] in ("ptr", "scratch") else (_PTX_TYPE[p["dtype"]], False)
        if (ty, bool(ptr)) != expect and not (not expect[1] and ty == "b" + expect[0][1:]):
            raise GenError(f"{v.name}: PTX parameter {pname} is .{ty}{' .ptr' if ptr else ''}, "
                           f"expected {p['kind']} {p['dtype']}")
    return want


def vector_accesses(ptx):
    """128/64-bit global loads and stores (``ld/st.global….v4/.v2``) and 16-byte ``cp.async``
    copies in a PTX text: what the aligned variants are for."""
    vec = re.findall(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st)\.global\S*\.v[24]\.", ptx, re.M)
    sizes = re.findall(r"cp\.async\.\S+\s+\[[^]]*\],\s*\[[^]]*\],\s*(0x[0-9a-fA-F]+|\d+)", ptx)
    return len(vec) + sum(int(n, 0) == 16 for n in sizes)


_WORK = []  # the jobs, set before the worker processes fork (a Variant's function does not pickle)


def compile_one(i):
    """Job i (a variant and a target): compiled, assembled and described (in a worker process)."""
    path, v, target, ptxas = _WORK[i]
    cc, gpu_name, smem_limit = TARGET_INFO[target]
    src = ASTSource(v.fn, dict(v.signature), constexprs=dict(v.constexprs),
                    attrs=divisibility_attrs(v))
    opts = {"num_warps": v.num_warps, "num_stages": v.num_stages, "ptx_version": PTX_VERSION,
            "enable_fp_fusion": v.fp_fusion}
    t0 = time.time()
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
    md = k.metadata
    ptx = k.asm["ptx"]
    entry = md.name
    cubin, regs, spills = assemble(ptxas, ptx, gpu_name, v.fp_fusion)
    problems = []
    params = manifest_params(v, ptx, entry)
    sizes = [8 if p["kind"] != "scalar" else _PARAM_BYTES[p["dtype"]] for p in params]
    in_cubin = cubin_param_sizes(cubin)
    if in_cubin != sizes:
        problems.append(f"the cubin's parameter sizes {in_cubin} are not the manifest's {sizes}")
    version = re.search(r"^\.version\s+(\S+)", ptx, re.M).group(1)
    if version != f"{PTX_VERSION // 10}.{PTX_VERSION % 10}":
        problems.append(f"PTX .version {version}")
    threads = v.num_warps * 32
    reqntid = re.search(r"\.reqntid\s+(\d+)", ptx)
    if reqntid and int(reqntid.group(1)) != threads:
        problems.append(f".reqntid {reqntid.group(1)} but {v.num_warps} warps")
    if threads > MAX_THREADS:
        problems.append(f"{threads} threads > {MAX_THREADS}")
    if md.shared > smem_limit:
        problems.append(f"{md.shared} bytes of shared memory > {smem_limit} ({target})")
    if spills and not v.allow_spills:
        problems.append(f"{spills} bytes of spill stores+loads (ptxas {PTXAS_VERSION})")
    if v.divisible and not vector_accesses(ptx):
        problems.append(f"divisible {list(v.divisible)} assumed, but the PTX has no vector load, "
                        "store or 16-byte cp.async: the aligned variant gains nothing")
    if md.num_ctas != 1:
        problems.append(f"num_ctas {md.num_ctas}: the launcher supports no clusters")
    rec = {
        "name": v.name,
        "family": os.path.basename(path)[:-3],
        "source": rel(path),
        "source_sha256": source_sha256(path),
        "target": target,
        "entry": entry,
        "cubin": f"{target}/{v.name}.cubin",
        "ptx": f"{target}/{v.name}.ptx",
        "ptx_version": version,
        "params": params,
        "constexprs": {k2: (c if isinstance(c, (int, float, str, bool, type(None))) else str(c))
                       for k2, c in v.constexprs.items()},
        "num_warps": v.num_warps,
        "threads": threads,
        "num_stages": v.num_stages,
        "num_ctas": md.num_ctas,
        "cluster_dims": [1, 1, 1],
        "shared_bytes": md.shared,
        "global_scratch_bytes": md.global_scratch_size,
        "profile_scratch_bytes": md.profile_scratch_size,
        "fp_fusion": v.fp_fusion,
        "registers": regs,
        "spills": spills,
    }
    return rec, ptx, cubin, problems, time.time() - t0


def generate(out_dir, ptxas, jobs):
    """Writes the whole set into out_dir (created; must not exist). Returns the problems found."""
    work = [(path, v, t, ptxas) for path, v in load_variants() for t in v.targets]
    work.sort(key=lambda j: (j[1].name, j[2]))
    _WORK[:] = work
    if jobs > 1:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
            results = list(ex.map(compile_one, range(len(work))))
    else:
        results = [compile_one(i) for i in range(len(work))]
    os.makedirs(out_dir)
    entries, problems = [], []
    for rec, ptx, cubin, probs, secs in results:
        print(f"  {rec['target']:6} {rec['name']:40} regs {rec['registers']:3}  "
              f"smem {rec['shared_bytes']:6}  {secs:4.1f} s", file=sys.stderr)
        for sub, data, mode in (("ptx", ptx, "w"), ("cubin", cubin, "wb")):
            p = os.path.join(out_dir, rec[sub])
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, mode) as f:
                f.write(data)
        problems += [f"{rec['name']} ({rec['target']}): {p}" for p in probs]
        entries.append(rec)
    manifest = {"format": FORMAT, "triton": triton.__version__, "ptxas": PTXAS_VERSION,
                "kernels": entries}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return problems


def tree(d):
    out = set()
    for base, _, files in os.walk(d):
        for f in files:
            out.add(os.path.relpath(os.path.join(base, f), d).replace(os.sep, "/"))
    return out


def compare(fresh, committed):
    """The files that differ between two build trees, each with why."""
    a, b = tree(fresh), tree(committed) if os.path.isdir(committed) else set()
    diffs = [f"{f}: not committed (new)" for f in sorted(a - b)]
    diffs += [f"{f}: committed but no longer generated" for f in sorted(b - a)]
    diffs += [f"{f}: differs from a regeneration" for f in sorted(a & b)
              if not filecmp.cmp(os.path.join(fresh, f), os.path.join(committed, f), shallow=False)]
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory; fail if kernels/build/ differs")
    ap.add_argument("--ptxas", help=f"ptxas {PTXAS_VERSION} to use (default: $PTXAS, else fetched "
                    f"into {rel(PTXAS_CACHE)})")
    ap.add_argument("--fetch-ptxas", action="store_true", help="only fetch (cache) ptxas, print its path")
    ap.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="compile in this many processes")
    a = ap.parse_args()
    if triton.__version__ != "3.9.0":
        raise GenError(f"triton {triton.__version__}; kernels/requirements.txt pins 3.9.0")
    ptxas = find_ptxas(a.ptxas)
    # Triton's own cubin step (whose output is not used) would run its bundled ptxas, which for
    # sm_80 is 12.9 and refuses PTX 9.0: it runs the pinned one too.
    os.environ["TRITON_PTXAS_PATH"] = os.environ["TRITON_PTXAS_BLACKWELL_PATH"] = ptxas
    if a.fetch_ptxas:
        print(ptxas)
        return 0
    t0 = time.time()
    parent = os.path.join(ROOT, "target")
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix="kernels-gen-") as tmp:
        fresh = os.path.join(tmp, "build")
        problems = generate(fresh, ptxas, a.jobs)
        n = len(tree(fresh)) - 1
        if a.check:
            diffs = compare(fresh, BUILD)
            for d in diffs:
                print(f"generate --check: kernels/build/{d}", file=sys.stderr)
            if diffs:
                problems.append(f"{len(diffs)} file(s) of kernels/build/ differ from a regeneration: "
                                "run python kernels/generate.py and commit kernels/build/")
        else:
            if os.path.isdir(BUILD):
                shutil.rmtree(BUILD)
            shutil.move(fresh, BUILD)
    for p in problems:
        print(f"generate: {p}", file=sys.stderr)
    print(f"generate: {n} artifacts {'checked' if a.check else 'written'} in {time.time() - t0:.1f} s"
          f"{'' if not problems else f'; {len(problems)} problem(s)'}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GenError as e:
        print(f"generate: {e}", file=sys.stderr)
        sys.exit(1)
