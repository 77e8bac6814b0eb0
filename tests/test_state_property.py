"""Never stale, as a property (issue 28): small generated programs read state outside their
arguments (globals, class hierarchies, imports inside the function, closures, patched
callables and builtins, the environment, defaults, partials, descriptors, metaclasses,
dataclasses, a function's code, a module replaced in ``sys.modules``), a change is made to
that state, and every call of the jitted function equals eager's. Each program is a module of
its own, written to a folder on ``sys.path`` (user code, as the user's own modules are).
``TRIDENT_STATE_EXAMPLES`` sets how many programs run (8 in CI)."""

from __future__ import annotations

import builtins
import importlib
import itertools
import os
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trident

_IDS = itertools.count()
EXAMPLES = int(os.environ.get("TRIDENT_STATE_EXAMPLES", "8"))

# kind -> (module set-up, the read (an expression of the function), changes: statements run
# in the module after the first calls; {v} is a new value, {env} the example's variable)
KINDS = {
    "global": ("G = 2.0", "G", ["G = {v}"]),
    "list item": ("L = [2.0]", "L[0]", ["L[0] = {v}"]),
    "dict.get": ('D = {{"k": 2.0}}', 'D.get("k", 1.5)', ['D["k"] = {v}', 'D.pop("k", None)']),
    "class attribute": ("class C:\n    k = 2.0", "C.k", ["C.k = {v}"]),
    "subclass shadows its base": (
        "class B:\n    k = 2.0\n    def get(self):\n        return self.k\n"
        "class S(B):\n    pass\nOBJ = S()",
        "OBJ.get()", ["S.k = {v}", "B.k = {v}", "B.get = lambda self: {v}"]),
    "type(self)": ("class T:\n    k = 2.0\n    def get(self):\n        return type(self).k\n"
                   "TOBJ = T()", "TOBJ.get()", ["T.k = {v}"]),
    "classmethod": ("class M:\n    k = 2.0\n    @classmethod\n    def get(cls):\n"
                    "        return cls.k", "M.get()", ["M.k = {v}"]),
    "import inside": ("", "__IMPORT__.K", ["__IMPORT__.K = {v}"]),
    "closure": ("def _make():\n    box = [2.0]\n    def read():\n        return box[0]\n"
                "    return read, box\nREAD, BOX = _make()", "READ()", ["BOX[0] = {v}"]),
    "patched helper": ("def helper():\n    return 2.0", "helper()",
                       ["helper = lambda: {v}"]),
    "patched torch function": ("", "float(torch.sigmoid(torch.tensor(0.0)))",
                               ["torch.sigmoid = lambda t: t + {v}"]),
    "environment": ("", 'float(os.environ.get("{env}", "2"))',
                    ['os.environ["{env}"] = "{v}"', 'os.environ.pop("{env}", None)']),
    "getattr with a global name": ('class N:\n    a = 2.0\n    b = 3.0\nNAME = "a"',
                                   "getattr(N, NAME)", ['NAME = "b"', "N.a = {v}"]),
    "a local alias": ("class A:\n    k = 2.0", "__ALIAS__.k", ["A.k = {v}"]),
    "a helper's default": ("def helper_d(k=2.0):\n    return k", "helper_d()",
                           ["helper_d.__defaults__ = ({v},)"]),
    "a partial's keyword": ("import functools\ndef _p(k):\n    return k\n"
                            "P = functools.partial(_p, k=2.0)", "P()",
                            ['P.keywords["k"] = {v}', "P = functools.partial(_p, k={v})"]),
    "a descriptor's state": ("class Dsc:\n    def __init__(self):\n        self.v = 2.0\n"
                             "    def __get__(self, obj, owner):\n        return self.v\n"
                             "class HD:\n    k = Dsc()", "HD.k", ['HD.__dict__["k"].v = {v}']),
    "a metaclass attribute": ("class MM(type):\n    k = 2.0\nclass MC(metaclass=MM):\n"
                              "    pass", "MC.k", ["MM.k = {v}"]),
    "a dataclass field": ("import dataclasses\n@dataclasses.dataclass\nclass DC:\n"
                          "    k: float = 2.0\nDCO = DC()", "DCO.k",
                          ["DCO.k = {v}", "DCO = DC({v})"]),
    "a helper's code": ("def code_h():\n    return 2.0", "code_h()",
                        ["code_h.__code__ = (lambda: {v}).__code__"]),
    "a module replaced in sys.modules": (
        "", "__IMPORT__.K", ['import sys, types\n_m = types.ModuleType("{mod}")\n_m.K = {v}\n'
                             'sys.modules["{mod}"] = _m']),
    "a builtin patched": ("", "float(divmod(5, 3)[0])",
                          ["import builtins\nbuiltins.divmod = lambda a, b: ({v}, 0)"]),
}


@st.composite
def programs(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3, unique=True))
    changes = draw(st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 2),
                                      st.sampled_from([3.0, 5.0, 7.0, 0.5])),
                            min_size=1, max_size=4))
    return kinds, changes


def _source(n: int, kinds: list[str], env: str) -> tuple[str, str]:
    """(the program's module, its imported helper module)."""
    setup, body, reads = [], [], []
    for kind in kinds:
        pre, read, _ = KINDS[kind]
        setup.append(pre.format(env=env))
        if kind in ("import inside", "a module replaced in sys.modules"):
            if f"import state_prop_helper_{n} as imported" not in body:
                body.append(f"import state_prop_helper_{n} as imported")
            read = "imported.K"
        if kind == "a local alias":
            body.append("alias = A")
            read = "alias.k"
        reads.append(read.format(env=env))
    expr = " + ".join(f"x * ({r})" for r in reads)
    lines = ["import os", "import torch", *setup, "", "def f(x):",
             *(f"    {b}" for b in body), f"    return {expr}"]
    return "\n".join(lines) + "\n", "K = 2.0\n"


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(programs())
def test_generated_programs_never_return_stale_results(trident_cache, program):
    kinds, changes = program
    n = next(_IDS)
    env = f"TRIDENT_STATE_PROP_{os.getpid()}_{n}"
    folder = Path(tempfile.mkdtemp(prefix="state-prop-", dir=trident_cache))
    source, helper = _source(n, kinds, env)
    (folder / f"state_prop_{n}.py").write_text(source)
    (folder / f"state_prop_helper_{n}.py").write_text(helper)
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    sigmoid, divmod_ = torch.sigmoid, builtins.divmod
    try:
        module = importlib.import_module(f"state_prop_{n}")
        helper_module = importlib.import_module(f"state_prop_helper_{n}")
        jf = trident.jit(module.f)
        x = torch.tensor([1.0, -2.0, 0.25])
        calls = 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no eager fallback: every kind here is guarded
            for _ in range(2):
                assert torch.equal(jf(x), module.f(x)), source
                calls += 1
            for kind, which, value in changes:
                options = KINDS[kind][2]
                statement = options[which % len(options)].format(
                    v=value, env=env, mod=f"state_prop_helper_{n}")
                if "__IMPORT__" in statement:  # the imported module's attribute
                    exec(statement.replace("__IMPORT__", "helper"), {"helper": helper_module})
                else:
                    exec(statement, vars(module))
                want = module.f(x)
                for _ in range(2):
                    got = jf(x)
                    calls += 1
                    assert torch.equal(got, want), (source, statement, got, want)
        st_ = jf.stats
        assert st_.fallbacks == 0 and st_.hits + st_.misses == calls, st_
        assert st_.compiles <= st_.misses and st_.hits >= calls // 2, st_
    finally:
        torch.sigmoid, builtins.divmod = sigmoid, divmod_
        os.environ.pop(env, None)
        sys.path.remove(str(folder))
        for name in (f"state_prop_{n}", f"state_prop_helper_{n}"):
            sys.modules.pop(name, None)


def test_the_generator_covers_every_kind():
    """Each kind's program compiles to valid Python (the property's own check)."""
    for kind in KINDS:
        source, _ = _source(0, [kind], "X")
        compile(source, kind, "exec")
    assert textwrap.dedent(_source(0, ["global", "closure"], "X")[0]).count("def f(x):") == 1
