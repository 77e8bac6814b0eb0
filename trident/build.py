"""Build: compile an SCM's C source with cffi into an extension module in the cache.

The module's name carries a hash of everything that affects the binary (Note [Build key]), so a
name is built once: a process takes a file lock (``filelock``), checks again, compiles in a
private temporary folder and moves the result into place with ``os.replace`` (atomic on POSIX),
then writes the file's SHA-256 next to it. A process that finds the file, and the file matches
its SHA-256, loads it without compiling; a truncated or damaged file (which ``dlopen`` could
crash on) is built again.

Note [Incremental modules]: each specialization is a module of its own (codegen.render), and a
function's dispatcher holds the installed modules in guard order (``_install`` in dispatcher.cpp)
and tries them one after another. So a miss compiles only the new specialization's C, and the
Nth compile of a function costs what the first did (a module of all specializations, built
again at every miss, grew with their number). A module's name hashes its
source, so two functions with the same specialization share its module in a process, and a
function whose specialization was built before (by an earlier compile or process) finds it.
Triton cubins are not in the source: the module holds each one's size and SHA-256, and the
bytes, stored with the specialization, are handed over at install (``scm_set_cubin``).

Note [Parallel C build]
~~~~~~~~~~~~~~~~~~~~~~~
A model's specialization is thousands of steps, and one C file of them is one compiler process:
one core, however many the machine has (Qwen2.5-0.5B's two specializations on an H100 host:
18.6 s of a 30.7 s first ``generate``, one ``gcc`` at a time). So codegen writes a module as
several translation units (``codegen.Rendered.sources``): the main one (the tables, ``run()``,
``guard()``, the entry points, and cffi's wrappers around them), the guards in parts of
``codegen.units.GUARD_PART_CHECKS`` checks (each built at -O1: Note [Optimized guards] in
trident_rt.h; ``guard()`` calls them in guard order), and the launch sequence in parts of
``codegen.units.PART_STEPS`` steps, each a function over one frame of values (``trt_frame``: the
arrays ``v``, ``l``, ``s``, ``w`` that ``run()`` held) that returns to ``run()``'s shared error
path. ``_compile`` compiles the parts to objects in a pool of compiler processes, one per core
this process may run on (``os.sched_getaffinity``), with the compiler, flags and include
folders that cffi's own build (setuptools' ``build_ext``) uses, then cffi compiles the main unit
and links it with them (``extra_objects``). What units share is ``TRT_SHARED`` (hidden: not
exported, reached without the GOT), so a hit runs the code it ran as one unit, a call per
part more, and at -O0 a load of an array's address where a step reads a value (0.2-0.4 ns
a step). The layout is the specialization's alone, not the machine's: one module name everywhere
(Note [Build key] hashes every unit, and where each ends). GCC's time at -O0 grows about
linearly with a unit's length: ``run()`` split into functions in one unit took 9-12% less of
its time, and each unit's headers cost a few hundredths of a second; the cores do the rest
(docs/benchmarks.md, "Parallel C build (issue 27, branch build38)").
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Sequence

import cffi
from filelock import FileLock, Timeout

from trident import config
from trident.errors import TridentError, transient
from trident.runtime import HEADER

# The symbols every SCM exports (see templates/scm.c.jinja).
CDEF = """
int scm_init(uintptr_t api);
int scm_set_callback(int slot, int64_t id);
uintptr_t scm_call_address(void);
uintptr_t scm_match_address(void);
int scm_set_cubin(int index, const char* data, size_t size);
"""
# -O0: an SCM is straight-line calls into the runtime, which optimization makes no faster, and
# GCC's time at -Og and above grows faster than a function's length (docs/benchmarks.md, "Facts
# moved out of code comments").
CFLAGS = ["-O0", "-g0", "-fno-strict-aliasing", "-Wno-unused-label", "-Wno-unused-variable",
          "-Wno-unused-but-set-variable"]

_log = config.logger("cache")


def module_name(sources: str | Sequence[str]) -> str:
    """Note [Build key]: the C sources (every translation unit: Note [Parallel C build]), the
    runtime ABI header, the flags, cffi and Python."""
    h = hashlib.sha256()
    for source in _units(sources):
        h.update(f"{len(source)}:".encode())  # where one unit ends and the next begins
        h.update(source.encode())
    for part in (HEADER.read_text(), (HEADER.parent / "trident_cuda.h").read_text(),
                 (HEADER.parent / "trident_views.h").read_text(),
                 (HEADER.parent / "trident_steps.h").read_text(),
                 " ".join(CFLAGS), cffi.__version__, sys.version):
        h.update(part.encode())
    return f"trident_scm_{h.hexdigest()[:20]}"


def build(sources: str | Sequence[str], directory: Path) -> ModuleType:
    """Compile (or find) and import the SCM of ``sources`` in ``directory``: its translation
    units, the main one first (``codegen.Rendered.sources``), or one C source.

    Raises:
        TridentError: the C compiler or the file system failed.
    """
    source = _units(sources)
    name = module_name(source)
    target = directory / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    digest = directory / f"{name}.sha256"
    lock = FileLock(str(directory / f"{name}.lock"), timeout=config.lock_timeout())
    try:
        if not _intact(target, digest):
            directory.mkdir(parents=True, exist_ok=True)
            with lock:
                if not _intact(target, digest):
                    _compile(name, source, directory, target, digest)
        elif name not in sys.modules:
            _log.info("loading %s (built before)", target)
        try:
            module = _load(name, target)
        except ImportError:  # pruned by another process after _intact: build it again
            with lock:
                _compile(name, source, directory, target, digest)
            module = _load(name, target)
        return module
    except Timeout as e:
        raise transient(TridentError(
            f"another process has held {lock.lock_file} for over {lock.timeout:g} s "
            f"(TRIDENT_LOCK_TIMEOUT) while {name} is not built")) from e
    except (OSError, ImportError, cffi.VerificationError) as e:
        raise transient(TridentError(f"building {name} in {directory} failed: {e}")) from e


def load_built(name: str, directory: Path) -> ModuleType | None:
    """The module ``name`` of ``directory``, built before (Note [Stored module names] in
    frontend/modules.py), loaded where its file is intact; None where it is not there, is
    damaged, or does not load (``build`` then builds it again from its sources)."""
    if not re.fullmatch(r"trident_scm_[0-9a-f]{20}", name):
        return None
    target = directory / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not _intact(target, directory / f"{name}.sha256"):  # (as ``build`` checks, loaded or
        return None  # not: a file gone is built again)
    try:
        return _load(name, target)
    except (OSError, ImportError):  # pruned by another process after _intact
        return None


def prune(directory: Path, keep: set[str], before_ns: int) -> list[str]:
    """Note [Pruning]: delete the modules of ``directory`` built before ``before_ns`` that are
    not in ``keep``; returns their names.

    A function's folder gets a module per specialization (Note [Incremental modules]), and
    only those of the stored specializations are ever loaded again (the cache keeps the newest
    specializations: ``FunctionCache.save_spec``). Pruning runs after a new specialization
    is stored (``before_ns``: when its module was built), under the folder's ``prune.lock``,
    and deletes a module only while holding its build lock (a module being built is never
    deleted). Modules built after ``before_ns``
    are another process's newer work. A process that loaded a module keeps its mapping when the
    file is deleted; one that is about to load it builds it again (``build``). Failures are
    ignored: pruning only saves disk space.
    """
    deleted = []
    try:
        with FileLock(str(directory / "prune.lock"), timeout=0):
            modules = {p.name.split(".")[0] for p in directory.glob("trident_scm_*")}
            for name in sorted(modules - keep):
                files = [p for p in directory.glob(f"{name}.*") if p.is_file()]
                if any(p.stat().st_mtime_ns >= before_ns for p in files):
                    continue
                lock = directory / f"{name}.lock"
                try:
                    with FileLock(str(lock), timeout=0):
                        for p in files:
                            if p != lock:
                                p.unlink(missing_ok=True)
                        lock.unlink(missing_ok=True)
                except Timeout:  # being built by another process
                    continue
                deleted.append(name)
    except (OSError, Timeout):  # another process prunes; a read-only folder
        pass
    if deleted:
        _log.info("pruned %d superseded modules from %s", len(deleted), directory)
    return deleted


def _units(sources: str | Sequence[str]) -> tuple[str, ...]:
    return (sources,) if isinstance(sources, str) else tuple(sources)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _intact(target: Path, digest: Path) -> bool:
    try:
        return digest.read_text() == _sha256(target)
    except OSError:
        return False


def _compile(name: str, sources: tuple[str, ...], directory: Path, target: Path,
             digest: Path) -> None:
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=directory))
    try:
        include_dirs = [str(HEADER.parent), _cuda_include()]
        files = [tmp / f"{name}.{i}.c" for i in range(1, len(sources))]
        for path, text in zip(files, sources[1:]):
            path.write_text(text)
        # (the stage outside the compiler's output: Note [Progress] logs its end)
        with config.stage("C build"), _compiler_output(name) as output:  # Note [Compile stages]
            try:
                objects = _compile_units(files, tmp, include_dirs)
                ffi = cffi.FFI()
                ffi.cdef(CDEF)
                ffi.set_source(name, sources[0], include_dirs=include_dirs,
                               extra_compile_args=CFLAGS, libraries=["dl"],
                               extra_objects=objects)
                built = ffi.compile(tmpdir=str(tmp), verbose=False)
            except cffi.VerificationError as e:  # the compiler's own words say why
                raise cffi.VerificationError(f"{e}\n{output()}") from e
        (directory / f"{name}.c").write_text(sources[0])
        for path in files:
            shutil.copyfile(path, directory / path.name)
        (tmp / "sha256").write_text(_sha256(Path(built)))
        os.replace(built, target)
        os.replace(tmp / "sha256", digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log.info("built %s in %.2f s", target, time.perf_counter() - start)


def _compile_units(files: list[Path], tmp: Path, include_dirs: list[str]) -> list[str]:
    """Note [Parallel C build]: ``files`` compiled to objects in ``tmp``, as many at a time as
    this process has cores, by the compiler cffi's build runs (setuptools' ``build_ext``: the
    ``CC``, ``CFLAGS`` and ``-fPIC`` that Python was built with, then ``CFLAGS``).

    Raises:
        cffi.VerificationError: a file does not compile."""
    importlib.import_module("setuptools")  # its distutils: the one cffi's build runs
    from distutils import ccompiler, errors, sysconfig as dist_sysconfig

    def one(path: Path) -> str:
        compiler = ccompiler.new_compiler()
        dist_sysconfig.customize_compiler(compiler)
        try:
            (obj,) = compiler.compile([str(path)], output_dir=str(tmp),
                                      include_dirs=include_dirs, extra_postargs=CFLAGS)
        except errors.CompileError as e:
            raise cffi.VerificationError(f"CompileError: {e}") from e
        return str(Path(tmp) / obj) if not os.path.isabs(obj) else obj

    if not files:
        return []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    jobs = min(len(files), cores or 1)
    with concurrent.futures.ThreadPoolExecutor(jobs, thread_name_prefix="trident-cc") as pool:
        return list(pool.map(one, files))


@contextlib.contextmanager
def _compiler_output(name: str):
    """The C compiler's output (its warnings), which it writes to the process's file
    descriptors 1 and 2, goes to the ``cache`` log (``TRIDENT_LOGS=cache``) instead of the
    user's terminal; yields a function that returns it so far. Builds run one at a time in a
    process (policy.py's compile lock); another thread's output in that window is logged too."""
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]

        def text() -> str:
            sink.seek(0)
            return sink.read().decode(errors="replace")

        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield text
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if text().strip():
                _log.info("C compiler output for %s:\n%s", name, text().rstrip())


def _cuda_include() -> str:
    """``cuda.h`` as Triton ships it (triton/backends/nvidia/include), for Triton launches."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "include")


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module
