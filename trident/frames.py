"""Whose code a frame runs: Trident's, torch's, a library's, or the user's (Note [User code]).

Note [User code]: two questions, each answered here and nowhere else.

* Which line is the user's? A node's source line and the ``try`` around a torch call
  (capture.py, source_lines.py) and a warning's ``stacklevel`` (install.py) take the
  innermost frame that :func:`user_line_file` accepts: neither Trident's
  (:func:`trident_file`), torch's (:func:`torch_file`) nor a frozen module's; an installed
  library's frame counts as the user's there (the line in the library that called torch is
  where the op came from). Both are prefix tests of the name a code object was compiled under
  (``co_filename``) against the package's folder with no separator after it: a sibling whose
  name extends the folder's counts as that package's (``torchgen`` and ``torch_mlir`` beside
  ``torch``). capture.py takes torch's folder as imported, install.py as it resolves.
* Whose reads are state (Note [State guards] in lower/state/__init__.py)? :func:`user_file`
  and :func:`user_frame`: code that is not Trident's (a file inside its folder,
  :func:`inside_trident`), the standard library's or an installed package's; exec'd code
  (``<string>``, a dataclass's ``__init__``) is the user's, and belongs to the module whose
  globals it runs in. A library's code and module state are taken as fixed
  (:func:`library_module`; Note [Library state] in lower/state/library_steps.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import types
from pathlib import Path

import torch

from trident import config

_TRIDENT = str(config.PACKAGE_DIR)
_INSIDE_TRIDENT = _TRIDENT + os.sep
# torch's folder as imported (the start of its code objects' file names), and resolved
# (symlinks followed).
_TORCH = str(Path(torch.__file__).parent)
_TORCH_RESOLVED = str(Path(torch.__file__).resolve().parent)
_INSTALL_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")


def trident_file(filename: str) -> bool:
    """A frame of Trident, for the user's line: ``filename`` starts with Trident's folder."""
    return filename.startswith(_TRIDENT)


def inside_trident(filename: str) -> bool:
    """Trident's code, for state: ``filename`` is a path inside Trident's folder."""
    return filename.startswith(_INSIDE_TRIDENT)


# Note [Launch frames]: Trident's frames between the function's ``kernel[grid](...)`` and the
# user code that Triton runs for that launch (a ``@triton.heuristics`` function, a grid
# callable, an autotuner's ``early_config_prune`` or ``perf_model``): capture.py's
# ``_TritonLaunches`` routes the launch to kernels.py, whose ``resolve_launch`` calls them at
# capture time. What they read decides the constexprs, config and grid the specialization
# bakes (a global ``NUM_SMS`` a grid callable reads), so it is the function's read: the
# recording walks through these frames as through the function's own (``under_fn`` in
# lower/state/recording.py). Every other Trident frame ends the walk (Trident's bookkeeping).
_KERNELS_FILE = os.path.join(_TRIDENT, "lower", "kernels.py")
_CAPTURE_FILE = os.path.join(_TRIDENT, "lower", "capture.py")


def launch_frame(code: types.CodeType) -> bool:
    """A Trident frame that runs a Triton launch for the function (Note [Launch frames])."""
    return code.co_filename == _KERNELS_FILE or code.co_filename == _CAPTURE_FILE and \
        code.co_qualname.startswith("_TritonLaunches.")


# Note [Nested jitted calls]: a jitted function that the traced function calls runs eagerly in
# the trace (the trace's TorchFunctionMode fails its guards): its ops are the trace's, and so
# are its reads. Its wrapped function runs from policy.py's ``MissPolicy._eager``, below the
# jitted call's own Trident frames (``_slow_path``, ``_on_miss``), so the recording walks
# from ``_eager`` through those frames to the call's caller, and on from there (``under_fn``
# in lower/state/recording.py). Without it, the global a nested jitted function read was no
# guard of the outer one: a hit after it changed returned the old value. Its Triton launches
# are the trace's too: ``_eager``'s own launch hook (``cpu_launches_interpreted`` in
# lower/kernels.py) hands them to the trace's hook, which records them as the outer
# function's (it sent them to Triton's launcher with fake tensors: the outer function could
# not be traced). The nested function's warning says that its code runs in the trace.
_POLICY_FILE = os.path.join(_TRIDENT, "frontend", "policy.py")


def eager_call_frame(code: types.CodeType) -> bool:
    """The frame that runs a jitted function's code eagerly (Note [Nested jitted calls])."""
    return code.co_filename == _POLICY_FILE and code.co_qualname == "MissPolicy._eager"


def torch_file(filename: str, resolved: bool = False) -> bool:
    """A frame of torch, for the user's line: ``filename`` starts with torch's folder as
    imported, or with ``resolved`` as the folder resolves (symlinks followed: jit.py's
    warnings)."""
    return filename.startswith(_TORCH_RESOLVED if resolved else _TORCH)


def frozen_file(filename: str) -> bool:
    """The interpreter's frozen modules (``<frozen importlib._bootstrap>``)."""
    return filename.startswith("<frozen")


def user_line_file(filename: str, resolved: bool = False) -> bool:
    """A frame whose line is the user's: neither Trident's, torch's (``torch_file``, its folder
    as imported or, ``resolved``, as it resolves) nor a frozen module's."""
    return not (trident_file(filename) or torch_file(filename, resolved) or
                frozen_file(filename))


@functools.lru_cache(maxsize=8)
def _library_dirs(search_path: tuple[str, ...]) -> tuple[str, ...]:
    """Where installed packages live: the interpreter's install paths, and every ``sys.path``
    entry that holds a ``*.dist-info`` directory (a ``pip install --target`` folder put on
    ``PYTHONPATH``, a second site directory): a package there is a library, not user code."""
    dirs = {sysconfig.get_paths()[k] for k in _INSTALL_PATHS}
    for entry in search_path:
        try:
            if entry and os.path.isdir(entry) and any(
                    name.endswith(".dist-info") for name in os.listdir(entry)):
                dirs.add(entry)
        except OSError:
            continue
    return tuple(sorted(str(Path(d).resolve()) + os.sep for d in dirs))


@functools.lru_cache(maxsize=4096)
def user_file(filename: str) -> bool:
    """Code whose reads are chains: not Trident, the standard library or an installed package."""
    if frozen_file(filename) or not filename:
        return False
    if filename.startswith("<"):  # exec'd code
        return True
    path = str(Path(filename).resolve())
    return not inside_trident(path) and not path.startswith(_library_dirs(tuple(sys.path)))


def user_frame(frame) -> bool:
    """A frame of user code; exec'd code (a dataclass's ``__init__``) belongs to the module
    whose globals it runs in, and is the user's where no module holds them (``exec`` into a
    dict of its own): its reads are guarded."""
    filename = frame.f_code.co_filename
    if not filename.startswith("<") or frozen_file(filename):
        return user_file(filename)
    module = sys.modules.get(frame.f_globals.get("__name__"))
    return module is None or vars(module) is not frame.f_globals or not library_module(module)


def library_module(m: types.ModuleType) -> bool:
    """A module whose state is taken as fixed: one from a library's file, or built into the
    interpreter (``sys``, ``math``). A module without a file that is neither (one made at run
    time with ``types.ModuleType``, a config namespace) is user state."""
    f = vars(m).get("__file__")  # (not getattr: a module __getattr__ may raise anything)
    if f is None:
        spec = vars(m).get("__spec__")
        return m.__name__ in sys.builtin_module_names or \
            getattr(spec, "origin", None) in ("built-in", "frozen")
    return not user_file(f)


def user_class(c: type) -> bool:
    """A class of user code: its module's file is :func:`user_file`'s, or its module is user
    state without a file (:func:`library_module`: one made with ``types.ModuleType``; a
    class of it was taken for a library's, its attributes fixed: Note [Modules used whole] in
    lower/state/wholes.py)."""
    module = sys.modules.get(c.__module__) if isinstance(c.__module__, str) else None
    if c.__module__ == "builtins" or module is None:
        return False
    if vars(module).get("__file__") is None and isinstance(module, types.ModuleType):
        return not library_module(module)
    return user_file(getattr(module, "__file__", "") or "")


def parameter_names(code: types.CodeType) -> tuple[str, ...]:
    """The names of ``code``'s parameters, ``*args`` and ``**kwargs`` included (the first of
    ``co_varnames``, CPython 3.11-3.13)."""
    return code.co_varnames[:code.co_argcount + code.co_kwonlyargcount + bool(
        code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)]
