"""Cache: where a function's specializations and built modules live on disk.

Layout under ``config.cache_dir()``:

    runtime/<key>/                     the native runtime, one per (torch, Python, source)
    functions/<name>-<key>/            one @trident.jit function (Note [Function key])
        function.json                  what it is, for ``python -m trident list`` (describe())
        specs/<ns>-<hash>.json         one specialization each (guards + plan), in creation order
        trident_scm_<hash>.<ext>       built SCMs; <hash> covers the rendered C (build.py)
        trident_scm_<hash>.c           the C source, for reading
        eager/<ns>-<hash>.json         signatures whose compile failed (Note [Stored eager
                                       decisions] in jit.py)
    locks/<name>-<key>.lock            held while a process loads or stores a function's entries
    locks/evict.lock                   held while a process evicts (Note [Cache size])

A new process renders the stored specializations again (no tracing, no MLIR) and loads the
module whose name that source hashes to.

Note [Cache size]: the cached functions (``functions/``; not the runtime build) are kept
under ``config.cache_size()`` bytes (default 2 GiB, ``TRIDENT_CACHE_SIZE``). A folder's
modification time is its last use: a process sets it when it loads the folder's entries and
when it stores one. After a process stores a specialization it evicts whole folders, least
recently used first, under ``locks/evict.lock``, until the cache fits; it skips the folder it
just stored into and every folder whose ``locks/`` lock another process holds, which a process
holds while it reads a folder's specializations and loads their modules, and while it builds
and stores a new one (``in_use``). A process that loaded a module keeps it mapped when its file
is deleted; one that finds a stored specialization's module gone builds it again, with a
warning. A cache that cannot fit stays over the bound until a later eviction: where the entry
just stored is larger than the bound, with a warning (once per process); where other entries
are in use, in the ``cache`` log (the next compile's eviction takes them).

Note [Function key]: the function's bytecode and constants, nested code objects, default
arguments, closure cells, the globals its code names (functions by their own key, modules by
name, plain values by repr, other objects by their attributes, their ``__slots__``, or by
repr, or, having none of these, by identity in this process only), a bound method's ``self``
likewise, and the versions of Python, torch, triton, torch-mlir and Trident's own source. A
``torch.compile`` graph (a ``GraphModule``'s ``forward``, backend.py) is keyed by what decides
its code (``_hash_graph_module``), not by Dynamo's metadata, which holds a per-process uuid:
so identical runs find the graph's entry again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import sys
import tempfile
import time
import contextlib
import types
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from . import config
from .specialization import Specialization

_log = config.logger("cache")

__version__ = "0.1.0"
_PROCESS = uuid.uuid4().hex  # keys of objects hashed by identity never match another process


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


# The command line and the entries of the benchmarks (which live in benchmarks/, outside the
# package) compile nothing: editing them must not invalidate every user's cached functions.
_OUTSIDE_THE_KEY = re.compile(r"bench\.py|demo\.py|__main__\.py")


def keyed_sources() -> list[Path]:
    """Trident's own files that shape what it compiles: every stage, the runtime, the
    templates; not the benchmarks, the demo or the command line."""
    from .codegen import TEMPLATE_DIRS

    here = Path(__file__).resolve().parent
    files = sorted(p for p in here.glob("*.py") if not _OUTSIDE_THE_KEY.fullmatch(p.name))
    files += sorted((here / "runtime").glob("*.[hc]*"))
    return files + sorted(p for d in TEMPLATE_DIRS for p in Path(d).glob("*.jinja"))


@functools.cache
def versions() -> str:
    """Python, torch, triton, torch-mlir, and Trident's own source (``keyed_sources``): a change
    to any of them makes new cache entries."""
    own = hashlib.sha256()
    for path in keyed_sources():
        own.update(path.read_bytes())
    parts = [sys.version, torch.__version__, _dist_version("triton"), _dist_version("torch-mlir"),
             __version__, own.hexdigest()]
    return "|".join(parts)


def code_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it refer to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def _hash_code(h, code: types.CodeType) -> None:
    h.update(code.co_filename.encode())  # generated C names the file; errors quote it
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(h, const)
        else:
            h.update(repr(const).encode())


def _has(value, name: str) -> bool:
    """``hasattr``, for objects whose ``__getattr__`` raises something else than
    AttributeError for names they lack (a KeyError: issue 28)."""
    try:
        return hasattr(value, name)
    except Exception:  # noqa: BLE001 (the object's own error: it has no such attribute)
        return False


def _hash_value(h, value: Any, seen: set[int], depth: int) -> None:
    if id(value) in seen or depth > 4:
        h.update(b"<seen>")
        return
    seen.add(id(value))
    from .jit import JitFunctionMixin

    if isinstance(value, types.FunctionType):
        _hash_function(h, value, seen, depth + 1)
    elif isinstance(value, JitFunctionMixin):  # its code, not its counters and graphs
        h.update(b"trident.jit:")
        _hash_value(h, value._code_fn, seen, depth + 1)
    elif isinstance(value, torch.fx.GraphModule):
        _hash_graph_module(h, value, seen, depth + 1)
    elif isinstance(value, types.ModuleType):
        h.update(f"module:{value.__name__}".encode())
    elif isinstance(value, type):
        h.update(f"type:{value.__module__}.{value.__qualname__}".encode())
    elif isinstance(value, (int, float, str, bool, bytes, type(None), torch.dtype, torch.device)):
        h.update(f"{type(value).__name__}:{value!r}".encode())
    elif isinstance(value, (tuple, list)):
        for item in value:
            _hash_value(h, item, seen, depth + 1)
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _hash_value(h, value[k], seen, depth + 1)
    elif _has(value, "fn") and _has(value, "src"):  # a Triton JITFunction
        h.update(f"triton:{value.src}".encode())
    elif _has(value, "fn"):  # Triton's Autotuner / Heuristics wrap another kernel
        for tuned in getattr(value, "configs", None) or ():
            h.update(repr(tuned).encode())
        for name, heuristic in (getattr(value, "values", None) or {}).items():
            h.update(name.encode())
            _hash_value(h, heuristic, seen, depth + 1)
        _hash_value(h, value.fn, seen, depth + 1)
    elif isinstance(value, torch.Tensor):  # one-element tensors are baked in: their value too
        h.update(f"tensor:{value.dtype}{tuple(value.shape)}".encode())
        if value.numel() == 1:
            h.update(repr(value.item()).encode())
    elif hasattr(value, "__dict__"):  # plain objects (configs, namespaces): their attributes
        h.update(f"object:{type(value).__module__}.{type(value).__qualname__}".encode())
        _hash_value(h, dict(vars(value)), seen, depth + 1)
    elif type(value).__repr__ is not object.__repr__:  # numpy scalars, enums, ...: their repr
        h.update(f"repr:{type(value).__module__}.{type(value).__qualname__}:{value!r}".encode())
    elif _slots(type(value)):  # __slots__ objects: their slots' values
        h.update(f"slots:{type(value).__module__}.{type(value).__qualname__}".encode())
        for name in _slots(type(value)):
            h.update(name.encode())
            _hash_value(h, getattr(value, name, _Unset), seen, depth + 1)
    else:  # no content to hash (a C object): this object, in this process only
        h.update(f"object:{type(value).__qualname__}@{id(value)}:{_PROCESS}".encode())


class _Unset:  # an empty __slots__ slot
    pass


def _slots(t: type) -> tuple[str, ...]:
    """The ``__slots__`` names of ``t`` and its bases (empty for a type without them)."""
    names = []
    for base in t.__mro__:
        declared = base.__dict__.get("__slots__", ())
        names += [declared] if isinstance(declared, str) else list(declared)
    return tuple(n for n in names if n not in ("__dict__", "__weakref__"))


def _hash_graph_module(h, gm: torch.fx.GraphModule, seen: set[int], depth: int) -> None:
    """A GraphModule (``torch.compile``'s graph, backend.py) by what decides its code: its
    generated ``forward`` (the function: its source, file name and globals), every attribute a
    node reads (a constant tensor by its bytes, a subgraph by its own code), and the Triton
    kernel and constant arguments of each launch, which Dynamo's graph names by their index in
    a table of this process (``kernel_side_table``). Not Dynamo's metadata (``meta``, a
    ``backend_id`` of a per-process uuid), which never reaches the code."""
    from .backend import _launch

    h.update(f"graph:{gm.code}".encode())
    _hash_function(h, type(gm).forward, seen, depth)
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            h.update(node.target.encode())
            if isinstance(value, torch.Tensor):
                h.update(f"tensor:{value.dtype}{tuple(value.shape)}{value.stride()}".encode())
                h.update(value.detach().cpu().contiguous().view(-1).view(torch.uint8)
                         .numpy().tobytes())
            else:
                _hash_value(h, value, seen, depth + 1)
        elif node.op == "call_function" and node.target is _launch:
            from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

            kernel, constants = node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"]
            _hash_value(h, kernel_side_table.get_kernel(kernel), seen, depth + 1)
            _hash_value(h, kernel_side_table.get_constant_args(constants), seen, depth + 1)


def _hash_function(h, fn: types.FunctionType, seen: set[int], depth: int) -> None:
    h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
    if isinstance(fn, types.MethodType):  # a bound method: what it reads through self
        _hash_value(h, fn.__self__, seen, depth)
        if isinstance(fn.__self__, torch.fx.GraphModule):  # its forward was hashed with it
            return
    _hash_code(h, fn.__code__)
    for default in fn.__defaults__ or ():
        _hash_value(h, default, seen, depth)
    for name, default in sorted((fn.__kwdefaults__ or {}).items()):
        h.update(name.encode())
        _hash_value(h, default, seen, depth)
    for cell in fn.__closure__ or ():
        try:
            _hash_value(h, cell.cell_contents, seen, depth)
        except ValueError:  # empty cell
            h.update(b"<empty>")
    for name in sorted(code_names(fn.__code__)):
        if name in fn.__globals__:
            h.update(name.encode())
            _hash_value(h, fn.__globals__[name], seen, depth)


def function_key(fn) -> str:
    """Note [Function key]."""
    h = hashlib.sha256(versions().encode())
    _hash_function(h, fn, set(), 0)
    return h.hexdigest()[:20]


def describe(fn) -> dict:
    """What ``python -m trident list`` says of a function: ``qualname``, ``module``, ``file``
    and ``line`` (of its ``def``); for the ``forward`` of a graph that ``torch.compile`` handed to
    Trident's backend, ``graph_of``: the user function and line of the graph's first op, read
    from Dynamo's ``stack_trace`` node metadata (torch 2.13)."""
    code = getattr(fn, "__code__", None)
    about = {"qualname": getattr(fn, "__qualname__", type(fn).__qualname__),
             "module": getattr(fn, "__module__", None),
             "file": code.co_filename if code else None,
             "line": code.co_firstlineno if code else None}
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.fx.GraphModule):
        for node in owner.graph.nodes:
            frame = re.search(r'File "([^"]+)", line (\d+), in (\S+)',
                              node.meta.get("stack_trace") or "")
            if frame:
                about["graph_of"] = f"{frame[3]} ({frame[1]}:{frame[2]})"
                break
    return about


class FunctionCache:
    """The cache folder of one function."""

    def __init__(self, fn, key: str):
        name = "".join(c if c.isalnum() or c in "_-" else "_" for c in fn.__qualname__)[:40]
        self.directory = config.cache_dir() / "functions" / f"{name}-{key}"
        self.spec_dir = self.directory / "specs"
        self.eager_dir = self.directory / "eager"
        self.about = describe(fn)
        self._parsed: dict[Path, tuple[tuple, Specialization]] = {}  # by file, with its stat
        self.vanished = False  # a spec file was deleted while load_specs read it

    def load_specs(self) -> list[Specialization]:
        """The stored specializations, oldest first. A damaged entry (not JSON, a field or an
        operator this Trident does not know, contents that do not hash to the key in the file's
        name, a folder where a file belongs, a file where the ``specs`` folder belongs) is
        dropped with a warning, so that the next compile of that signature stores it again."""
        if not self.spec_dir.is_dir():
            if self.spec_dir.exists() or self.spec_dir.is_symlink():
                _discard(self.spec_dir, "not a folder")
            return []
        specs, keys = [], set()
        for path in sorted(self.spec_dir.glob("*.json")):
            try:
                stat = path.stat()
                seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if path in self._parsed and self._parsed[path][0] == seen:
                    spec = self._parsed[path][1]
                else:
                    spec = Specialization.from_json(json.loads(path.read_text()))
                    _check_ops(spec)
                    if path.stem.rpartition("-")[2] != spec.key:  # edited, or not ours
                        raise ValueError(f"its contents hash to {spec.key}, not to the hash in "
                                         "its name")
                    self._parsed[path] = (seen, spec)
            except FileNotFoundError:  # deleted by another process meanwhile
                self._parsed.pop(path, None)
                self.vanished = True
                continue
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                self._parsed.pop(path, None)
                _discard(path, f"{type(e).__name__}: {e}")  # written atomically: damaged
                continue
            if spec.key not in keys:
                keys.add(spec.key)
                specs.append(spec)
        return specs

    def save_spec(self, spec: Specialization, keep: int = 64) -> bool:
        """Store ``spec``, and delete the oldest stored ones past the newest ``keep`` (calls
        whose argument trees hold per-process values never match across processes, and would
        pile up); False where a cache that cannot be written (read-only, full) is warned
        about: the specialization still serves this process."""
        try:
            if self.spec_dir.exists() and not self.spec_dir.is_dir():
                _discard(self.spec_dir, "not a folder")
            self.spec_dir.mkdir(parents=True, exist_ok=True)
            about = self.directory / "function.json"  # for `python3 -m trident list`
            if not about.exists():
                fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(self.about, f)
                os.replace(tmp, about)
            if any(self.spec_dir.glob(f"*-{spec.key}.json")):
                return True
            fd, tmp = tempfile.mkstemp(dir=self.spec_dir, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(spec.to_json(), f)
                os.replace(tmp, self.spec_dir / f"{time.time_ns()}-{spec.key}.json")
            finally:
                Path(tmp).unlink(missing_ok=True)
            for old in sorted(self.spec_dir.glob("*.json"))[:-keep]:
                old.unlink(missing_ok=True)
            touch(self.directory)
            return True
        except OSError as e:
            warnings.warn(f"trident: cannot store the specialization {spec.signature} in "
                          f"{self.spec_dir} ({e}); it serves this process only", stacklevel=2)
            return False


    def load_eager(self) -> list[tuple[int, list, str]]:
        """Note [Stored eager decisions]: (tree key, guards, why) of each signature whose
        compile failed in an earlier process, oldest first; a damaged entry is dropped with a
        warning (the next failure of that signature stores it again)."""
        from .guards import Guard

        decisions = []
        for path in sorted(self.eager_dir.glob("*.json")) if self.eager_dir.is_dir() else []:
            try:
                data = json.loads(path.read_text())
                decisions.append((int(data["tree"]), [Guard.from_json(g) for g in data["guards"]],
                                  str(data["why"])))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                _discard(path, f"{type(e).__name__}: {e}")
        return decisions

    def save_eager(self, tree: int, guards: list, why: str, keep: int = 16) -> None:
        """Store that the signature ``guards`` of the argument tree ``tree`` failed to compile
        for ``why`` (Note [Stored eager decisions]), keeping the newest ``keep``; a cache that
        cannot be written is warned about (the decision then holds in this process only)."""
        text = json.dumps({"tree": tree, "guards": [g.to_json() for g in guards], "why": why},
                          sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:20]
        try:
            self.eager_dir.mkdir(parents=True, exist_ok=True)
            if any(self.eager_dir.glob(f"*-{digest}.json")):
                return
            fd, tmp = tempfile.mkstemp(dir=self.eager_dir, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                os.replace(tmp, self.eager_dir / f"{time.time_ns()}-{digest}.json")
            finally:
                Path(tmp).unlink(missing_ok=True)
            for old in sorted(self.eager_dir.glob("*.json"))[:-keep]:
                old.unlink(missing_ok=True)
        except OSError as e:
            warnings.warn(f"trident: cannot store in {self.eager_dir} that a signature runs "
                          f"eagerly ({e}); a later process traces it again", stacklevel=2)


# Warnings about the cache folder itself, given once per process (each names the folder).
_WARNED: set[str] = set()


def _warn_once(what: str, message: str) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(message, stacklevel=3)


@contextlib.contextmanager
def in_use(directory: Path):
    """Hold the lock of a function's folder (Note [Cache size]): eviction by another process
    skips the folder meanwhile. Reentrant in a thread; a cache where the lock cannot be made (a
    read-only disk, from which nothing is evicted either) holds none."""
    try:
        locks = directory.parents[1] / "locks"
        locks.mkdir(exist_ok=True)
        lock = FileLock(str(locks / f"{directory.name}.lock"), is_singleton=True)
        lock.acquire(timeout=config.lock_timeout())
    except OSError:  # (filelock's Timeout too: a process that holds it for good)
        yield
        return
    try:
        yield
    finally:
        lock.release()


def touch(directory: Path) -> None:
    """Record a use of a function's folder now (its modification time, Note [Cache size]); a
    folder that cannot be written keeps its time, with one warning per process."""
    try:
        os.utime(directory)
    except FileNotFoundError:  # nothing stored yet, or evicted by another process
        pass
    except OSError as e:
        _warn_once(f"touch:{directory.parents[1]}",
                   f"trident: cannot record uses in the cache {directory.parents[1]} ({e}): "
                   "it serves what it holds, and evicts by the times it has")


def entry_size(directory: Path) -> int:
    """The bytes of a function folder's entries: its files and those of ``specs/`` and
    ``eager/``; not a build in progress (cffi's temporary folder beside them), whose module
    counts once it is in place. Files that vanish meanwhile count 0."""
    size = 0
    for folder in (directory, directory / "specs", directory / "eager"):
        try:
            for entry in os.scandir(folder):
                try:
                    if entry.is_file(follow_symlinks=False):
                        size += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
        except OSError:
            continue
    return size


def evict(keep: Path) -> list[Path]:
    """Note [Cache size]: delete the least recently used function folders until the cache fits
    ``config.cache_size()``, never ``keep`` (the folder just stored into) nor a folder in use by
    another process; returns the deleted folders. A cache that cannot fit is warned about once
    per process when the entry just stored is larger than the bound; a folder that cannot be
    deleted (a read-only disk) is left as it is."""
    root = keep.parent
    limit = config.cache_size()
    deleted = []
    try:
        locks = root.parent / "locks"
        locks.mkdir(exist_ok=True)
        with FileLock(str(locks / "evict.lock"), timeout=60):
            entries = []
            for d in root.iterdir():
                try:
                    entries.append((d.stat().st_mtime_ns, entry_size(d), d))
                except OSError:  # deleted meanwhile
                    continue
            total = sum(size for _, size, _ in entries)
            for _, size, d in sorted(entries):
                if total <= limit:
                    break
                if d == keep or not d.is_dir():
                    continue
                lock = FileLock(str(locks / f"{d.name}.lock"), is_singleton=True)
                try:
                    lock.acquire(timeout=0)
                except Timeout:  # another process loads or stores it
                    continue
                try:
                    shutil.rmtree(d)
                finally:
                    lock.release()
                deleted.append(d)
                total -= size
    except (OSError, Timeout) as e:
        _warn_once(f"evict:{root}", f"trident: cannot evict from the cache {root} ({e}); it "
                   f"may grow past its bound of {limit} bytes")
        return deleted
    if deleted:
        _log.info("evicted %d least recently used functions from %s", len(deleted), root)
    kept = entry_size(keep)
    if kept > limit:  # a setting to change: warned
        _warn_once(f"full:{root}",
                   f"trident: the cache's bound of {limit} bytes (TRIDENT_CACHE_SIZE or "
                   f"trident.config.CACHE_SIZE) is smaller than the entry just stored in {keep} "
                   f"({kept} bytes); it stays until a later eviction")
    elif total > limit:  # entries in use by other processes: the next eviction takes them
        _log.info("%s holds %d bytes, over its bound of %d: entries in use stay", root, total,
                  limit)
    return deleted


def _check_ops(spec: Specialization) -> None:
    """Raise ``ValueError`` for a step calling an operator PyTorch's dispatcher lacks."""
    for step in spec.plan.steps:
        if "::" in step.op:
            try:
                torch._C._get_schema(step.op, step.overload)
            except RuntimeError:
                raise ValueError(f"unknown operator {step.op}.{step.overload}") from None


def _discard(path: Path, why: str) -> None:
    """Drop a damaged cache entry (a file or a folder), with a warning; a read-only cache keeps
    it (and the warning repeats in each process that reads it)."""
    warnings.warn(f"trident: dropped the damaged cache entry {path} ({why})", stacklevel=3)
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def list_entries() -> list[dict]:
    """One row per cached function folder: ``path``, ``about`` (describe(); empty for folders
    made before Trident wrote it), ``signatures`` of its stored specializations in creation
    order, their number ``specializations``, ``bytes`` on disk, ``last_use`` (seconds since
    the epoch: Note [Cache size]) and ``apart``: per signature, the words of the guards that
    tell it from the others of the same signature (the number of threads, grad mode; empty
    where its signature is its own)."""
    from .guards import Guard

    root = config.cache_dir() / "functions"
    rows = []
    for d in sorted(root.glob("*")) if root.is_dir() else []:
        try:
            about = json.loads((d / "function.json").read_text())
        except (OSError, ValueError):
            about = {}
        signatures, words = [], []
        for path in sorted(d.glob("specs/*.json")):
            try:
                data = json.loads(path.read_text())
                signatures.append(data["signature"])
                try:
                    words.append([Guard.from_json(g).words(data["arg_names"])
                                  for g in data["guards"]])
                except (KeyError, TypeError, ValueError, AttributeError):
                    words.append([])
            except (OSError, ValueError, KeyError, TypeError):
                signatures.append("(unreadable: dropped at the next load)")
                words.append([])
        apart = []
        for i, signature in enumerate(signatures):
            alike = [w for j, w in enumerate(words) if j != i and signatures[j] == signature]
            apart.append([w for w in words[i] if alike and any(w not in o for o in alike)])
        try:
            last_use = d.stat().st_mtime
        except OSError:
            last_use = None
        rows.append({"path": str(d), "about": about, "signatures": signatures,
                     "specializations": len(signatures), "bytes": entry_size(d),
                     "last_use": last_use, "apart": apart})
    return rows


def full_name(about: dict) -> str | None:
    """``module.qualname`` of a cached function (``describe()``), as ``list`` names it."""
    if not about.get("qualname"):
        return None
    return f"{about['module']}.{about['qualname']}" if about.get("module") else about["qualname"]


def clear(name: str | None = None) -> list[str]:
    """Delete the cache entries of the function ``name`` names, or, without a name, every cached
    function and runtime build. ``name`` is a folder name, ``module.qualname`` as ``list`` shows
    it (``app.model.Block.forward``), or a bare qualified name (``Block.forward``) when one
    function has it; entries of one function made by earlier versions of its code go with it.
    Returns the deleted folders.

    Raises:
        ValueError: ``name`` fits functions of several modules or files (its text lists them,
            with the folder name that picks each one); nothing is deleted."""
    root = config.cache_dir()
    if name is not None:
        rows = list_entries()
        rows = [r for r in rows if Path(r["path"]).name == name] or [
            r for r in rows if name in (r["about"].get("qualname"), full_name(r["about"]))]
        origins = {(r["about"].get("module"), r["about"].get("file")) for r in rows}
        if len(origins) > 1:
            raise ValueError(f"{name!r} names {len(origins)} functions ({len(rows)} cache "
                             "entries: a function's earlier code has its own); name one by "
                             "module.qualname or by folder:\n" + "\n".join(
                                 f"  {full_name(r['about'])} ({r['about'].get('file')}): "
                                 f"{Path(r['path']).name}" for r in rows))
        doomed = [Path(r["path"]) for r in rows]
    else:
        functions, runtime = root / "functions", root / "runtime"
        doomed = sorted(functions.iterdir()) if functions.is_dir() else []
        if runtime.is_symlink():  # a shared build (the test suite's): drop the link only
            doomed.append(runtime)
        elif runtime.is_dir():
            doomed += sorted(runtime.iterdir())
    for d in doomed:
        if d.is_symlink():
            d.unlink()
        else:
            shutil.rmtree(d, ignore_errors=True)
    if name is None:
        for sub in ("functions", "runtime", "locks"):
            shutil.rmtree(root / sub, ignore_errors=True)
    return [str(d) for d in doomed]
