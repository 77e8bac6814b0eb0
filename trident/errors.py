"""Trident's one exception type."""


class TridentError(RuntimeError):
    """Raised for input Trident cannot serve and cannot hand to eager PyTorch.

    The message names the argument or op and, where known, the user's source line
    (``file.py:LINE``). Errors raised by PyTorch ops inside a compiled launch sequence are
    re-raised as ``TridentError`` with the failing step's source line prepended.
    """
