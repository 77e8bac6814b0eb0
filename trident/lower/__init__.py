"""Lowering: from a call to a specialization. Capture (``make_fx`` with Trident's modes), the
state analysis, Torch-MLIR import, the plan and its passes, Triton kernels."""
