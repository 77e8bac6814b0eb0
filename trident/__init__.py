"""Trident: compile PyTorch functions that call Triton kernels into native
Specialization Cache Modules.

    import trident

    @trident.jit
    def f(x, y):
        return torch.relu(x @ y + 1)
"""

from .cache import __version__, clear as clear_cache, list_entries as list_cache
from .errors import TridentError
from .jit import Stats, jit

__all__ = ["jit", "TridentError", "Stats", "clear_cache", "list_cache", "__version__"]
