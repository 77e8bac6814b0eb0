"""Calls whose results no guard keeps (Note [State guards]): what the recording (recording.py)
names when the function's code, or a library's for it, calls one."""

from __future__ import annotations

import builtins
import io
import os
import random
import sys

import torch

# Modules whose functions return what no guard keeps: Python's random state, the clock, the OS.
# The running thread (threading.get_ident(), current_thread()) and the collector's state
# (gc.get_count(), sys.getrefcount) differ from call to call too.
# A file's contents (``open``: the io module's), the interpreter's frames (``sys._getframe``,
# ``inspect.currentframe()``: a frame's globals and locals, read by no chain) and code that
# ``eval`` or ``exec`` runs from a string (its reads are in no bytecode that ran as a file's)
# are such state too.
_IMPURE_MODULES = frozenset({"random", "_random", "time", "secrets", "uuid", "posix", "nt",
                             "_thread", "threading", "gc", "io", "_io"})
_IMPURE_SYS = frozenset({"getrefcount", "getallocatedblocks", "_current_frames",
                         "_current_exceptions", "getswitchinterval_", "_getframe",
                         "_getframemodulename"})
_IMPURE_BUILTINS = frozenset({"eval", "exec"})


# torch's C functions of Note [Trace state] (recording.py)
_TRACE_STATE_C = ("_is_torch_function_mode_enabled", "_len_torch_function_stack",
                  "_get_function_stack_at", "_is_torch_function_enabled",
                  "_is_torch_function_all_disabled", "_len_torch_dispatch_stack",
                  "_get_dispatch_mode", "_get_dispatch_stack_at",
                  "is_autocast_cache_enabled")  # (make_fx turns the cache off to trace)
# Note [Autocast settings]: torch's autocast dtypes (``torch.get_autocast_dtype("cpu")``, set by
# ``torch.set_autocast_dtype`` outside any autocast region) are process state that no call-wide
# guard holds (trt_env holds whether autocast is on, not its dtype), and their deprecated
# getters warn at each call, so no guard calls them either: a call that reads one runs eagerly.
_AUTOCAST_DTYPES_C = ("get_autocast_dtype", "get_autocast_cpu_dtype", "get_autocast_gpu_dtype",
                      "get_autocast_ipu_dtype", "get_autocast_xla_dtype")


def _impure_name(fn) -> str | None:
    owner = getattr(fn, "__self__", None)
    if owner is torch._C and getattr(fn, "__name__", "") in _TRACE_STATE_C + _AUTOCAST_DTYPES_C:
        return f"torch._C.{fn.__name__}"  # Note [Trace state]; Note [Autocast settings]
    module = getattr(fn, "__module__", None) or type(owner).__module__
    if isinstance(owner, (random.Random, torch.Generator)) or module in _IMPURE_MODULES or \
            str(type(owner).__module__).startswith("numpy.random"):
        return f"{module}.{getattr(fn, '__qualname__', getattr(fn, '__name__', fn))}"
    if owner is sys and getattr(fn, "__name__", "") in _IMPURE_SYS:
        return f"sys.{fn.__name__}"
    if owner is builtins and getattr(fn, "__name__", "") in _IMPURE_BUILTINS:
        return fn.__name__
    if isinstance(owner, type) and owner.__module__ == "datetime" and \
            getattr(fn, "__name__", "") in ("now", "today", "utcnow"):  # the clock
        return f"datetime.{owner.__name__}.{fn.__name__}"
    return None


# Standard-library modules whose functions read the file system for their caller
# (os.path.exists, os.path.abspath's getcwd, pathlib): a C call of posix they make for user
# code is the user's read of OS state.
_OS_WRAPPERS = frozenset({"os", "genericpath", "posixpath", "ntpath", "pathlib", "shutil",
                          "glob", "fnmatch", "inspect"})
_OS_READS = frozenset({"stat", "lstat", "fstat", "listdir", "scandir", "getcwd", "getcwdb",
                       "access", "readlink", "statvfs", "getpid", "cpu_count", "urandom",
                       "open", "_getframe"})


# Note [Files read by libraries]: a file a library reads for the function (``torch.load(path)``,
# ``np.loadtxt``, ``configparser``'s ``read``, a config loaded from a file) is a value the trace
# bakes in, as the user's own ``open`` is: no guard sees the file change. So ``open`` (and
# ``os.open``) called by any code the function runs makes the call run eagerly, but for the
# readers of source code that tracing itself runs (``linecache`` and ``tokenize`` for stack
# traces and warnings' lines; imports open files by ``io.open_code``, not ``open``).
_FILE_OPENERS = (io.open, os.open)
_SOURCE_READERS = frozenset({"linecache", "tokenize", "traceback", "inspect"})
