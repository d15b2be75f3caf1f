#!/usr/bin/env python3
"""Builds data/math_verify/cases.jsonl: the (gold, prediction, expected) cases of Math-Verify's
public test suite that its LaTeX extraction judges, as an evaluation set for rlvr's MATH verifier.

Source: GitHub huggingface/Math-Verify (Apache-2.0; the test files carry an MIT header), the test
files under tests/ at the commit given below. The script reads them with Python's `ast` (nothing
of Math-Verify is imported or run) and keeps every `pytest.mark.parametrize` case of a test that
calls `compare_strings(gold, pred, match_types=[..."latex"...])` with Math-Verify's default
comparison (strict, float rounding 6 unless the case gives its own, no set/relation cross
comparison). Left out, with the reason: the extraction cases (`extraction_case`: a worked
solution as the prediction, where Math-Verify's verdict is about finding the answer in running text,
which rlvr does not do: it reads the last box); `test_number_extraction` (match_types ["expr"] only:
numbers in running text, which a MATH grader does not read), the `strict=False` and
`allow_set_relation_comp=True` variants and `test_set_rel_assymetry` (it tests that option, whose
default rlvr does not follow: rlvr always compares a relation in one variable with an interval,
both ways, as crates/rlvr-reward/src/math.rs documents), `test_string_extraction` (multiple-choice letters), the
timeout and error tests (no cases).

Each line: `source` (file::test#index), `gold` and `pred` as Math-Verify's test wrote them,
`expected` (Math-Verify's verdict, 0/1), `form` (the gold's answer form, below), and the inputs rlvr
judges: `reference` and `completion`. rlvr's MATH verifier reads the last `\\boxed{}` of a
completion (MATH's convention) and the last box of a reference, else the whole reference; so a
side without a box is given one around the content of its last math environment (`$..$`, `$$..$$`,
`\\(..\\)`, `\\[..\\]`; of a gold, each one: `$1$ and $2$` is two answers), or around the
whole text when it has none.

Forms (from the gold, first match wins): matrix, multi (several answers: a set, a list, several
boxes, `\\pm`), interval (brackets with a comma, `\\cup`, `\\infty`), relation (`=`, `<`, `\\le`,
...), text (`\\text`, words), number, fraction, expression. The plain forms are number, fraction,
expression (at most 40 characters) and interval.

Run: python3 scripts/make_math_verify_set.py /path/to/Math-Verify [COMMIT]
"""

import ast
import json
import os
import re
import subprocess
import sys

COMMIT = "5d148cfaaf99214c2e4ffb4bc497ab042c592a7a"
FILES = [
    "tests/test_all.py",
    "tests/test_boxed.py",
    "tests/test_numina_cases.py",
    "tests/test_open_thoughts.py",
    "tests/test_strict.py",
]
SKIP_TESTS = {"test_number_extraction", "test_set_rel_assymetry"}
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "math_verify", "cases.jsonl")


def show(repo, commit, path):
    return subprocess.run(
        ["git", "--git-dir", repo, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def literal(node):
    try:
        return ast.literal_eval(node)
    except Exception:
        return None


def cases_of(src, path):
    tree = ast.parse(src)
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        if fn.name in SKIP_TESTS:
            continue
        calls = [
            c for c in ast.walk(fn) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "compare_strings"
        ]
        if not calls:
            continue
        kw = {k.arg: k.value for k in calls[0].keywords}
        mt = literal(kw["match_types"]) if "match_types" in kw else ["latex", "expr"]
        if not mt or "latex" not in mt:
            continue
        for d in fn.decorator_list:
            if not (isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "parametrize"):
                continue
            names = [s.strip() for s in literal(d.args[0]).split(",")]
            rows = literal(d.args[1])
            if rows is None:
                continue
            for i, row in enumerate(rows):
                r = dict(zip(names, row))
                if not {"gold", "pred", "expected"} <= set(r):
                    continue
                if r.get("strict", True) is False or r.get("allow_set_relation_comp", False):
                    continue
                yield {
                    "source": f"{path}::{fn.name}#{i}",
                    "gold": r["gold"],
                    "pred": r["pred"],
                    "expected": int(bool(r["expected"])),
                    "precision": r.get("precision", 6),
                }


MATH_ENV = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)


def boxed(text, each=False):
    """The text with a box rlvr reads: as it is when it has `\\boxed`/`\\fbox`, else its last math
    environment's content boxed (each environment's, with `each`: a gold `$1$ and $2$`), else the
    whole text boxed."""
    if "\\boxed" in text or "\\fbox" in text:
        return text
    envs = list(MATH_ENV.finditer(text))
    if envs and each:
        out, last = "", 0
        for m in envs:
            inner = next(g for g in m.groups() if g is not None)
            out += text[last : m.start()] + "$\\boxed{" + inner.strip() + "}$"
            last = m.end()
        return out + text[last:]
    if envs:
        m = envs[-1]
        inner = next(g for g in m.groups() if g is not None)
        return text[: m.start()] + "$\\boxed{" + inner.strip() + "}$" + text[m.end() :]
    return "\\boxed{" + text.strip() + "}"


def answer_of(text):
    """The part a form is read from: the last box's content, else the last math environment's."""
    i = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if i >= 0:
        j = text.index("{", i) + 1
        depth, k = 1, j
        while k < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
        return text[j : k - 1]
    envs = list(MATH_ENV.finditer(text))
    if envs:
        return next(g for g in envs[-1].groups() if g is not None)
    return text


NUM = re.compile(r"^-?\s*\d[\d,]*(\.\d+)?$|^-?\.\d+$")
FRAC = re.compile(r"^-?\s*(\\[dt]?frac\{-?\d+\}\{\d+\}|\\[dt]?frac\d\d|\d+\s*/\s*\d+)$")


def form(gold):
    a = answer_of(gold).strip()
    a = re.sub(r"\\[,!;: ]|\\quad|\\left|\\right|\s+", "", a)
    a = a.replace("^\\circ", "").replace("\\%", "").replace("\\$", "")
    if "matrix" in a or "\\begin{array}" in a:
        return "matrix"
    if gold.count("\\boxed") > 1 or len(gold) < 60 and len(MATH_ENV.findall(gold)) > 1:
        return "multi"
    if "\\pm" in a or ";" in a or re.match(r"^\{.*,.*\}$", a) or "or" in a or a.startswith("\\{") or re.search(r"(?<![\(\[\{]),(?![^\(\[\{]*[\)\]\}])", a):
        if not NUM.match(a):
            return "multi"
    if re.match(r"^[\(\[].*,.*[\)\]]$", a) or "\\cup" in a or "\\infty" in a:
        return "interval"
    if re.search(r"=|<|>|\\le|\\ge|\\ne|\\neq|\\lt|\\gt|\\in\b", a):
        return "relation"
    if "\\text" in a or "\\mathrm" in a or re.fullmatch(r"[A-Za-z ]{3,}", a):
        return "text"
    if NUM.match(a):
        return "number"
    if FRAC.match(a):
        return "fraction"
    return "expression"


PLAIN = {"number", "fraction", "interval"}


def prose_words(text):
    """Words of two or more letters outside math environments and boxes."""
    s = MATH_ENV.sub(" ", text)
    s = re.sub(r"\\boxed\{.*\}", " ", s, flags=re.S)
    return len(re.findall(r"[A-Za-z]{2,}", s))


def extraction_case(c):
    """Whether Math-Verify's verdict is about finding the answer in running text rather than about
    the answer: a prediction with more than 5 words of prose outside math (a worked solution, where
    its "final answer is" text and last-environment heuristics decide), or inline math spanning a
    line break (Math-Verify refuses `$ \n 9 \n $`; a box has no such rule)."""
    if prose_words(c["pred"]) > 5:
        return True
    # The answer written in prose after the last math (`the largest $\\boxed{n}$ is 34.`).
    envs = list(MATH_ENV.finditer(c["pred"]))
    if envs and re.search(r"\d", c["pred"][envs[-1].end():]):
        return True
    for side in (c["gold"], c["pred"]):
        for m in MATH_ENV.finditer(side):
            if any(g is not None and "\n" in g for g in (m.group(2), m.group(3))):
                return True
    return False


def main():
    root = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else COMMIT
    git_dir = root if os.path.basename(root.rstrip("/")) == "repo" or root.endswith(".git") else os.path.join(root, ".git")
    rows = []
    left_out = 0
    for path in FILES:
        for c in cases_of(show(git_dir, commit, path), path):
            if extraction_case(c):
                left_out += 1
                continue
            c["form"] = form(c["gold"])
            c["plain"] = c["form"] in PLAIN or (c["form"] == "expression" and len(answer_of(c["gold"])) <= 40)
            c["reference"] = boxed(c["gold"], each=True)
            c["completion"] = boxed(c["pred"])
            rows.append(c)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    counts = {}
    for r in rows:
        counts.setdefault(r["form"], [0, 0])
        counts[r["form"]][r["expected"]] += 1
    print(f"{len(rows)} cases from {commit} ({left_out} extraction cases left out); per form (expected 0 / 1):", file=sys.stderr)
    for k, (n0, n1) in sorted(counts.items()):
        print(f"  {k}: {n0 + n1} ({n0} / {n1})", file=sys.stderr)
    print(f"  plain: {sum(r['plain'] for r in rows)}", file=sys.stderr)


if __name__ == "__main__":
    main()
