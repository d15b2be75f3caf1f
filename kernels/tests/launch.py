"""Runs a compiled form (a ``Variant`` of ``kernels/src``) under the interpreter, with the very
constexprs the generator compiles it with: the tests exercise what ships."""

import importlib
import os

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def variant(name):
    """The variant called ``name``, from whichever kernels/src module lists it."""
    for f in sorted(os.listdir(SRC)):
        if f.endswith(".py") and not f.startswith("_"):
            for v in importlib.import_module(f"kernels.src.{f[:-3]}").VARIANTS:
                if v.name == name:
                    return v
    raise KeyError(name)


def run(name, grid, **args):
    """Launches variant ``name`` on ``grid`` with its non-constexpr parameters given by name."""
    v = variant(name)
    want = [k for k, t in v.signature.items() if t != "constexpr"]
    assert sorted(args) == sorted(want), f"{name}: arguments {sorted(args)}, parameters {sorted(want)}"
    v.fn[grid](**args, **v.constexprs)
