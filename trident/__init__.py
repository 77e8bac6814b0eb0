"""Trident: compile PyTorch functions that call Triton kernels into native
Specialization Cache Modules.

    import trident

    @trident.jit
    def f(x, y):
        return torch.relu(x @ y + 1)
"""

from . import config
from .backend import explain as backend_explain, graphs as backend_graphs, stats as backend_stats
from .cache import __version__, clear as clear_cache, list_entries as list_cache
from .errors import TridentError
from .jit import Stats, jit

__all__ = ["jit", "TridentError", "Stats", "clear_cache", "list_cache", "backend_stats",
           "backend_explain", "backend_graphs", "config", "__version__"]
