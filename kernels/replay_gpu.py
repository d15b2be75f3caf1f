"""Replays the Rust launch recorder's records on a GPU, with the committed cubins.

The GPU-side twin of ``kernels/replay.py``: each record (written by ``cargo test -p rlvr-kernels``
with ``RLVR_KERNEL_RECORD``, see ``crates/rlvr-kernels/src/triton/record.rs``) is launched from
``kernels/build/<target>/<name>.cubin`` through the CUDA driver API (``libcuda.so.1`` by ctypes:
no torch, no triton, no CUDA toolkit) with exactly the recorded grid, block, shared memory and
arguments, the two scratch pointers null, as rlvr's launcher passes them; every buffer sits
between guard bands on the device; the outputs are compared with the CPU op's results at the
record's tolerance. One run checks, per kernel at a small shape, that the cubin loads on this
driver, the argument ABI, and the numerics against the CPU (issue 44's first GPU check).

    python kernels/replay_gpu.py RECORDS_DIR                # on the GPU machine (needs numpy)
    python kernels/replay_gpu.py --dry-run RECORDS_DIR      # anywhere: resolve and pack only
    python kernels/replay_gpu.py [--jsonl F] [--failed F] RECORDS_DIR  # results per record
    python kernels/replay_gpu.py --time N [--timing F] [--skip-failed F] BENCH_DIR
    python kernels/replay_gpu.py [--resume F] [--start I --counts R,F,S] RECORDS_DIR

Correctness (records with expected outputs, ``rlvr kernels record --shape small``): one line per
record; ``--jsonl`` appends ``{"label", "name", "target", "dtype", "pass", "max_err", "ratio",
"outputs": {buffer: {"max_err", "atol", "rtol", "scale", "ratio"}}, "error"}`` per record
(``ratio``: the largest error over its bound ``atol + rtol·|want|``, at most 1 passes; f32
bounds are 1e-5, bf16 ones a bf16 rounding or normwise, as the record says); ``--failed``
writes the names of the failing variants, one a line (empty when all pass). A launch error
(e.g. an illegal address, which poisons the CUDA context) fails its record, and the process
re-executes itself for the rest, so one bad kernel does not stop the others. A launch still
running after ``REPLAY_LAUNCH_TIMEOUT`` seconds (default 10; completion is polled, not waited
for) fails its record as hung and ends the process with status 75, having written to
``--resume``'s file the ``--start``/``--counts`` values for a fresh process to check the rest
(``bench/gpu_check.sh`` does); in ``--time`` mode a hang stops the timing (nothing after it
can run in that process).

Timing (``--time N``, records with a ``timing`` entry, ``rlvr kernels record --shape
qwen2.5-0.5b``): each launch 3 times to warm up, then N times, each between two CUDA events;
the median, times the record's ``repeat`` (launches per training step), summed per op group and
compared with the budgets of the directory's ``bench.json``; a table is printed and
``--timing`` appends one JSON line per record and per group. Kernels named in
``--skip-failed`` (part 1's ``--failed`` file) are not launched, and their group is marked
incomplete. Without a GPU (``--dry-run``) the table shows the repeats and "no GPU".

Records whose target is not the device's (``sm90a`` on compute capability 9.0, ``sm80`` on 8.x)
or whose cubin is absent (the crate's fixture family) are skipped, each named. Exit status 1 when
any record fails. Unverified until run on a GPU: written 2026-12-06 without one (the dry run and
the packing were checked on the CPU).
"""

import ctypes
import json
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from kernels import replay  # noqa: E402  (load_record, _load, _guarded, compare: no triton)

BUILD = os.path.join(ROOT, "kernels", "build")
DEFAULT_DYNAMIC_SHARED = 48 * 1024
# CUdevice_attribute and CUfunction_attribute values (cuda.h).
CC_MAJOR, CC_MINOR = 75, 76
FUNC_MAX_DYNAMIC_SHARED = 8
# CUresult of cuStreamQuery while work is still running (cuda.h).
CUDA_ERROR_NOT_READY = 600
# Seconds a correctness launch may run (REPLAY_LAUNCH_TIMEOUT overrides; small shapes take
# microseconds), and what a timed record's launches may take together.
LAUNCH_TIMEOUT_S = float(os.environ.get("REPLAY_LAUNCH_TIMEOUT", "10"))
TIMING_TIMEOUT_S = 3 * LAUNCH_TIMEOUT_S
# Exit status after a hung launch: the caller starts a fresh process from the record that
# ``--resume`` names (a process exit is what frees a GPU from a kernel that never returns).
EXIT_HUNG = 75


class GpuError(Exception):
    pass


class HangError(GpuError):
    """A launch did not finish in time: its context stays busy until this process exits."""


def pack_args(rec, device_ptrs):
    """The kernel parameter values (ctypes objects, in order) and the ``void**`` array
    cuLaunchKernel takes. ``device_ptrs``: {buffer: address of its element 0}."""
    vals = []
    for a in rec["args"]:
        k = a["kind"]
        if k == "ptr":
            size = np.dtype(replay.NP_DTYPE[a["dtype"]]).itemsize
            vals.append(ctypes.c_uint64(device_ptrs[a["buffer"]] + a["offset_elems"] * size))
        elif k == "scratch":
            vals.append(ctypes.c_uint64(0))
        elif k == "i32":
            vals.append(ctypes.c_int32(a["value"]))
        elif k == "i64":
            vals.append(ctypes.c_int64(a["value"]))
        elif k == "f32":
            vals.append(ctypes.c_float(a["value"]))
        else:
            raise GpuError(f"{rec['label']}: unknown argument kind {k}")
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    return vals, params


class Driver:
    """The few CUDA driver calls a launch needs, on device 0's primary context."""

    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._call("cuInit", 0)
        self.dev = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(self.dev), 0)
        self.ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        self._call("cuCtxSetCurrent", self.ctx)
        cc = []
        for attr in (CC_MAJOR, CC_MINOR):
            v = ctypes.c_int()
            self._call("cuDeviceGetAttribute", ctypes.byref(v), attr, self.dev)
            cc.append(v.value)
        self.capability = tuple(cc)

    def _call(self, name, *args):
        r = getattr(self.cu, name)(*args)
        if r != 0:
            self._raise(name, r)

    def _raise(self, name, r):
        s = ctypes.c_char_p()
        self.cu.cuGetErrorName(r, ctypes.byref(s))
        raise GpuError(f"{name}: {s.value.decode() if s.value else r}")

    def wait(self, timeout_s, clock=time.monotonic, sleep=time.sleep):
        """Waits for the default stream's work by polling ``cuStreamQuery``, so that a kernel
        that never finishes becomes a :class:`HangError` after ``timeout_s`` instead of a
        process blocked in ``cuCtxSynchronize`` until the part's limit kills it."""
        t0, delay = clock(), 1e-5
        while True:
            r = self.cu.cuStreamQuery(None)
            if r == 0:
                return
            if r != CUDA_ERROR_NOT_READY:
                self._raise("cuStreamQuery", r)
            if clock() - t0 > timeout_s:
                raise HangError(f"the launch did not finish within {timeout_s:g} s (a hang?)")
            sleep(delay)
            delay = min(2 * delay, 1e-3)

    def target(self):
        major, minor = self.capability
        return {9: "sm90a" if minor == 0 else None, 8: "sm80"}.get(major)

    def function(self, cubin, entry, shared):
        data = open(cubin, "rb").read()
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(data))
        self._call("cuModuleGetFunction", ctypes.byref(fn), mod, entry.encode())
        if shared > DEFAULT_DYNAMIC_SHARED:
            self._call("cuFuncSetAttribute", fn, FUNC_MAX_DYNAMIC_SHARED, shared)
        return mod, fn

    def upload(self, arr):
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(arr.nbytes))
        self._call("cuMemcpyHtoD_v2", ptr, arr.ctypes.data_as(ctypes.c_void_p),
                   ctypes.c_size_t(arr.nbytes))
        return ptr.value

    def download(self, ptr, arr):
        self._call("cuMemcpyDtoH_v2", arr.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(ptr),
                   ctypes.c_size_t(arr.nbytes))

    def free(self, ptr):
        self._call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def launch(self, fn, grid, block, shared, params, sync=True):
        self._call("cuLaunchKernel", fn, *[ctypes.c_uint(x) for x in (*grid, *block)],
                   ctypes.c_uint(shared), None, params, None)
        if sync:
            self.wait(LAUNCH_TIMEOUT_S)

    def event(self):
        ev = ctypes.c_void_p()
        self._call("cuEventCreate", ctypes.byref(ev), 0)
        return ev

    def record_event(self, ev):
        self._call("cuEventRecord", ev, None)

    def elapsed_ms(self, start, end):
        ms = ctypes.c_float()
        # CUDA 13's header maps the name to _v2; the driver exports both (same arguments).
        name = "cuEventElapsedTime" if hasattr(self.cu, "cuEventElapsedTime") else \
            "cuEventElapsedTime_v2"
        self._call(name, ctypes.byref(ms), start, end)
        return ms.value

    def destroy_event(self, ev):
        self._call("cuEventDestroy_v2", ev)


class LaunchError(GpuError):
    """A launch or synchronisation failed: the CUDA context may be unusable from here on."""


def _dtype_of(rec):
    dts = {b["dtype"] for b in rec["expected"].values()}
    return "bf16" if "bf16" in dts or "bf16" in rec["name"] else "fp32"


_MANIFEST = {}


def check_divisibility(rec, vals):
    """Refuses, naming the parameter, an argument that breaks the manifest entry's declared
    ``divisibility`` (the aligned ``_a16`` variants: a misaligned vector access would be a CUDA
    error that poisons the context for every later record). Records of entries the manifest
    lacks (the crate's fixture family) are not checked."""
    if not _MANIFEST:
        with open(os.path.join(BUILD, "manifest.json")) as f:
            for k in json.load(f)["kernels"]:
                _MANIFEST[(k["name"], k["target"])] = k
    entry = _MANIFEST.get((rec["name"], rec["target"]))
    if entry is None:
        return
    for p, a, v in zip(entry["params"], rec["args"], vals):
        d = p.get("divisibility", 1)
        if d > 1 and v.value % d:
            raise GpuError(f"{rec['label']}: {p['name']} = {v.value:#x} is not a multiple of {d} "
                           f"({rec['name']} assumes it)")


def run(dir_, drv, target):
    """Launches one record (``drv`` None: dry run). Returns (stats, failures) as
    ``replay.measure`` gives them, or a reason it was skipped (a str)."""
    rec = replay.load_record(dir_)
    cubin = os.path.join(BUILD, rec["target"], f"{rec['name']}.cubin")
    if not os.path.isfile(cubin):
        return f"no {os.path.relpath(cubin, ROOT)}"
    if target is not None and rec["target"] != target:
        return f"planned for {rec['target']}, this GPU runs {target}"
    guarded = {n: replay._guarded(replay._load(dir_, b)) for n, b in rec["buffers"].items()}
    if drv is None:
        fake = {}
        base = 1 << 32
        for n, (back, _, g) in guarded.items():
            fake[n] = base + g * back.itemsize
            base += -(-(back.nbytes + 4096) // 256) * 256  # cuMemAlloc: 256-byte aligned
        vals, params = pack_args(rec, fake)
        assert len(params) == len(rec["args"])
        check_divisibility(rec, vals)
        return {n: {"max_err": None} for n in rec["expected"]}, []
    ptrs = {}
    try:
        for n, (back, _, _) in guarded.items():
            ptrs[n] = drv.upload(back)
        starts = {n: ptrs[n] + g * back.itemsize for n, (back, _, g) in guarded.items()}
        vals, params = pack_args(rec, starts)
        check_divisibility(rec, vals)
        _, fn = drv.function(cubin, rec["entry"], rec["shared_bytes"])
        try:
            drv.launch(fn, rec["grid"], rec["block"], rec["shared_bytes"], params)
        except HangError:
            ptrs = {}  # cuMemFree would wait for the hung kernel: the process exits instead
            raise
        except GpuError as e:
            raise LaunchError(str(e)) from None
        for n, (back, _, _) in guarded.items():
            drv.download(ptrs[n], back)
    finally:
        for p in ptrs.values():
            try:
                drv.free(p)
            except GpuError:
                pass
    return replay.measure(dir_, rec, guarded)


def time_record(dir_, drv, n_iter, warmup=3):
    """Median and minimum ms of one launch of the record over ``n_iter`` event-timed launches
    after ``warmup`` (buffers uploaded once, without guard bands; in-place kernels run on their
    own outputs again, which changes the values, not the work)."""
    rec = replay.load_record(dir_)
    cubin = os.path.join(BUILD, rec["target"], f"{rec['name']}.cubin")
    ptrs = {}
    events = []
    try:
        for n, b in rec["buffers"].items():
            ptrs[n] = drv.upload(replay._load(dir_, b))
        vals, params = pack_args(rec, ptrs)  # vals: the memory params points into
        _, fn = drv.function(cubin, rec["entry"], rec["shared_bytes"])
        args = (fn, rec["grid"], rec["block"], rec["shared_bytes"], params)
        for _ in range(warmup):
            drv.launch(*args, sync=False)
        drv.wait(TIMING_TIMEOUT_S)
        events = [(drv.event(), drv.event()) for _ in range(n_iter)]
        for a, b in events:
            drv.record_event(a)
            drv.launch(*args, sync=False)
            drv.record_event(b)
        drv.wait(TIMING_TIMEOUT_S)
        ms = sorted(drv.elapsed_ms(a, b) for a, b in events)
        del vals
    except HangError:
        events, ptrs = [], {}  # their release would wait for the hung kernel
        raise
    finally:
        for a, b in events:
            drv.destroy_event(a)
            drv.destroy_event(b)
        for p in ptrs.values():
            drv.free(p)
    return ms[len(ms) // 2], ms[0]


def _append(path, row):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _bench_json(dirs):
    """The ``bench.json`` beside the records (the directory above a record), if any."""
    for d in dirs:
        p = os.path.join(os.path.dirname(d), "bench.json")
        if os.path.isfile(p):
            with open(p) as f:
                return json.load(f)
    return None


def timing(dirs, drv, n_iter, out_path, skip):
    """``--time``: every record with a ``timing`` entry; the per-group table against
    ``bench.json``'s budgets. Returns the exit status (0: timed or dry run; 1: a launch failed)."""
    bench = _bench_json(dirs) or {"groups": {}}
    target = None if drv is None else drv.target()
    groups = {g: {"ms": 0.0, "incomplete": [], "budget_ms": v["budget_ms"], "what": v["what"]}
              for g, v in bench.get("groups", {}).items()}
    if drv is None:
        print("replay_gpu --time: no GPU (dry run): the launches and their repeats, no times")
    status, hung = 0, None
    print(f"{'record':28} {'variant':28} {'group':9} {'median ms':>10} {'x repeat':>9} "
          f"{'ms/step':>9}")
    for d in dirs:
        rec = replay.load_record(d)
        t = rec.get("timing")
        if not t:
            continue
        g = groups.setdefault(t["group"], {"ms": 0.0, "incomplete": [], "budget_ms": None,
                                           "what": ""})
        row = {"kind": "launch", "label": rec["label"], "name": rec["name"],
               "target": rec["target"], "group": t["group"], "repeat": t["repeat"],
               "note": t["note"], "grid": rec["grid"], "median_ms": None, "min_ms": None,
               "ms_per_step": None, "iters": n_iter}
        why = None
        if rec["name"] in skip:
            why = "skipped: failed the correctness check"
        elif hung:
            why = f"not timed: {hung} hung before"
        elif drv is None:
            why = "no GPU"
        elif rec["target"] != target:
            why = f"planned for {rec['target']}, this GPU runs {target}"
        elif not os.path.isfile(os.path.join(BUILD, rec["target"], f"{rec['name']}.cubin")):
            why = f"no cubin for {rec['name']}"
        if why is None:
            try:
                med, lo = time_record(d, drv, n_iter)
                row.update(median_ms=med, min_ms=lo, ms_per_step=med * t["repeat"])
                g["ms"] += med * t["repeat"]
            except HangError as e:
                # The GPU stays busy with it: nothing after it can be timed in this process.
                why, hung, status = f"FAIL {e}", rec["label"], 1
            except GpuError as e:
                why = f"FAIL {e}"
                status = 1
        if why is not None:
            row["status"] = why
            g["incomplete"].append(rec["label"])
            print(f"{rec['label']:28} {rec['name']:28} {t['group']:9} {why:>10} "
                  f"{t['repeat']:>9.3f}")
        else:
            print(f"{rec['label']:28} {rec['name']:28} {t['group']:9} {row['median_ms']:>10.4f} "
                  f"{t['repeat']:>9.3f} {row['ms_per_step']:>9.3f}")
        if "SCALED" in t["note"]:
            print(f"{'':28} ({t['note']})")
        _append(out_path, row)
    print(f"\n{'group':10} {'ms/step':>9} {'budget':>8}  verdict")
    for name, g in groups.items():
        if drv is None:
            key, verdict, ms = "NO_GPU", "no GPU", None
        elif g["incomplete"]:
            key, ms = "INCOMPLETE", g["ms"]
            verdict = f"INCOMPLETE (not timed: {', '.join(g['incomplete'])})"
        elif g["budget_ms"] is None:
            key, verdict, ms = "NO_BUDGET", "no budget", g["ms"]
        else:
            ms = g["ms"]
            key = verdict = "WITHIN" if ms <= g["budget_ms"] else "OVER"
        shown = "-" if ms is None else f"{ms:.3f}"
        budget = "-" if g["budget_ms"] is None else f"{g['budget_ms']:g}"
        print(f"{name:10} {shown:>9} {budget:>8}  {verdict}: {g['what']}")
        _append(out_path, {"kind": "group", "group": name, "ms_per_step": ms,
                           "budget_ms": g["budget_ms"],
                           "verdict": key,
                           "not_timed": g["incomplete"], "what": g["what"],
                           "shape": bench.get("shape"), "device_target": target})
    if any("adamw" == n for n in groups):
        print("(adamw: measured on one tensor and scaled to every parameter, as its rows say)")
    return status


def _parse(argv):
    opts = {"dry": False, "time": 0, "jsonl": None, "failed": None, "timing": None,
            "skip_failed": None, "resume": None, "start": 0, "counts": (0, 0, 0), "dirs": []}
    it = iter(argv)
    for a in it:
        if a == "--dry-run":
            opts["dry"] = True
        elif a in ("--time", "--jsonl", "--failed", "--timing", "--skip-failed", "--start",
                   "--counts", "--resume"):
            v = next(it, None)
            if v is None:
                raise SystemExit(f"replay_gpu: {a} needs a value")
            key = a[2:].replace("-", "_")
            if key in ("time", "start"):
                v = int(v)
            elif key == "counts":
                v = tuple(int(x) for x in v.split(","))
            opts[key] = v
        elif a.startswith("--"):
            raise SystemExit(f"replay_gpu: unknown option {a}")
        else:
            opts["dirs"].append(a)
    return opts


def main(argv):
    o = _parse(argv[1:])
    dry = o["dry"]
    if not o["dirs"]:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    dirs = [d for p in o["dirs"] for d in replay.find_records(p)]
    try:
        drv = None if dry else Driver()
    except (OSError, GpuError) as e:
        print(f"replay_gpu: no CUDA driver here ({e}); run it on the GPU machine, or --dry-run",
              file=sys.stderr)
        return 2
    target = None if drv is None else drv.target()
    if drv is not None and o["start"] == 0:
        print(f"replay_gpu: compute capability {drv.capability[0]}.{drv.capability[1]}, "
              f"target {target}")
    if o["time"]:
        skip = set()
        if o["skip_failed"] and os.path.isfile(o["skip_failed"]):
            skip = {l.strip() for l in open(o["skip_failed"]) if l.strip()}
        return timing(dirs, drv, o["time"], o["timing"], skip)
    if o["failed"] and o["start"] == 0:
        open(o["failed"], "w").close()
    ran, failed, skipped = o["counts"]
    for idx in range(o["start"], len(dirs)):
        d = dirs[idx]
        name = os.path.basename(d)
        rec = None
        try:
            rec = replay.load_record(d)
            out = run(d, drv, target)
        except (replay.ReplayError, GpuError, OSError, ValueError) as e:
            out = ({}, [str(e)])
            if isinstance(e, HangError):
                failed += 1
                _report_fail(o, rec, name, d, str(e))
                _hung_exit(o, idx + 1 if idx + 1 < len(dirs) else None, (ran, failed, skipped))
            if isinstance(e, LaunchError) and idx + 1 < len(dirs):
                failed += 1
                _report_fail(o, rec, name, d, str(e))
                print(f"replay_gpu: a launch failed ({e}); continuing in a fresh process",
                      flush=True)
                args = [a for a in argv[1:]]
                args = _strip(args, ("--start", "--counts"))
                os.execv(sys.executable, [sys.executable, os.path.abspath(__file__),
                                          "--start", str(idx + 1), "--counts",
                                          f"{ran},{failed},{skipped}"] + args)
        if isinstance(out, str):
            skipped += 1
            print(f"skip  {name:40} {out}")
            continue
        stats, failures = out
        if failures:
            failed += 1
            _report_fail(o, rec, name, d, "; ".join(failures), stats)
            continue
        ran += 1
        if dry:
            print(f"ok    {name:40} cubin found, {len(stats)} output(s), arguments packed")
        else:
            print(f"ok    {name:40} " + " ".join(
                f"{k} max err {s['max_err']:.2g} ({s['ratio']:.2g} of bound)"
                for k, s in stats.items()))
        _append(o["jsonl"], _row(rec, True, stats, None, dry))
    print(f"replay_gpu: {ran} passed{' (dry run: resolved and packed)' if dry else ''}, "
          f"{failed} failed, {skipped} skipped")
    return 1 if failed else 0


def _hung_exit(o, start, counts):
    """Ends the process after a hung launch (only its exit frees the GPU from the kernel),
    writing ``START RAN,FAILED,SKIPPED`` to ``--resume``'s file when records remain, for the
    caller to run a fresh process from there (``--start START --counts ...``)."""
    if start is not None and o["resume"]:
        with open(o["resume"], "w") as f:
            f.write(f"{start} {','.join(str(c) for c in counts)}\n")
        print(f"replay_gpu: a launch hung; records from {start} on need a fresh process "
              f"(--start {start}; {o['resume']})", flush=True)
    else:
        print(f"replay_gpu: a launch hung; {counts[0]} passed, {counts[1]} failed, "
              f"{counts[2]} skipped before it", flush=True)
    sys.stderr.flush()
    os._exit(EXIT_HUNG)


def _strip(args, opts):
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in opts:
            skip = True
            continue
        out.append(a)
    return out


def _row(rec, ok, stats, error, dry):
    stats = stats or {}
    errs = [s["max_err"] for s in stats.values() if s.get("max_err") is not None]
    ratios = [s.get("ratio") for s in stats.values()]
    return {"label": rec["label"] if rec else None, "name": rec["name"] if rec else None,
            "target": rec["target"] if rec else None,
            "dtype": _dtype_of(rec) if rec else None, "pass": ok, "dry_run": dry,
            "max_err": max(errs) if errs else None,
            "ratio": None if (not ratios or None in ratios) else max(ratios),
            "outputs": stats, "error": error}


def _report_fail(o, rec, name, d, msg, stats=None):
    print(f"FAIL  {name}: {msg}", flush=True)
    _append(o["jsonl"], _row(rec, False, stats, msg, o["dry"]))
    if o["failed"]:
        variant = rec["name"] if rec else name
        have = open(o["failed"]).read().split() if os.path.isfile(o["failed"]) else []
        if variant not in have:
            with open(o["failed"], "a") as f:
                f.write(variant + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
