"""Trident: compile PyTorch functions that call Triton kernels into native
Specialization Cache Modules.

    import trident

    @trident.jit
    def f(x, y):
        return torch.relu(x @ y + 1)
"""

from trident import config
from trident.frontend.backend import (explain as backend_explain, graphs as backend_graphs,
                                      stats as backend_stats)
from trident.frontend.cache import clear as clear_cache, list_entries as list_cache
from trident.errors import TridentError
from trident.frontend.jit import Stats, jit

__version__ = config.VERSION

__all__ = ["jit", "TridentError", "Stats", "clear_cache", "list_cache", "backend_stats",
           "backend_explain", "backend_graphs", "config", "__version__"]
