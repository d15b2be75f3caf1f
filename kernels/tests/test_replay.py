"""The Rust launch recorder's records, replayed under the interpreter (``kernels/replay.py``).

The records come from ``cargo test -p rlvr-kernels``, written into the directory named by
``RLVR_KERNEL_RECORD`` (an absolute path). CI runs, from the repository root:

    export RLVR_KERNEL_RECORD=$PWD/target/kernel-records
    cargo test -p rlvr-kernels --lib triton::
    python -m pytest -q kernels/tests/test_replay.py

Without the variable, or with no record in it, this module is skipped, saying why.
"""

import os

import pytest

from kernels import replay, replay_gpu

RECORDS = os.environ.get("RLVR_KERNEL_RECORD", "")
DIRS = replay.find_records(RECORDS) if RECORDS and os.path.isdir(RECORDS) else []

if not RECORDS:
    pytestmark = pytest.mark.skip(
        reason="RLVR_KERNEL_RECORD is not set: run `RLVR_KERNEL_RECORD=$PWD/target/kernel-records "
        "cargo test -p rlvr-kernels --lib triton::` first and export the same variable")
elif not DIRS:
    pytestmark = pytest.mark.skip(
        reason=f"no launch record (record.json) under RLVR_KERNEL_RECORD={RECORDS}: the Rust "
        "test writing them (cargo test -p rlvr-kernels --lib triton::) did not run there")


@pytest.mark.parametrize("record", DIRS or ["none"], ids=os.path.basename)
def test_replay_gives_the_cpu_op_result(record):
    errors = replay.replay(record)
    assert errors, f"{record}: no expected output to compare"


def _mutated(record, tmp_path, edit):
    """A copy of ``record`` with ``edit(rec_json)`` applied."""
    import json
    import shutil

    dst = tmp_path / os.path.basename(record)
    shutil.copytree(record, dst)
    with open(dst / "record.json") as f:
        rec = json.load(f)
    edit(rec)
    with open(dst / "record.json", "w") as f:
        json.dump(rec, f)
    return str(dst)


FIXTURES = [d for d in DIRS if os.path.basename(d).startswith("fixture_")]


@pytest.mark.parametrize("record", FIXTURES or ["none"], ids=os.path.basename)
def test_replay_catches_plan_mistakes(record, tmp_path):
    """The mistakes the replay exists for: a grid one block short, two scalars swapped (the
    strides), a pointer offset lost, arguments in another order than the kernel's."""
    if record == "none":
        pytest.skip("no fixture record (the Rust test writes fixture_* records)")

    def short_grid(rec):
        rec["grid"][1] -= 1

    def swapped_strides(rec):
        a = {x["param"]: x for x in rec["args"]}
        x, y = a["stride_x"], a["stride_y"]
        x["value"], y["value"] = y["value"], x["value"]

    def lost_offset(rec):
        rec["args"][0]["offset_elems"] = 0

    def reordered(rec):
        rec["args"][2], rec["args"][3] = rec["args"][3], rec["args"][2]

    for edit, want in ((short_grid, "elements off"), (swapped_strides, "outside buffer y"),
                       (lost_offset, "elements off"), (reordered, "the record passes")):
        with pytest.raises(replay.ReplayError, match=want):
            replay.replay(_mutated(record, tmp_path / edit.__name__, edit))


@pytest.mark.parametrize("record", DIRS or ["none"], ids=os.path.basename)
def test_gpu_replay_packs_every_record(record):
    """``replay_gpu.py --dry-run``: the cubin is found and the arguments pack, for every record
    of a committed kernel (the fixture's have no cubin and are skipped)."""
    if record == "none":
        pytest.skip("no record")
    out = replay_gpu.run(record, None, None)
    if isinstance(out, str):
        assert os.path.basename(record).startswith("fixture_"), out
        pytest.skip(out)
    stats, failures = out
    assert set(stats) == set(replay.load_record(record)["expected"]) and failures == []
