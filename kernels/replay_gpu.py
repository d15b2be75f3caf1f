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

Records whose target is not the device's (``sm90a`` on compute capability 9.0, ``sm80`` on 8.x)
or whose cubin is absent (the crate's fixture family) are skipped, each named. Exit status 1 when
any record fails. Unverified until run on a GPU: written 2026-12-06 without one (the dry run and
the packing were checked on the CPU).
"""

import ctypes
import json
import os
import sys

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


class GpuError(Exception):
    pass


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
            s = ctypes.c_char_p()
            self.cu.cuGetErrorName(r, ctypes.byref(s))
            raise GpuError(f"{name}: {s.value.decode() if s.value else r}")

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

    def launch(self, fn, grid, block, shared, params):
        self._call("cuLaunchKernel", fn, *[ctypes.c_uint(x) for x in (*grid, *block)],
                   ctypes.c_uint(shared), None, params, None)
        self._call("cuCtxSynchronize")


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
    """Launches one record (``drv`` None: dry run). Returns {buffer: max abs error}, or a reason
    it was skipped (a str)."""
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
        return {n: 0.0 for n in rec["expected"]}
    ptrs = {n: drv.upload(back) for n, (back, _, _) in guarded.items()}
    try:
        starts = {n: ptrs[n] + g * back.itemsize for n, (back, _, g) in guarded.items()}
        vals, params = pack_args(rec, starts)
        check_divisibility(rec, vals)
        _, fn = drv.function(cubin, rec["entry"], rec["shared_bytes"])
        drv.launch(fn, rec["grid"], rec["block"], rec["shared_bytes"], params)
        for n, (back, _, _) in guarded.items():
            drv.download(ptrs[n], back)
    finally:
        for p in ptrs.values():
            drv.free(p)
    return replay.compare(dir_, rec, guarded)


def main(argv):
    args = [a for a in argv[1:] if a != "--dry-run"]
    dry = "--dry-run" in argv
    if not args:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    dirs = [d for p in args for d in replay.find_records(p)]
    try:
        drv = None if dry else Driver()
    except OSError as e:
        print(f"replay_gpu: no CUDA driver here ({e}); run it on the GPU machine, or --dry-run",
              file=sys.stderr)
        return 2
    target = None if drv is None else drv.target()
    if drv is not None:
        print(f"replay_gpu: compute capability {drv.capability[0]}.{drv.capability[1]}, "
              f"target {target}")
    failed = ran = 0
    for d in dirs:
        name = os.path.basename(d)
        try:
            out = run(d, drv, target)
        except (replay.ReplayError, GpuError) as e:
            failed += 1
            print(f"FAIL  {name}: {e}")
            continue
        if isinstance(out, str):
            print(f"skip  {name:40} {out}")
            continue
        ran += 1
        if dry:
            print(f"ok    {name:40} cubin found, {len(out)} output(s), arguments packed")
        else:
            print(f"ok    {name:40} " + " ".join(f"{k} max err {e:.2g}" for k, e in out.items()))
    print(f"replay_gpu: {ran} passed{' (dry run: resolved and packed)' if dry else ''}, "
          f"{failed} failed, {len(dirs) - ran - failed} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
