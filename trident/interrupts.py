"""Ctrl-C during a compile.

Note [Interrupted imports]: a first compile imports hundreds of modules (torch._dynamo,
Torch-MLIR, cffi's distutils). A ``KeyboardInterrupt`` raised inside one of those imports leaves
the package half-made: Python drops the package from ``sys.modules`` but keeps its submodules,
so importing it again makes a package without them as attributes (``module 'torch._dynamo' has
no attribute 'utils'``), and importing them again instead registers their operators twice
(``Only a single TORCH_LIBRARY can be used to register the namespace``). Neither repairs, so
every later compile in the process would fail. ``imports_uninterrupted`` holds a Ctrl-C that
arrives while an import runs until the compile ends, then raises it; anywhere else the compile
stops at once, which leaves nothing behind (nothing is installed or stored before it ends).
"""

from __future__ import annotations

import contextlib
import signal
import threading

_IMPORTLIB = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename in _IMPORTLIB:
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def imports_uninterrupted():
    """While active, SIGINT during an import raises ``KeyboardInterrupt`` when the block ends
    rather than inside the import (Note [Interrupted imports]); elsewhere it raises at once.

    Only in the main thread (where Python runs signal handlers) and only over Python's own
    SIGINT handler: a program that installed its own handler keeps it. Reentrant (the outer
    block holds the interrupt).
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    held = []

    def handler(signum, frame):
        if _importing(frame):
            held.append(signum)
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if held:
            raise KeyboardInterrupt
