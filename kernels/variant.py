"""One compiled form of a kernel: what the generator (``generate.py``) compiles and the manifest lists.

Each kernel module in ``kernels/src/`` exposes ``VARIANTS: list[Variant]``. A variant fixes
everything that changes the machine code: the Triton signature (pointer element types and scalar
widths, in the kernel's parameter order), the constexpr values (block sizes, head dim, dtype flags,
``input_precision`` choice), warps, pipeline stages, fp fusion, and the targets it is built for.
The name is the entry point the Rust launcher asks for: ``<kernel>_<what varies>``, unique across
all modules.
"""

import dataclasses
import inspect
from dataclasses import dataclass, field

# Targets: "sm90a" is Hopper (H100/H200, the lent machines), with its tensor-core instructions;
# "sm80" is the portable build that also runs on sm_86/sm_89 (A100, RTX 30xx/40xx, L40S).
TARGETS = ("sm90a", "sm80")


@dataclass(frozen=True)
class Variant:
    name: str
    fn: object  # the @triton.jit function
    signature: dict  # parameter -> "*fp32" | "*bf16" | "*i32" | "i32" | "i64" | "fp32" | "constexpr"
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    fp_fusion: bool = False  # no fused multiply-add contraction unless a variant says so
    targets: tuple = TARGETS
    # ``generate.py`` refuses a compiled form whose ptxas reports spill stores or loads unless its
    # variant sets this (a spill is a performance regression the launcher cannot see).
    allow_spills: bool = False
    # Parameters the compiled code assumes divisible by 16 (Triton's ``tt.divisibility = 16``,
    # passed as ``ASTSource(attrs=...)``): a pointer's address is a multiple of 16 bytes, an
    # integer's value a multiple of 16. What lets Triton emit 128-bit loads and stores; the
    # manifest lists it per parameter (``"divisibility": 16``) and the launcher refuses arguments
    # that break it. Empty: nothing assumed (any element offset, any length).
    divisible: tuple = ()

    def __post_init__(self):
        # A module may list only the non-constexpr parameters in ``signature``: the full signature,
        # in the kernel's parameter order with every constexpr marked "constexpr", is what Triton's
        # ASTSource and the generator take, so it is completed here, once, for every module.
        params = list(inspect.signature(getattr(self.fn, "fn", self.fn)).parameters)
        if any(t == "constexpr" for t in self.signature.values()) or not self.constexprs:
            return
        missing = [p for p in params if p not in self.signature and p not in self.constexprs]
        if missing:
            return  # the generator names the mismatch
        full = {p: (self.signature[p] if p in self.signature else "constexpr") for p in params}
        object.__setattr__(self, "signature", full)


# The name suffix of the aligned twin of a variant (``aligned``): the launcher takes it when every
# pointer and listed integer qualifies, else the variant without the suffix (the fallback).
ALIGNED_SUFFIX = "_a16"


def aligned(v, ints=(), ptrs=None):
    """``v``'s aligned twin: the pointer parameters ``ptrs`` (default: every pointer not compiled
    out) and the integer parameters ``ints`` assumed divisible by 16, named
    ``v.name + ALIGNED_SUFFIX``."""
    if ptrs is None:
        ptrs = tuple(p for p, t in v.signature.items() if t.startswith("*"))
    for p in ptrs:
        if not v.signature.get(p, "").startswith("*"):
            raise ValueError(f"{v.name}: {p} is not a pointer parameter")
    for i in ints:
        if v.signature.get(i) not in ("i32", "i64"):
            raise ValueError(f"{v.name}: {i} is not an integer parameter")
    return dataclasses.replace(v, name=v.name + ALIGNED_SUFFIX, divisible=tuple(ptrs) + tuple(ints))


def with_aligned(variants, ints):
    """Each variant followed by its aligned twin; ``ints(v)`` gives the twin's integer parameters."""
    out = []
    for v in variants:
        out += [v, aligned(v, ints(v))]
    return out
