"""The front end: ``trident.jit`` (jit.py; the miss policy, policy.py; tracing a call,
tracing.py; installing specializations, install.py; CUDA graphs, graphs.py), ``torch.compile``'s
``trident`` backend, and the on-disk cache."""
