"""Trident's exception types."""


class TridentError(RuntimeError):
    """Raised for input Trident cannot serve and cannot hand to eager PyTorch.

    The message names the argument or op and, where known, the user's source line
    (``file.py:LINE``). Errors raised by PyTorch ops inside a compiled launch sequence are
    re-raised as ``TridentError`` with the failing step's source line prepended; where PyTorch
    raises ``IndexError``, ``ValueError``, ``TypeError`` or ``NotImplementedError`` (c10's error
    subclasses, or a Python exception in an interpreted Triton launch), the error is also an
    instance of that class, so code written against eager PyTorch catches it.
    """


def transient(error: TridentError) -> TridentError:
    """``error``, marked as decided by this moment, not by the code and the call: an error of
    the environment (out of memory, the OS, the recursion limit, a build lock another process
    holds, a profiler), or one that user code raised in the trace (what made it raise is
    state). Note [Stored eager decisions] in frontend/cache.py: such a failure makes this call
    eager but is never stored for later processes."""
    error.transient = True
    return error


def with_article(noun: str) -> str:
    """``noun`` with its indefinite article, for messages: ``"an int"``, ``"a dict"``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def environmental(e: BaseException) -> bool:
    """Whether ``e`` is the machine's, not the code's: out of memory, the OS, the recursion
    limit (what ``transient`` marks a failure for)."""
    return isinstance(e, (MemoryError, OSError, RecursionError))


class TridentIndexError(TridentError, IndexError):
    """An op in the launch sequence raised ``IndexError`` (e.g. an index out of bounds)."""


class TridentValueError(TridentError, ValueError):
    """An op in the launch sequence raised ``ValueError``."""


class TridentTypeError(TridentError, TypeError):
    """An op in the launch sequence raised ``TypeError``."""


class TridentNotImplementedError(TridentError, NotImplementedError):
    """An op in the launch sequence raised ``NotImplementedError`` (e.g. a dtype it lacks)."""


class CompileForbidden(TridentError):
    """``TRIDENT_FORBID_COMPILE=1`` is set and a call would trace or build a module: what a
    warm restart must not do (Note [Compile stages] in config.py). Raised to the caller, never
    turned into an eager call."""


class EagerCall(Exception):
    """Internal: a step failed inside the function's ``try`` before anything the call did was
    visible, so the call runs eagerly (Note [Errors inside try] in source_lines.py). Never reaches
    the user: the dispatcher and the miss path run the call eagerly instead."""


# The class of each of the runtime's error kinds, by its name in trident_rt.h, whose values
# order them (runtime.error_types)
ERROR_TYPES = {"TRT_ERR_GENERIC": TridentError, "TRT_ERR_INDEX": TridentIndexError,
               "TRT_ERR_VALUE": TridentValueError, "TRT_ERR_TYPE": TridentTypeError,
               "TRT_ERR_NOT_IMPLEMENTED": TridentNotImplementedError, "TRT_ERR_EAGER": EagerCall}
