"""Helpers shared by conftest.py and the test modules (not a test module itself)."""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import itertools
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
_SESSION: dict = {"root": None, "owned": False}  # set by conftest.pytest_configure
_counter = itertools.count()


def counting():
    """An endless generator of 1.0, 2.0, ...: state that a call consumes (the never-stale
    tests' iterators)."""
    i = 0
    while True:
        i += 1
        yield float(i)


def run_python(env: dict, *argv: str) -> subprocess.CompletedProcess:
    """Run this interpreter with ``argv`` (``"-c", code`` or a script and its arguments) in
    ``env``; assert it exits 0 (its stderr's tail in the message) and return it."""
    out = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"child exited with {out.returncode}\n{out.stderr[-3000:]}"
    return out


@contextlib.contextmanager
def fresh_imports(folder: Path):
    """While active, importing a module of ``folder`` loads it afresh from its source, as a new
    process would: a new module object in ``sys.modules`` whose functions' code and globals are
    new, so ``@trident.jit`` finds its stored specializations by key (Note [Function key] in
    cache.py) and state digest only, as in another process. No bytecode is cached (a source
    edited within the same second keeps its size and mtime); the modules are taken off
    ``sys.modules`` when it ends."""
    names = [p.stem for p in folder.glob("*.py")]
    for name in names:
        sys.modules.pop(name, None)
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        sys.dont_write_bytecode = saved
        for name in names:
            sys.modules.pop(name, None)


def session_cache_root() -> Path:
    assert _SESSION["root"] is not None, "pytest_configure has not run"
    return _SESSION["root"]


def make_cache_dir(path: Path) -> Path:
    """A fresh Trident cache folder at ``path`` that shares the session's runtime build."""
    path.mkdir(parents=True, exist_ok=True)
    link = path / "runtime"
    if not link.exists():
        link.symlink_to(session_cache_root() / "runtime", target_is_directory=True)
    return path


def as_in_a_new_process() -> None:
    """Forget this process's compiles per function (Note [Specialization limit]: every
    ``trident.jit`` of a function shares its limit within a process) and which
    specializations it compiled, so that the next jit object stands for a new process's; its
    cache folder stays."""
    sys.modules["trident.frontend.limit"]._FUNCTION_COMPILES.clear()
    sys.modules["trident.frontend.cache"].COMPILED_HERE.clear()  # (another process compiled)


def unique_cache_dir() -> Path:
    """A brand-new cache folder (sharing the session runtime) beside the current one."""
    base = Path(os.environ["TRIDENT_CACHE_DIR"])
    return make_cache_dir(Path(tempfile.mkdtemp(prefix=f"sub{next(_counter)}-", dir=base.parent)))


@contextlib.contextmanager
def fresh_cache():
    """Point TRIDENT_CACHE_DIR at a brand-new folder for the duration (for hypothesis examples,
    where the per-test fixture runs only once per test, not per example)."""
    saved = os.environ.get("TRIDENT_CACHE_DIR")
    directory = unique_cache_dir()
    os.environ["TRIDENT_CACHE_DIR"] = str(directory)
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop("TRIDENT_CACHE_DIR", None)
        else:
            os.environ["TRIDENT_CACHE_DIR"] = saved


def clone_args(args):
    """Equal but separate inputs: tensors are copied with their sizes and strides (expanded
    tensors stay expanded), everything else is passed through."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(clone_strided(a))
        else:
            out.append(a)
    return out


def clone_strided(a: torch.Tensor) -> torch.Tensor:
    """A copy of ``a`` with the same sizes and strides (expanded dims stay stride 0)."""
    expanded = [st == 0 and s > 1 for s, st in zip(a.size(), a.stride())]
    if any(expanded):
        small = a[tuple(slice(0, 1) if e else slice(None) for e in expanded)]
        return clone_strided(small).expand(a.size())
    c = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
    c.copy_(a)
    return c


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def assert_same(got, want, *, strides: bool = True, path: str = "out"):
    """``got`` equals ``want`` bit for bit: same structure and Python types; tensors with the
    same dtype, shape, device, strides (if ``strides``) and identical bit patterns."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__} is not a tensor"
        assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{path}: shape {tuple(got.shape)} != {tuple(want.shape)}"
        assert got.device == want.device, f"{path}: device {got.device} != {want.device}"
        assert got.requires_grad == want.requires_grad, f"{path}: requires_grad differs"
        if strides and want.numel() > 1:
            assert got.stride() == want.stride(), \
                f"{path}: strides {got.stride()} != {want.stride()}"
        g, w = got.detach(), want.detach()
        if g.dtype in _BITS:
            g, w = g.contiguous().view(_BITS[g.dtype]), w.contiguous().view(_BITS[w.dtype])
        assert torch.equal(g, w), f"{path}: values differ:\n{got}\n!=\n{want}"
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, strides=strides, path=f"{path}[{i}]")
        return
    if isinstance(want, float) and want != want:
        assert got != got, f"{path}: {got!r} != nan"
        return
    assert got == want, f"{path}: {got!r} != {want!r}"


def python_calls(fn, args: tuple, n: int, **kwargs) -> list[str]:
    """The Python functions that ``n`` calls of ``fn(*args, **kwargs)`` run, as ``file:line name``: none
    on a native hit (``stats.hits`` also counts calls that Python's slow path served)."""
    events = []

    def profiler(frame, event, arg):
        if event == "call":
            events.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")

    # gc callbacks (hypothesis installs one) are Python that a collection can run at any time;
    # keep the collector out of the measured loop
    gc_was_enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(profiler)
    try:
        for _ in range(n):
            fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
        if gc_was_enabled:
            gc.enable()
    return events


# The start of a child script: a tiny random Llama (``model``), its config and a prompt (``ids``),
# with dataclasses, json, warnings, torch, transformers and trident imported.
TINY_LLAMA_SCRIPT = textwrap.dedent('''
    import dataclasses, json, warnings
    import torch, transformers, trident

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=96)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 96, (1, 6))
''')


def check_change_is_seen(fn, change) -> None:
    """Jit ``fn`` (of one tensor), hit it, make ``change()`` (which returns its undo) and hold
    the calls against eager's: the change is seen (one compile more, no fallback, no warning),
    and the state put back is served by the first specialization again without a compile."""
    import trident

    jf = trident.jit(fn)
    x = torch.randn(4, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no eager fallback
        before = jf(x)
        assert torch.equal(before, fn(x)) and torch.equal(jf(x), before)
        undo = change()
        try:
            after = fn(x)
            assert not torch.equal(after, before) or after.dtype != before.dtype, \
                "the change must change eager's result"
            for _ in range(2):
                got = jf(x)
                assert torch.equal(got, after) and got.dtype == after.dtype, (got, after)
            st = jf.stats
            assert (st.compiles, st.misses, st.fallbacks, st.hits) == (2, 2, 0, 2), st
        finally:
            undo()
        assert torch.equal(jf(x), before)
    st = jf.stats
    assert (st.compiles, st.fallbacks, st.hits) == (2, 0, 3), st


def count_traced_calls(monkeypatch) -> list:
    """Count the torch calls the trace's mode sees (True: the function's own)."""
    from trident.lower import source_lines

    traced = []
    torch_function = source_lines._SourceLines.__torch_function__
    # compiled as Trident's code: its frames are not the function's (Note [Writes at entry])
    space = {"torch_function": torch_function, "traced": traced}
    exec(compile("def counted(mode, func, types, args=(), kwargs=None):\n"
                 "    traced.append(mode.in_user_code)\n"
                 "    return torch_function(mode, func, types, args, kwargs)\n",
                 source_lines.__file__, "exec"), space)
    monkeypatch.setattr(source_lines._SourceLines, "__torch_function__", space["counted"])
    return traced


def passes_through(fn):
    """A ``functools.wraps`` decorator whose ``wrapper(*args, **kwargs)`` calls ``fn``, as
    transformers' decorators (``@can_return_tuple``) wrap a model's forward."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def generate_as_eager(model, reference, served, ids, kw: dict, i: int, restore=None):
    """``model.generate(ids, **kw)`` with ``model.forward`` set to ``reference`` (eager's
    forward), then to ``served`` (a ``trident.jit`` of it), the forward put back after; asserts
    that every token and every step's logits are equal (``torch.equal``) and that each made
    ``kw["max_new_tokens"]`` steps (``i``: the request's number, in the messages). ``restore``,
    called between the two, puts back what the reference's ``generate`` changed on the model
    (a static cache's ``_previous_max_cache_length``). Returns the served output."""
    forward = model.forward
    try:
        model.forward = reference
        ref = model.generate(ids, **kw)
        if restore is not None:
            restore()
        model.forward = served
        out = model.generate(ids, **kw)
    finally:
        model.forward = forward
    assert torch.equal(out.sequences, ref.sequences), (i, served.stats.miss_reasons)
    assert len(out.logits) == len(ref.logits) == kw["max_new_tokens"], i
    assert all(torch.equal(a, b) for a, b in zip(out.logits, ref.logits)), i
    return out


@contextlib.contextmanager
def installed_package(root: Path, name: str, files: dict[str, str]):
    """A package ``name`` made of ``files`` (module name -> source) under ``root``, with a
    ``dist-info`` as pip leaves one, imported from ``sys.path``: Trident takes its code for an
    installed library's (``frames.library_module``); yields the package, removed after."""
    (root / name).mkdir()
    for module, source in files.items():
        (root / name / f"{module}.py").write_text(source)
    (root / f"{name}-1.0.dist-info").mkdir()
    (root / f"{name}-1.0.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: 1.0\n")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        package = importlib.import_module(name)
        from trident import frames
        assert all(frames.library_module(importlib.import_module(
            name if m == "__init__" else f"{name}.{m}")) for m in files)
        yield package
    finally:
        sys.path.remove(str(root))
        for m in files:
            sys.modules.pop(name if m == "__init__" else f"{name}.{m}", None)


def c_module(tmpdir, name: str, cdef: str, source: str, cuda: bool = False):
    """A cffi module ``name`` of C ``source`` (declared by ``cdef``) that includes Trident's
    runtime headers (``cuda``: CUDA's too, which trident_cuda.h needs), compiled in ``tmpdir``
    and imported: ``(ffi, lib)``."""
    import cffi
    import importlib.util

    import trident
    from trident import build

    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, source, include_dirs=[str(Path(trident.__file__).parent / "runtime")]
                   + ([build._cuda_include()] if cuda else []))
    built = ffi.compile(tmpdir=str(tmpdir))
    spec = importlib.util.spec_from_file_location(name, built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ffi, module.lib


def counts(jf) -> tuple[int, int, int]:
    """``jf``'s (compiles, hits, fallbacks)."""
    s = jf.stats
    return s.compiles, s.hits, s.fallbacks


def said(caught, words: str) -> list[str]:
    """The messages of the ``caught`` warnings that hold ``words``."""
    return [str(w.message) for w in caught if words in str(w.message)]


def cache_kw(model) -> str:
    """The keyword under which ``model``'s forward takes its cache in the installed transformers:
    ``cache`` where it has one (5.25 here deprecates ``past_key_values``, whose FutureWarning at
    every call makes a jitted call eager: Note [Warnings a trace gives] in
    trident/lower/state/warned.py), else ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else \
        "past_key_values"


def tiny_causal_lm(kind: str, **config):
    """transformers' ``{kind}ForCausalLM`` (``kind``: ``"Llama"``, ``"Qwen2"``, ...) of a tiny
    config, in eval mode: vocabulary 96, hidden 64, MLP 128, 2 layers, 4 heads, 2 KV heads, but
    where ``config`` says otherwise; its random weights drawn after ``torch.manual_seed(0)``
    (transformers is imported here: a test module that calls this skips without it first)."""
    import transformers

    sizes = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
    made = getattr(transformers, f"{kind}Config")(**{**sizes, **config})
    torch.manual_seed(0)
    return getattr(transformers, f"{kind}ForCausalLM")(made).eval()


# An installed package's source whose functions write state of their own (a global counter, a
# memo dict, a class attribute, ...): tests/test_never_stale43.py, tests/test_writes_probe50.py.
WRITING_LIBRARY = '''
import sys

CALLS = 0
MEMO = {}
LOG = []
SEEN = set()


class Stats:
    calls = 0


STATS = Stats()


def count(x):
    global CALLS
    CALLS += 1
    return x * CALLS


def memo(x):
    MEMO["n"] = MEMO.get("n", 0) + 1
    return x * MEMO["n"]


def attribute(x):
    STATS.calls += 1
    return x * STATS.calls


def append(x):
    LOG.append(1)
    return x * len(LOG)


def through_sys_modules(x):
    sys.modules[__name__].CALLS += 1
    return x * CALLS


def through_globals(x):
    globals()["CALLS"] += 1
    return x * CALLS


def through_an_alias(x):
    d = MEMO
    d["n"] = d.get("n", 0) + 1
    return x * d["n"]


def _bump(d):
    d["n"] = d.get("n", 0) + 1
    return d["n"]


def through_a_helper(x):
    return x * _bump(MEMO)


def _counter():
    n = [0]

    def bump(x):
        n[0] += 1
        return x * n[0]
    return bump


closure = _counter()


def once(x):
    if "x" not in SEEN:
        SEEN.add("x")
    return x * 2
'''
