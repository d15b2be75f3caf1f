"""``kernels/replay_gpu.py``'s hang handling, without a GPU: the polled wait, and the exit with a
resume point that ``bench/gpu_check.sh`` uses to check the remaining records in a fresh process.
(The records themselves are covered by ``test_replay.py`` when launch records exist.)"""

import os
import subprocess
import sys

import pytest

from kernels import replay_gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class FakeCu:
    """``libcuda``'s two calls that ``Driver.wait`` makes: ``cuStreamQuery`` answers from
    ``results`` in turn (the last one repeated)."""

    def __init__(self, results):
        self.results = list(results)
        self.queries = 0

    def cuStreamQuery(self, stream):
        assert stream is None  # the default stream, where the replay launches
        self.queries += 1
        return self.results[min(self.queries, len(self.results)) - 1]

    def cuGetErrorName(self, r, out):
        return 0


def driver(results):
    d = replay_gpu.Driver.__new__(replay_gpu.Driver)  # no libcuda: only `wait` is used
    d.cu = FakeCu(results)
    return d


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, dt):
        self.t += dt


def test_wait_returns_when_the_stream_is_done():
    d, c = driver([600, 600, 0]), Clock()
    d.wait(10, clock=c, sleep=c.sleep)
    assert d.cu.queries == 3


def test_wait_turns_a_kernel_that_never_finishes_into_a_hang_error():
    d, c = driver([600]), Clock()
    with pytest.raises(replay_gpu.HangError, match="within 2 s"):
        d.wait(2, clock=c, sleep=c.sleep)
    assert 2 < c.t < 2.01  # polled up to the deadline, in steps of at most 1 ms
    assert d.cu.queries > 2000


def test_wait_reports_a_launch_error():
    d, c = driver([600, 700]), Clock()  # 700: CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(replay_gpu.GpuError) as e:
        d.wait(10, clock=c, sleep=c.sleep)
    assert not isinstance(e.value, replay_gpu.HangError)
    assert "cuStreamQuery: 700" in str(e.value)


# main() over three records whose second hangs, with `run` and the driver stubbed; in a
# subprocess since a hang ends the process with os._exit.
SCRIPT = r"""
import sys
sys.path.insert(0, sys.argv[1])
from kernels import replay, replay_gpu
names = ["rec_a", "rec_hang", "rec_c"]
replay.find_records = lambda p: [f"{p}/{n}" for n in names]
replay.load_record = lambda d: {"label": d.rsplit("/", 1)[1], "name": "v_" + d.rsplit("/", 1)[1],
                                "target": "sm90a", "expected": {"out": {"dtype": "fp32"}}}
class Drv:
    capability = (9, 0)
    def target(self):
        return "sm90a"
replay_gpu.Driver = Drv
def run(d, drv, target):
    if d.endswith("rec_hang"):
        raise replay_gpu.HangError("the launch did not finish within 10 s (a hang?)")
    return {"out": {"max_err": 0.0, "ratio": 0.0}}, []
replay_gpu.run = run
sys.exit(replay_gpu.main(["replay_gpu.py"] + sys.argv[2:]))
"""


def test_a_hang_ends_the_process_with_a_resume_point(tmp_path):
    resume, failed, jsonl = tmp_path / "resume", tmp_path / "failed", tmp_path / "r.jsonl"
    args = [sys.executable, "-c", SCRIPT, ROOT, "--resume", str(resume), "--failed", str(failed),
            "--jsonl", str(jsonl)]
    p = subprocess.run(args + ["recs"], capture_output=True, text=True)
    assert p.returncode == replay_gpu.EXIT_HUNG, p.stdout + p.stderr
    assert resume.read_text() == "2 1,1,0\n"
    assert failed.read_text() == "v_rec_hang\n"
    assert "FAIL  rec_hang: the launch did not finish" in p.stdout
    # The fresh process checks the rest and keeps the earlier failure.
    start, counts = resume.read_text().split()
    p = subprocess.run(args + ["--start", start, "--counts", counts, "recs"], capture_output=True,
                       text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "replay_gpu: 2 passed, 1 failed, 0 skipped" in p.stdout
    assert failed.read_text() == "v_rec_hang\n"
    rows = jsonl.read_text().splitlines()
    assert len(rows) == 3 and '"pass": false' in rows[1]
