"""Triton kernels of the paged model: fused element-wise ops, paged decode attention, GEMV."""
