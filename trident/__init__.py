"""Trident: compile PyTorch functions that call Triton kernels into native
Specialization Cache Modules.

    import trident

    @trident.jit
    def f(x, y):
        return torch.relu(x @ y + 1)
"""

from trident import config
from trident.errors import TridentError

__version__ = config.VERSION

__all__ = ["jit", "TridentError", "Stats", "clear_cache", "list_cache", "backend_stats",
           "backend_explain", "backend_graphs", "config", "__version__"]

# Note [Listing without torch] (frontend/entries.py): the names that need torch are imported
# on first use, so ``python -m trident`` and its ``list`` and ``clear`` start without torch
_LAZY = {"jit": ("trident.frontend.jit", "jit"), "Stats": ("trident.frontend.jit", "Stats"),
         "clear_cache": ("trident.frontend.entries", "clear"),
         "list_cache": ("trident.frontend.entries", "list_entries"),
         "backend_stats": ("trident.frontend.backend", "stats"),
         "backend_explain": ("trident.frontend.backend", "explain"),
         "backend_graphs": ("trident.frontend.backend", "graphs")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'trident' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
