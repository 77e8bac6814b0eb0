"""Trident's native runtime: the ``Dispatcher`` type and the ``trt_api`` services.

``runtime.cpp`` and its parts (the files it includes, one job each) include PyTorch's C++
headers, so the runtime is compiled once per (torch, Python) pair with
``torch.utils.cpp_extension.load`` into the cache folder and reused by every later process.
Generated Specialization Cache Modules are plain C and only see ``trident_rt.h``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path

import torch

from .. import config
from trident.errors import ERROR_TYPES, TridentError, transient

HERE = Path(__file__).resolve().parent
HEADER = HERE / "trident_rt.h"
# One translation unit: runtime.cpp includes its parts (shim.cpp, dispatcher.cpp, ...), and only
# it is compiled. Most parts need PyTorch's C++ headers, and parsing them is most of a
# translation unit's compile time: compiled separately, every part would parse them again
# (docs/benchmarks.md has the cold builds of both).
SOURCE = HERE / "runtime.cpp"
# The ABI headers whose constants Python reads (_abi_constants): trident_trees.h holds the codes
# of argument trees, state trees and output recipes (ir/trees.py and lower/state/tree.py read them here).
ABI_HEADERS = (HEADER, HERE / "trident_cuda.h", HERE / "trident_trees.h")


def _abi_constants() -> dict[str, int]:
    """The ABI's integer constants (``#define TRT_X 4096`` and enumerators written
    ``TRT_X = 1``) of trident_rt.h, trident_cuda.h and trident_trees.h: the one place they are
    defined; Python reads them from here instead of repeating their values."""
    out: dict[str, int] = {}
    for header in ABI_HEADERS:
        text = header.read_text()
        out.update((m[0], int(m[1])) for m in re.findall(r"^#define (TRT_\w+) (-?\d+)\b", text,
                                                          re.MULTILINE))
        out.update((m[0], int(m[1])) for m in re.findall(r"\b(TRT_\w+) = (-?\d+)\b", text))
    return out


ABI = _abi_constants()


def error_types() -> tuple[type, ...]:
    """``errors.ERROR_TYPES``' classes in the order of trident_rt.h's ``TRT_ERR_`` kinds, which
    the runtime indexes by kind (``set_error_types``).

    Raises:
        TridentError: the header's kinds and ``ERROR_TYPES``' names differ, or the kinds are not
            0 to ``TRT_ERR_KINDS - 1``.
    """
    kinds = {name: value for name, value in ABI.items()
             if name.startswith("TRT_ERR_") and name != "TRT_ERR_KINDS"}
    if set(kinds) != set(ERROR_TYPES) or sorted(kinds.values()) != list(
            range(ABI["TRT_ERR_KINDS"])):
        raise TridentError(f"the error kinds of {HEADER.name} ({kinds}) and trident/errors.py's "
                           f"ERROR_TYPES ({sorted(ERROR_TYPES)}) disagree")
    return tuple(ERROR_TYPES[name] for name in sorted(kinds, key=kinds.__getitem__))


def sources() -> list[Path]:
    """The runtime's own files that its build reads: ``SOURCE`` and every file of this folder it
    includes (``#include "name"``), directly or through another, in the order first included."""
    found = [SOURCE]
    for path in found:  # grows as it goes
        for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', path.read_text(), re.MULTILINE):
            included = HERE / name
            if included.is_file() and included not in found:
                found.append(included)
    return found


def build_key() -> str:
    """Everything the runtime's binary depends on."""
    h = hashlib.sha256()
    for path in sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in (torch.__version__.encode(), sys.version.encode(),
                 str(torch.compiled_with_cxx11_abi()).encode()):
        h.update(part)
    return h.hexdigest()[:16]


@functools.cache
def load():
    """Import the runtime extension, building it first if this cache has no intact build for
    this torch.

    Note [Runtime integrity]: ``cpp_extension`` links straight into ``trident_rt.so``, so an
    interrupted link or a full disk leaves a truncated library that ninja then calls up to date,
    and ``dlopen`` of a truncated library dies of SIGBUS. The library's SHA-256 is written beside
    it after a build and checked before every load: an intact build is imported without
    writing anything (a read-only cache works), anything else is built again.

    Raises:
        TridentError: the runtime cannot be built (no compiler, a read-only or full cache
            folder) or loaded.
    """
    build_dir = Path(os.environ.get("TRIDENT_CACHE_DIR") or "<the cache folder>") / "runtime"
    try:  # (a cache folder that cannot be made, a file where it belongs: OSError)
        build_dir = config.cache_dir() / "runtime" / build_key()
        module = _load_intact(build_dir) or _build(build_dir)
    except TimeoutError as e:  # filelock's Timeout: another process holds the build lock
        raise transient(TridentError(
            f"the native runtime for torch {torch.__version__} is not built in "
            f"{build_dir}, and another process has held its lock for over "
            f"{config.lock_timeout():g} s (TRIDENT_LOCK_TIMEOUT)")) from e
    except (OSError, ImportError, RuntimeError) as e:  # cpp_extension: RuntimeError
        raise TridentError(f"the native runtime for torch {torch.__version__} cannot be built "
                           f"or loaded in {build_dir}: {type(e).__name__}: {e}") from e
    module.set_error_types(error_types())
    return module


def built() -> bool:
    """Whether this cache holds an intact build of the runtime for this torch (Note [Runtime
    integrity]), which ``load()`` imports without building; False where it would build.
    Raises nothing (a cache folder that cannot be read: False)."""
    try:
        return _intact(config.cache_dir() / "runtime" / build_key())
    except OSError:
        return False


@functools.cache
def operators():
    """The runtime's ``trident::`` operators (operators.cpp), with their fake kernels for traces:
    the random state steps (Note [Random state steps] in trident/lower/rng.py) and the bool results of
    ``equal`` and ``allclose`` as 0-dim bool tensors (Note [Bool results] in source_lines.py).
    Returns ``torch.ops.trident``."""
    load()
    states: dict[str, int] = {}  # device type -> bytes of its generators' state

    def get_rng_state(device):
        if device.type not in states:
            gen = torch.default_generator if device.type == "cpu" else \
                torch.cuda.default_generators[0]
            states[device.type] = gen.get_state().numel()
        return torch.empty(states[device.type], dtype=torch.uint8)

    def bool_result(self, other, *args):
        return torch.empty((), dtype=torch.bool)

    fake = torch.library.register_fake
    fake("trident::manual_seed")(lambda seed, device=None: None)
    fake("trident::get_rng_state")(get_rng_state)
    fake("trident::set_rng_state")(lambda state, device: None)
    fake("trident::equal")(bool_result)
    fake("trident::allclose")(bool_result)
    return torch.ops.trident


_LIBRARY = "trident_rt.so"  # cpp_extension's name for the extension "trident_rt"


def _intact(build_dir: Path) -> bool:
    try:
        with open(build_dir / _LIBRARY, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        return (build_dir / "trident_rt.sha256").read_text() == digest
    except OSError:
        return False


def _load_intact(build_dir: Path):
    if not _intact(build_dir):
        return None
    spec = importlib.util.spec_from_file_location("trident_rt", build_dir / _LIBRARY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["trident_rt"] = module
    return module


def _build(build_dir: Path):
    from filelock import FileLock
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(build_dir / ".lock"), timeout=config.lock_timeout()):
        if _intact(build_dir):  # another process built it meanwhile
            return _load_intact(build_dir)
        if (build_dir / _LIBRARY).exists():
            warnings.warn(f"trident: the native runtime in {build_dir} is damaged or unchecked; "
                          "building it again", stacklevel=5)
        else:
            config.log.warning("trident: building the native runtime for torch %s into %s "
                               "(once per torch version and Python)", torch.__version__,
                               build_dir)
        for name in (_LIBRARY, "runtime.o"):  # ninja would find a damaged output up to date
            (build_dir / name).unlink(missing_ok=True)
        module = cpp_extension.load(
            name="trident_rt",
            sources=[str(SOURCE)],
            extra_include_paths=[str(HERE)],
            extra_cflags=["-O2", "-fvisibility=hidden"],
            build_directory=str(build_dir),
            verbose=False,
        )
        with open(build_dir / _LIBRARY, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        tmp = build_dir / f"trident_rt.sha256.{os.getpid()}"
        tmp.write_text(digest)
        os.replace(tmp, build_dir / "trident_rt.sha256")
    return module
