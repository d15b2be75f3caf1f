"""A family's ``VARIANTS`` against its kernels' parameter lists (no compiling: the generator does)."""

import inspect

import triton.language as tl

TYPES = {"*fp32", "*bf16", "*i32", "i32", "i64", "fp32"}


def check(module, prefix):
    """Each variant's signature names every non-constexpr parameter in order with a Triton type,
    its constexprs every constexpr parameter; names are unique and start with the family's name."""
    names = [v.name for v in module.VARIANTS]
    assert len(names) == len(set(names))
    for v in module.VARIANTS:
        assert v.name.startswith(prefix), v.name
        params = list(inspect.signature(v.fn.fn).parameters.values())
        const = [p.name for p in params if p.annotation is tl.constexpr]
        plain = [p.name for p in params if p.annotation is not tl.constexpr]
        typed = {k: t for k, t in v.signature.items() if t != "constexpr"}
        assert list(typed) == plain, v.name
        assert set(typed.values()) <= TYPES, v.name
        assert sorted(v.constexprs) == sorted(const), v.name
        assert v.targets == ("sm90a", "sm80") and not v.fp_fusion, v.name
