"""The front end: ``trident.jit`` (the miss policy, installing specializations, CUDA graphs),
``torch.compile``'s ``trident`` backend, and the on-disk cache."""
