"""Every kernel test runs under Triton's CPU interpreter; set before triton is imported."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "0")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from kernels.np_tensor import interpreter_bf16_dot_as_f32  # noqa: E402

interpreter_bf16_dot_as_f32()  # every test module, and kernels/replay.py's records, see the fix
