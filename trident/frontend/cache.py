"""Cache: where a function's specializations and built modules live on disk.

Layout under ``config.cache_dir()``:

    runtime/<key>/                     the native runtime, one per (torch, Python, source)
    functions/<name>-<key>/            one @trident.jit function (Note [Function key])
        function.json                  what it is, for ``python -m trident list`` (describe())
        specs/<ns>-<hash>.json         one specialization each (guards + plan), in creation order
        trident_scm_<hash>.<ext>       built SCMs; <hash> covers the rendered C (build.py)
        trident_scm_<hash>.c           the C source, for reading
        eager/<ns>-<hash>.json         signatures whose compile failed (Note [Stored eager
                                       decisions] in policy.py)
        trees/<tree key>.json.gz       the words of a stored specialization's argument tree,
                                       for explain() (Note [Stored trees] in ir/trees.py)
        modules/<key>-<context>.json   the name of a stored specialization's module (Note
                                       [Stored module names] in modules.py)
    locks/<name>-<key>.lock            held while a process loads or stores a function's entries
    locks/evict.lock                   held while a process evicts (Note [Cache size])

A new process reads the stored specializations (no tracing, no MLIR) and loads the module
each one's record names (Note [Stored module names] in modules.py; where it has none, the
module whose name its rendered source hashes to), each when a call needs it (Note [Installing
on demand] in install.py).

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

Note [Function key] (identity.py) says what a function's folder is keyed by.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from trident import config
from trident.frontend.entries import describe, entry_size, parts_apart, stored_tree
from trident.ir.plan import OpCall
from trident.ir.specialization import Specialization
from trident.ir.trees import TreeWords

_log = config.logger("cache")

# Note [Process-only state] (install.py): per function folder, the specializations this
# process keeps in memory rather than on disk, by key.
_IN_PROCESS: dict[Path, dict[str, Specialization]] = {}
# The keys of the specializations this process compiled: a stored one that the state turns
# away is named in a miss reason only where another process compiled it (install.py's
# _stored_specs), since this process's own were set aside by the change its reason names.
COMPILED_HERE: set[str] = set()


class FunctionCache:
    """The cache folder of one function."""

    def __init__(self, fn, key: str, parts: dict[str, tuple[str, str]] | None = None):
        name = "".join(c if c.isalnum() or c in "_-" else "_" for c in fn.__qualname__)[:40]
        self.directory = config.cache_dir() / "functions" / f"{name}-{key}"
        self.spec_dir = self.directory / "specs"
        self.eager_dir = self.directory / "eager"
        self.about = describe(fn)
        if parts is not None:  # Note [Key parts] in identity.py
            self.about["key"] = {label: [words, digest[:16]] for label, (words, digest) in
                                 parts.items()}
        self._parsed: dict[Path, tuple[tuple, Specialization]] = {}  # by file, with its stat
        self.vanished = False  # a spec file was deleted while load_specs read it
        self.from_disk = False  # load_specs read a spec file (not only this process's ones)
        self.told = False  # the warning that the folder was deleted meanwhile given (install.py)

    def load_specs(self) -> list[Specialization]:
        """The stored specializations, oldest first. A damaged entry (not JSON, a field or an
        operator this Trident does not know, contents that do not hash to the key in the file's
        name, a folder where a file belongs, a file where the ``specs`` folder belongs) is
        dropped with a warning, so that the next compile of that signature stores it again."""
        specs, keys = [], set()
        if not self.spec_dir.is_dir():
            if self.spec_dir.exists() or self.spec_dir.is_symlink():
                _discard(self.spec_dir, "not a folder")
            return list(_IN_PROCESS.get(self.directory, {}).values())
        for path in sorted(self.spec_dir.glob("*.json")):
            try:
                stat = path.stat()
                seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
                if path in self._parsed and self._parsed[path][0] == seen:
                    spec = self._parsed[path][1]
                else:
                    text = path.read_text()
                    data = json.loads(text)
                    spec = Specialization.from_json(data)
                    _check_ops(spec)
                    named = path.stem.rpartition("-")[2]
                    if _text_digest(text) == named or _digest(data) == named:  # as stored: its
                        # key (Note [Stored text]), not computed again from
                        spec.__dict__["key"] = named  # the objects (Note [Installing on demand])
                    elif named != spec.key:  # edited, or not ours
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
        self.from_disk = bool(specs)
        return specs + [s for k, s in _IN_PROCESS.get(self.directory, {}).items()
                        if k not in keys]

    def keep_in_process(self, spec: Specialization) -> None:
        """Note [Process-only state]: ``spec`` is found again by this process's loads (after
        its state changed back), never written to disk. The function's origin is: its folder
        holds the module built for ``spec``, which ``python3 -m trident list`` names by it
        (without it, as a folder of an older Trident)."""
        _IN_PROCESS.setdefault(self.directory, {})[spec.key] = spec
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._save_about()
        except OSError:  # (a cache that cannot be written: save_spec warns of it)
            pass

    def _save_about(self) -> None:
        """The function's origin, once, for ``python3 -m trident list`` (OSError where the
        cache cannot be written)."""
        about = self.directory / "function.json"
        if not about.exists():
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.about, f)
            os.replace(tmp, about)

    def save_spec(self, spec: Specialization, keep: int = 64) -> bool:
        """Store ``spec``, and delete the oldest stored ones past the newest ``keep`` (calls
        whose argument trees hold per-process values never match across processes, and would
        pile up); False where a cache that cannot be written (read-only, full) is warned
        about: the specialization still serves this process."""
        try:
            if self.spec_dir.exists() and not self.spec_dir.is_dir():
                _discard(self.spec_dir, "not a folder")
            self.spec_dir.mkdir(parents=True, exist_ok=True)
            self._save_about()
            if any(self.spec_dir.glob(f"*-{spec.key}.json")):
                return True
            fd, tmp = tempfile.mkstemp(dir=self.spec_dir, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(spec.to_json(), sort_keys=True))  # Note [Stored text]
                path = self.spec_dir / f"{time.time_ns()}-{spec.key}.json"
                os.replace(tmp, path)
                stat = path.stat()  # this process's own file: not parsed again (load_specs)
                self._parsed[path] = ((stat.st_ino, stat.st_size, stat.st_mtime_ns), spec)
            finally:
                Path(tmp).unlink(missing_ok=True)
            for old in sorted(self.spec_dir.glob("*.json"))[:-keep]:
                old.unlink(missing_ok=True)
                for record in self.directory.glob(f"modules/{old.stem.rpartition('-')[2]}-*"):
                    record.unlink(missing_ok=True)  # Note [Stored module names]
            touch(self.directory)
            return True
        except OSError as e:
            warnings.warn(f"trident: cannot store the specialization {spec.signature} in "
                          f"{self.spec_dir} ({e}); it serves this process only", stacklevel=2)
            return False

    def keys_apart(self) -> list[str]:
        """Note [Key parts] in identity.py: each other folder of this function (its module, name
        and file), named with the parts of this folder's key that differ from its key (``label,
        here words``): why its entries do not serve this process (the ``cache`` log)."""
        found, mine = [], self.about.get("key") or {}
        for other in sorted(self.directory.parent.glob(self.directory.name.rpartition("-")[0]
                                                       + "-*/function.json")):
            try:
                about = json.loads(other.read_text())
                parts = about["key"]
            except (OSError, ValueError, KeyError, TypeError):  # an older Trident's, damaged
                continue
            if other.parent == self.directory or any(
                    about.get(k) != self.about.get(k) for k in ("module", "qualname", "file")):
                continue
            differ = [f"{label}, here {words}"
                      for label, words, _, _ in parts_apart(mine, [parts])]
            found.append(f"{other.parent.name} (differs in {'; '.join(differ) or 'no part'})")
        return found

    def stored(self, key: str) -> bool:
        """Whether the specialization ``key`` was read from, or written to, this folder by this
        process (not one kept in the process only)."""
        return any(spec.key == key for _, spec in self._parsed.values())

    def load_module_record(self, key: str, context: str) -> dict | None:
        """Note [Stored module names] in modules.py: the record of specialization ``key``'s
        module under ``context``, or None (none, damaged, deleted meanwhile)."""
        try:
            data = json.loads((self.directory / "modules" / f"{key}-{context}.json").read_text())
            if isinstance(data["module"], str) and all(
                    type(i) is int for i in data["callbacks"]) and all(
                    isinstance(c, str) for c in data["cubins"]):
                return data
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def save_module_record(self, key: str, context: str, record: dict) -> None:
        """Note [Stored module names]: store ``record`` for specialization ``key``'s module
        under ``context``; a cache that cannot be written skips it (a later process renders,
        as before)."""
        path = self.directory / "modules" / f"{key}-{context}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(record, f, sort_keys=True)
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        except OSError as e:
            _log.info("cannot store the module name of %s in %s: %s", key, path.parent, e)

    def save_tree(self, words: TreeWords, key: int, keep: int = 64) -> None:
        """Store the words of the argument tree ``key`` (Note [Stored trees]), and delete the
        least recently stored past the newest ``keep``, as ``save_spec`` does; a cache that
        cannot be written skips it (``explain`` then says less, nothing else changes)."""
        path = self.directory / "trees" / f"{key}.json.gz"  # gzip: a tenth of the bytes
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                os.utime(path)
            else:
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                try:
                    # the folder's name: two functions' trees of one structure are two
                    # entries, not byte-identical files; mtime 0: the same bytes each time
                    data = {"function": self.directory.name, **words.to_json()}
                    with os.fdopen(fd, "wb") as f:
                        f.write(gzip.compress(json.dumps(data).encode(), mtime=0))
                    os.replace(tmp, path)
                finally:
                    Path(tmp).unlink(missing_ok=True)
            for old in sorted(path.parent.glob("*.json.gz"), key=_mtime)[:-keep]:
                old.unlink(missing_ok=True)
        except OSError as e:
            _log.info("cannot store the argument tree %s in %s: %s", key, path.parent, e)

    def load_tree(self, key: int) -> TreeWords | None:
        """The stored words of the argument tree ``key`` (Note [Stored trees]), or None (none
        stored, deleted meanwhile, damaged)."""
        return stored_tree(self.directory, key)

    def renew(self, spec: Specialization) -> None:
        """Record that ``spec`` was installed from disk to serve a call: its file is named
        anew, as the newest, so that a new process installs the most recently used stored
        specializations first and ``save_spec`` deletes the least recently used (a cache that
        cannot be written keeps the order it has)."""
        for path in self.spec_dir.glob(f"*-{spec.key}.json"):
            try:
                os.replace(path, self.spec_dir / f"{time.time_ns()}-{spec.key}.json")
            except OSError:
                pass

    # Note [Stored eager decisions]: a signature whose trace or compile failed (a
    # data-dependent branch, Python state the function assigns, an op the plan cannot call) is
    # decided by what the keys cover: the function key the code, the globals it names and the
    # versions, the tree key the arguments' structure, the guards the leaves. So the decision
    # is stored in the function's folder (``eager/``) and a later process runs that signature
    # eagerly without tracing it (a Hugging Face prefill, whose static cache assigns its
    # tensors lazily, would otherwise trace in every process). What the keys do not cover (a
    # global that a helper in another module reads) may have changed since; then the call runs
    # eagerly where it could compile: a stored decision only ever makes a call eager, never
    # serves a result, and its warning says it came from the cache. Only a static trace's
    # failure is stored: not a build that failed (the compiler, a full disk: the machine's),
    # nor dims that ``dynamic=`` asked for (that JitFunction's options), nor a failure of this
    # moment (``errors.transient``: memory, the OS, the recursion limit, a lock, a profiler, an
    # exception user code raised in the trace: what made it raise is state). A JitFunction with
    # ``fallback=False`` reads no stored decision: it traces, and raises the error.

    def load_eager(self) -> list[tuple[int, list, str]]:
        """Note [Stored eager decisions]: (tree key, guards, why) of each signature whose
        compile failed in an earlier process, oldest first; a damaged entry is dropped with a
        warning (the next failure of that signature stores it again)."""
        from trident.ir.guards import Guard

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
            self._save_about()
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


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:  # deleted by another process meanwhile: the oldest
        return 0


def _digest(data: dict) -> str:
    """``Specialization.key`` of a stored specialization's JSON, as ``json.loads`` read it (1
    ms less per stored specialization than its objects' ``to_json``, on the CPU machine)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# Note [Stored text]: a specialization's key is the hash of its JSON with sorted keys
# (``Specialization.key``), and it is stored as that very text, so a load checks a file's name
# against the hash of the text it read (2 µs on the CPU machine) rather than against that of
# the text ``json.dumps`` makes again from what it parsed (70 µs of the ~230 µs a small
# specialization's load took). A file stored otherwise (by an older Trident) is checked the
# old way.

def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_ops(spec: Specialization) -> None:
    """Raise ``ValueError`` for a step calling an operator PyTorch's dispatcher lacks."""
    for step in spec.plan.steps:
        if isinstance(step, OpCall):
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
