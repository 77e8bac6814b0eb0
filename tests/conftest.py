"""Shared setup for Trident's tests.

Cache layout during a test session:

* one session cache folder holds the native runtime (``runtime/<key>``), which costs ~15 s to
  build; it is built once, in the background while the tests are collected;
* every test gets a fresh ``TRIDENT_CACHE_DIR`` (``<tmp_path>/trident-cache``) whose ``runtime``
  entry is a symlink to the session's runtime folder, so functions (``functions/...``) never
  leak from one test into another, while the runtime is shared, also by the subprocesses that
  test_cache.py starts.

Set ``TRIDENT_TEST_RUNTIME_CACHE=/some/dir`` to keep the session cache (and its runtime build)
between pytest runs; without it, a runtime the user's own cache already holds (the demo built it)
is linked into the session folder rather than built again (``reuse_users_runtime``). Under pytest-xdist (``-n 2``) the workers share the session folder that
the controller made.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also under --import-mode=importlib
from _trident_helpers import REPO, _SESSION, make_cache_dir, session_cache_root  # noqa: E402

if str(REPO) not in sys.path:  # benchmarks/ (test_bench.py), outside the installed package
    sys.path.append(str(REPO))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    keep = os.environ.get("TRIDENT_TEST_RUNTIME_CACHE")
    if keep:
        root = Path(keep)
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="trident-test-session-"))
        _SESSION["owned"] = True
        reuse_users_runtime(root)
        # pytest-xdist's workers (started after this, with this environment) share it
        os.environ["TRIDENT_TEST_RUNTIME_CACHE"] = str(root)
    _SESSION["root"] = root
    # Before collection: a test module that applies @trident.jit at import time builds the
    # runtime here, never in the user's ~/.cache/trident.
    os.environ["TRIDENT_CACHE_DIR"] = str(root)
    os.environ.pop("TRIDENT_MAX_SPECIALIZATIONS", None)
    if not hasattr(config, "workerinput") and not (root / "runtime").exists():
        _SESSION["builder"] = _build_runtime_meanwhile(root)


def reuse_users_runtime(root: Path) -> Path | None:
    """Link the runtime that the user's cache (``TRIDENT_CACHE_DIR`` or the platform's) already
    holds for this torch and these sources into the session folder ``root``, rather than build
    it again (1-15 min on a loaded 2-core machine; a fresh user's first test files rebuilt what
    the demo had built). Tests only load it: an intact build is imported without writing
    (Note [Runtime integrity] in trident/runtime/__init__.py). Returns the linked folder, or
    None where the user's cache holds no intact build."""
    import platformdirs

    from trident import runtime

    users = Path(os.environ.get("TRIDENT_CACHE_DIR") or platformdirs.user_cache_dir("trident"))
    build = users / "runtime" / runtime.build_key()
    if not runtime._intact(build):
        return None
    (root / "runtime").mkdir(exist_ok=True)
    (root / "runtime" / build.name).symlink_to(build.resolve(), target_is_directory=True)
    return build


def _build_runtime_meanwhile(root: Path) -> subprocess.Popen:
    """Start building the native runtime (15-30 s on one core) into the session folder while
    the tests are collected (pytest-xdist's workers import torch, transformers and OpInfo's
    database meanwhile); the first ``runtime.load()`` of a test waits for it on its file lock,
    and builds it itself if this build failed."""
    spec = importlib.util.find_spec("trident")  # the trident the tests import
    path = [str(Path(spec.origin).parents[1])] if spec and spec.origin else []
    env = dict(os.environ, TRIDENT_CACHE_DIR=str(root), PYTHONPATH=os.pathsep.join(
        path + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    return subprocess.Popen([sys.executable, "-c", "from trident import runtime; runtime.load()"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pytest_unconfigure(config):
    builder = _SESSION.pop("builder", None)
    if builder is not None:
        if builder.poll() is None:  # the session ended before the build did (an interrupt)
            builder.terminate()
        builder.wait()
    if _SESSION["owned"] and _SESSION["root"] is not None:
        shutil.rmtree(_SESSION["root"], ignore_errors=True)


# Files of the longest tests (25-95 s each on the 2-core machine: hypothesis examples, OpInfo,
# two ranks), run first so that pytest-xdist's workers share out the short ones at the end and
# finish together; each file stays in one piece (module-scoped fixtures run once per worker).
_FIRST = ("test_property.py", "test_opinfo.py", "test_collectives.py")


@pytest.hookimpl(tryfirst=True)  # before `-m`'s selection
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in _FIRST)  # stable: the order otherwise
    for item in items:  # `-m gpu` selects every CUDA test, those under a CUDA skipif too
        if any(word in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")
               for word in ("CUDA", "GPU")):
            item.add_marker(pytest.mark.gpu)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def trident_runtime():
    """Build (or load) the native runtime once, into the session cache folder."""
    root = session_cache_root()
    saved = os.environ.get("TRIDENT_CACHE_DIR")
    os.environ["TRIDENT_CACHE_DIR"] = str(root)
    try:
        from trident import runtime
        from trident.frontend.jit import jit_function_class

        module = runtime.load()
        jit_function_class()
    finally:
        if saved is None:
            os.environ.pop("TRIDENT_CACHE_DIR", None)
        else:
            os.environ["TRIDENT_CACHE_DIR"] = saved
    assert (root / "runtime").is_dir()
    return module


@pytest.fixture(autouse=True)
def trident_cache(trident_runtime, tmp_path, monkeypatch):
    """Per test: a fresh TRIDENT_CACHE_DIR (functions area) sharing the session runtime."""
    directory = make_cache_dir(tmp_path / "trident-cache")
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(directory))
    monkeypatch.delenv("TRIDENT_MAX_SPECIALIZATIONS", raising=False)
    return directory


@pytest.fixture
def subprocess_env(trident_cache):
    """Environment for a child Python that imports this checkout's trident and uses the
    test's cache folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TRIDENT_CACHE_DIR"] = str(trident_cache)
    env.pop("TRIDENT_LOGS", None)
    env.pop("TRIDENT_MAX_SPECIALIZATIONS", None)
    return env
