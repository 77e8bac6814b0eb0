"""Trident's native runtime: the ``Dispatcher`` type and the ``trt_api`` services.

``runtime.cpp`` includes PyTorch's C++ headers, so it is compiled once per (torch, Python) pair
with ``torch.utils.cpp_extension.load`` (about 30 s on a 2-core machine) into the cache folder and
reused by every later process. Generated Specialization Cache Modules are plain C and only see
``trident_rt.h``.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import torch

from .. import config
from ..errors import ERROR_TYPES, TridentError

HERE = Path(__file__).resolve().parent
HEADER = HERE / "trident_rt.h"
SOURCE = HERE / "runtime.cpp"


def build_key() -> str:
    """Everything the runtime's binary depends on."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), HEADER.read_bytes(), torch.__version__.encode(),
                 sys.version.encode(), str(torch.compiled_with_cxx11_abi()).encode()):
        h.update(part)
    return h.hexdigest()[:16]


@functools.cache
def load():
    """Import the runtime extension, building it first if this cache has none for this torch."""
    from torch.utils import cpp_extension
    from filelock import FileLock

    build_dir = config.cache_dir() / "runtime" / build_key()
    build_dir.mkdir(parents=True, exist_ok=True)
    if not any(build_dir.glob("trident_rt*.so")):
        config.log.warning("trident: building the native runtime for torch %s into %s "
                           "(once per torch version, about 15 s)", torch.__version__, build_dir)
    with FileLock(str(build_dir / ".lock")):
        module = cpp_extension.load(
            name="trident_rt",
            sources=[str(SOURCE)],
            extra_include_paths=[str(HERE)],
            extra_cflags=["-O2", "-fvisibility=hidden"],
            build_directory=str(build_dir),
            verbose=False,
        )
    module.set_error_types(ERROR_TYPES)
    return module
