"""Settings read from the environment, and Trident's loggers.

Environment variables:
    TRIDENT_CACHE_DIR   where compiled modules live (default: the user's cache dir / "trident").
    TRIDENT_LOGS        comma-separated log switches: ``recompiles``, ``guards``, ``mlir``,
                        ``code`` (generated C), ``cache``; ``all`` turns on every one.
    TRIDENT_MAX_SPECIALIZATIONS   default bound of specializations per function (16: Note
                        [Specialization limit] in trident/frontend/limit.py says why).
    TRIDENT_LOCK_TIMEOUT  seconds to wait for a build lock another process holds (600).
    TRIDENT_CUDA_GRAPHS `0` runs CUDA specializations step by step instead of replaying a CUDA
                        graph of them (Note [CUDA graphs] in trident/frontend/graphs.py); default `1`.
    TRIDENT_CUDA_GRAPH_SIZES  default bound of the sizes of a symbolic specialization that get
                        a CUDA graph (Note [Graphs per size] in trident/frontend/graphs.py); default 64.
    TRIDENT_PROGRESS    `0` hides the line that shows a long first compile's stages (Note
                        [Progress]); it shows only where stderr is a terminal.
    TRIDENT_FORBID_COMPILE  `1` makes a trace or a module build raise ``CompileForbidden``
                        (Note [Compile stages]): a warm restart's test.
    TRIDENT_CACHE_SIZE  bound of the cached functions' size on disk, in bytes, or with a
                        binary suffix (``512M``, ``2G``); default 2G. ``CACHE_SIZE`` below, when
                        set, takes precedence (Note [Cache size] in trident/frontend/cache.py).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from pathlib import Path

import platformdirs

# Trident's own package folder, and where the C templates are: setup.py installs templates/ as
# trident/templates; in a source checkout they sit beside the package.
VERSION = "0.1.0"  # trident.__version__
PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATE_DIRS = [str(PACKAGE_DIR / "templates"), str(PACKAGE_DIR.parent / "templates")]

LOG_SWITCHES = ("recompiles", "guards", "mlir", "code", "cache")

log = logging.getLogger("trident")


def cache_dir() -> Path:
    """The root of Trident's on-disk cache (created on first use)."""
    root = os.environ.get("TRIDENT_CACHE_DIR") or platformdirs.user_cache_dir("trident")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


# The bound of the cache's size in bytes, for this process (Note [Cache size] in cache.py):
# ``trident.config.CACHE_SIZE = 512 * 2**20``; None reads TRIDENT_CACHE_SIZE.
CACHE_SIZE: int | None = None
DEFAULT_CACHE_SIZE = 2 * 2**30
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def cache_size() -> int:
    """The bound of the cached functions' size on disk, in bytes: ``CACHE_SIZE`` when set, else
    ``TRIDENT_CACHE_SIZE`` (bytes, or a number with a binary suffix K, M, G or T, an optional
    ``iB`` or ``B`` after it: ``512M``, ``1.5GiB``), else 2 GiB. A value that is none of these
    is warned about and the default used."""
    if CACHE_SIZE is not None:
        return int(CACHE_SIZE)
    text = os.environ.get("TRIDENT_CACHE_SIZE", "").strip()
    if not text:
        return DEFAULT_CACHE_SIZE
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if m is None:
        import warnings

        warnings.warn(f"TRIDENT_CACHE_SIZE={text!r} is not a size (bytes, or a number with K, M, "
                      f"G or T); the cache keeps its default bound of 2 GiB", stacklevel=2)
        return DEFAULT_CACHE_SIZE
    return int(float(m[1]) * _SUFFIXES[m[2].upper()])


def max_specializations() -> int:
    return int(os.environ.get("TRIDENT_MAX_SPECIALIZATIONS", "16"))


def cuda_graphs() -> bool:
    return os.environ.get("TRIDENT_CUDA_GRAPHS", "1") != "0"


def cuda_graph_sizes() -> int:
    return max(1, int(os.environ.get("TRIDENT_CUDA_GRAPH_SIZES", "64")))


# Note [Progress]: a first compile shows which stage it is in (Note [Compile stages]) once it has
# run 2 s, on one terminal line ("trident: Block.forward [00:04, C build]") that a thread refreshes
# each second (a trace may run for a minute without reaching a stage's end), cleared at its end;
# each stage's seconds also go to the ``recompiles`` log as the stage ends (after the call's
# ``miss`` line, before the whole compile's ``compiled specialization`` line). Compiles run one
# at a time in a process (policy.py's lock), so one display is active at most.
#
# The line has no end of its own (it is drawn again over itself), so what else the process
# writes to stderr while it shows, a ``TRIDENT_LOGS`` record (a stage's seconds), a warning of
# the traced code or of transformers' ``generate`` around the compile, went on after it on
# the same line ("trident: M.forward [00:15, trace][trident.recompiles] M.forward: trace 16.3
# s", seen with a compile inside ``generate``). Meanwhile the line is cleared before each such
# record or write, under the bar's lock held until the record or write is out: a record of
# Trident's loggers (their ``callHandlers`` wrapped, so every handler's output is inside) and a
# write to ``sys.stderr`` (warnings, ``print``; ``sys.stderr`` is a forwarding wrapper during
# the display). The refresher draws the line again under the same lock, and only where the
# last write ended its line (``print`` writes its text and its ``\n`` apart): a tick can no
# longer fall between a clear and its record (it did, on a loaded machine: CI, session 49; a
# 0.2 s pause after each clear narrowed that, session 49, and is gone, session 50).
# What writes to descriptor 2 directly (a C library), or through a stream object some handler
# took before the display from a logger other than Trident's, is not seen; a handler made
# during the display on ``sys.stderr`` that another thread's record reaches while one of
# Trident's is written waits on that record (the two locks, taken in either order).
_progress: list = []  # the active display: (function name, tqdm bar)


class _Aside:
    """Clears the progress line before other output (Note [Progress]): around the handlers
    of Trident's loggers, and as ``sys.stderr``'s wrapper."""

    def __init__(self, bar, stream):
        self.bar, self.stream, self.shown, self.mid_line = bar, stream, False, False

    def draw(self) -> None:  # the refresher's tick
        with self.bar.get_lock():
            if self.mid_line:  # a write whose line has not ended
                return
            self.bar.update(0)  # draws the line once its delay has passed
            self.shown = self.bar.last_print_t >= self.bar.start_t + self.bar.delay

    def _clear(self) -> None:  # (the caller holds the bar's lock)
        if self.shown:
            self.bar.clear(nolock=True)
            self.shown = False

    def around(self, call_handlers):
        """``Logger.callHandlers`` that clears the line first, holding the lock throughout."""
        def call(record) -> None:
            with self.bar.get_lock():
                self._clear()
                call_handlers(record)
        return call

    def write(self, text: str) -> int:
        with self.bar.get_lock():
            self._clear()
            if text:
                self.mid_line = not text.endswith("\n")
            return self.stream.write(text)

    def __getattr__(self, name):  # the rest of the stream's interface (flush, fileno, ...)
        return getattr(self.stream, name)


@contextlib.contextmanager
def progress(name: str):
    """Show the stages of the compile of ``name`` (a qualified name) that runs in the block
    (Note [Progress]): a ``tqdm`` line on stderr once it has taken 2 s, none where stderr is not
    a terminal (the test suite, a log file) or with ``TRIDENT_PROGRESS=0``; other output to
    stderr meanwhile clears it first."""
    import sys
    import threading

    from tqdm import tqdm

    quiet = os.environ.get("TRIDENT_PROGRESS", "1") == "0" or not sys.stderr.isatty()
    # a copy of the terminal's descriptor: build.py sends descriptor 2 to the log meanwhile
    terminal = contextlib.nullcontext(None) if quiet else open(os.dup(sys.stderr.fileno()), "w")
    with terminal as file, tqdm(desc=f"trident: {name}", delay=2.0, disable=quiet, leave=False,
                                bar_format="{desc} [{elapsed}{postfix}]", file=file) as bar:
        stop, aside = threading.Event(), _Aside(bar, sys.stderr)

        def refresh():
            while not stop.wait(1.0):
                aside.draw()

        refresher = threading.Thread(target=refresh, daemon=True)
        loggers = [] if quiet else [logger(switch) for switch in LOG_SWITCHES]
        saved = [lg.__dict__.get("callHandlers") for lg in loggers]  # (a display inside one)
        if not quiet:
            refresher.start()
            sys.stderr = aside
            for lg in loggers:  # (an attribute of the instance: Logger.handle calls it)
                lg.callHandlers = aside.around(lg.callHandlers)
        _progress.append((name, bar))
        try:
            yield
        finally:
            _progress.remove((name, bar))
            stop.set()
            if refresher.is_alive():
                refresher.join()
            for lg, handlers in zip(loggers, saved):
                if handlers is None:
                    del lg.callHandlers
                else:
                    lg.callHandlers = handlers
            if sys.stderr is aside:  # (unless the block set another meanwhile)
                sys.stderr = aside.stream


# Note [Frozen heap]: Python's cyclic garbage collector runs a full collection, over every
# tracked object of the process, each time the objects that survived the younger generations
# reach a quarter of the old ones; a trace allocates hundreds of thousands (fake tensors, fx
# nodes, MLIR), so a first compile met two or three full collections over a heap that torch,
# transformers and a model make large (470,000 objects), 0.2 s of CPU each. While a compile
# runs, the objects that were there before it are frozen (``gc.freeze``: kept out of every
# collection) and then put back in the oldest generation (``gc.unfreeze``): the collections
# meanwhile walk the compile's own objects only. Nothing is freed that would not be, later: a
# cycle among the old objects waits for the next full collection after the compile. A process
# that froze objects itself after importing Trident (a server after its start-up: more frozen
# objects than Trident last saw: at its import, Python 3.12 has frozen a few hundred of its own,
# which the first compile's ``unfreeze`` puts back) is left as it is, and so is one whose
# collector is off.
_freeze_count = gc.get_freeze_count()  # the objects frozen, as Trident last saw


@contextlib.contextmanager
def frozen_heap():
    """The block runs with the objects made before it frozen (Note [Frozen heap])."""
    global _freeze_count
    if gc.get_freeze_count() != _freeze_count or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        _freeze_count = gc.get_freeze_count()


def logger(switch: str) -> logging.Logger:
    """The logger ``trident.<switch>``; enabled at INFO when TRIDENT_LOGS names it."""
    assert switch in LOG_SWITCHES, switch
    return logging.getLogger(f"trident.{switch}")


def _configure_from_env() -> None:
    names = {s.strip() for s in os.environ.get("TRIDENT_LOGS", "").split(",") if s.strip()}
    if not names:
        return
    if "all" in names:
        names = set(LOG_SWITCHES)
    unknown = names - set(LOG_SWITCHES)
    if unknown:
        import warnings

        warnings.warn(f"TRIDENT_LOGS: unknown switch(es) {sorted(unknown)}; known: "
                      f"{', '.join(LOG_SWITCHES)}, all", stacklevel=2)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in names & set(LOG_SWITCHES):
        lg = logger(name)
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
        lg.propagate = False


_configure_from_env()


def lock_timeout() -> float:
    """Seconds a process waits for a build lock (a module's, the runtime's) that another live
    process holds: past that the call runs eagerly with a warning (``TRIDENT_LOCK_TIMEOUT``,
    default 600; a build the holder is still making is found by a later call)."""
    return float(os.environ.get("TRIDENT_LOCK_TIMEOUT", "600"))


# Note [Compile stages]: a first compile's time, by stage, summed over this process: ``trace``
# (the function on fake tensors, tracing.py; ``order probe`` its second trace, Note [Dict
# orders] in lower/orders.py; ``writes probe`` a run before it, Note [Writes probe] in
# tracing.py), ``state`` (the digest of the state the trace
# read, lower/state/), ``import`` (Torch-MLIR, importer.py; a first compile's includes
# loading Torch-MLIR, seconds on a busy machine), ``plan`` (plan.py), ``buffers``
# (buffer reuse, Note [Buffer reuse]), ``kernels`` (Triton compiles for CUDA, cubins.py),
# ``guards`` (the specialization's guards, lower/guards.py), ``render`` (the C source,
# codegen) and ``C build`` (the C compiler, build.py). A stage inside another counts in both.
# Together they cover the "compiled specialization in N s" of the recompiles log (render and
# C build included), but for the signature and Python's bookkeeping.
# A warm restart loads stored specializations and the modules their records name (Note [Stored
# module names] in frontend/modules.py): every stage stays 0. ``render`` counts each render
# that makes or finds a module: a compile's, a load whose record is missing or fails (a cache
# of an older Trident: rendered once, then recorded), the names a compile's pruning needs,
# and, with ``TRIDENT_LOGS=code``, the C a load logs; not ``source()``'s, which only shows the
# C. With ``TRIDENT_FORBID_COMPILE=1`` a trace or a build raises
# ``errors.CompileForbidden`` instead, so a test can prove it. Each stage's CPU seconds are
# counted too (``compile_times(cpu=True)``: this process's threads and the children it waited
# for, the C compiler), steadier than wall time on a busy machine.
STAGES = ("trace", "order probe", "writes probe", "state", "import", "plan", "buffers",
          "kernels", "guards", "render", "C build")
_FORBIDDEN = ("trace", "C build")
_stage_seconds = dict.fromkeys(STAGES, 0.0)
_stage_cpu = dict.fromkeys(STAGES, 0.0)


def _cpu_seconds() -> float:
    t = os.times()  # user and system, this process's and its waited-for children's
    return t.user + t.system + t.children_user + t.children_system


@contextlib.contextmanager
def stage(name: str):
    """Counts the block's wall time toward ``compile_times()[name]`` (Note [Compile stages]).

    Raises:
        CompileForbidden: ``name`` is ``trace`` or ``C build`` and TRIDENT_FORBID_COMPILE=1."""
    if name in _FORBIDDEN and os.environ.get("TRIDENT_FORBID_COMPILE", "0") == "1":
        from trident.errors import CompileForbidden

        raise CompileForbidden(f"TRIDENT_FORBID_COMPILE=1 and this call would {name}: no "
                               "stored specialization or built module accepts it")
    if _progress:  # Note [Progress]
        _progress[-1][1].set_postfix_str(name, refresh=False)
    start, cpu = time.perf_counter(), _cpu_seconds()
    try:
        yield
    finally:
        seconds = time.perf_counter() - start
        _stage_seconds[name] += seconds
        _stage_cpu[name] += _cpu_seconds() - cpu
        if _progress:
            logger("recompiles").info("%s: %s %.2f s", _progress[-1][0], name, seconds)


def compile_times(reset: bool = False, cpu: bool = False) -> dict[str, float]:
    """Seconds this process spent in each compile stage (Note [Compile stages]), in pipeline
    order: ``{"trace": 3.1, "import": 0.4, ...}``, wall time, or with ``cpu=True`` CPU time
    (this process's and the C compiler's); ``reset=True`` zeroes both after reading."""
    times = dict(_stage_cpu if cpu else _stage_seconds)
    if reset:
        _stage_seconds.update(dict.fromkeys(STAGES, 0.0))
        _stage_cpu.update(dict.fromkeys(STAGES, 0.0))
    return times


# What torch logs while Trident traces is about the trace, not the user's call: fake tensor mode
# logs the whole traceback of an op that failed on fake tensors (a shape error, about 40 lines
# at ERROR) before make_fx raises it, and the user then sees Trident's one warning and eager's
# own exception. Those records go to Trident's ``recompiles`` log (TRIDENT_LOGS), at INFO.
_TRACE_LOGGERS = ("torch._subclasses.fake_tensor",)


class _ToTridentLog(logging.Handler):
    """Logs a record again at INFO, Trident's level, on ``trident.recompiles``."""

    def emit(self, record: logging.LogRecord) -> None:
        logger("recompiles").info("%s (%s): %s", record.name, record.levelname,
                                  record.getMessage(), exc_info=record.exc_info)


@contextlib.contextmanager
def trace_logs_to_trident():
    """While tracing, the records of ``_TRACE_LOGGERS`` go to Trident's ``recompiles`` log
    instead of their handlers (torch's, on stderr)."""
    loggers = [logging.getLogger(name) for name in _TRACE_LOGGERS]
    saved = [(lg.handlers, lg.propagate) for lg in loggers]  # torch._logging gives each its own
    for lg in loggers:
        lg.handlers, lg.propagate = [_ToTridentLog()], False
    try:
        yield
    finally:
        for lg, (handlers, propagate) in zip(loggers, saved):
            lg.handlers, lg.propagate = handlers, propagate
