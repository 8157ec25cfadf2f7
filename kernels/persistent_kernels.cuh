// Persistent toy decode: the compiled instances of the kernel body, one picker per state
// exchange, each defined in its own translation unit (persistent_block.cu, persistent_grid.cu,
// persistent_cluster.cu) so the instances compile in parallel.
#pragma once
#include "persistent_body.cuh"

namespace toyk {
using KernelFn = void (*)(ToyArgs, Layout);

// The kernel for a design and thread count with run-time shapes; with `regs`, the instance
// that holds the weights of the shape (H, L, V, G) in registers, or nullptr if none is compiled.
KernelFn pick_block(int design, int threads, bool clocked, bool regs, int H, int L, int V);
KernelFn pick_grid(int design, int threads, bool clocked);
KernelFn pick_cluster(int design, int threads, bool clocked, bool regs, int H, int L, int V, int G);

// Instances with run-time shapes, by design, for one exchange and thread count.
template <class X, int T, bool C>
KernelFn dyn_kernel(int design) {
    switch (design) {
        case kFixed: return toy_kernel<SplitFixed, X, T, Dyn, false, C>;
        case kWide: return toy_kernel<SplitWide, X, T, Dyn, false, C>;
        case kNarrow: return toy_kernel<SplitNarrow, X, T, Dyn, false, C>;
        case kWideFold: return toy_kernel<SplitWide, X, T, Dyn, true, C>;
        case kNarrowFold: return toy_kernel<SplitNarrow, X, T, Dyn, true, C>;
        default: return nullptr;
    }
}
template <class X>
KernelFn dyn_kernel(int design, int threads, bool clocked) {
    if (threads == 256) return clocked ? dyn_kernel<X, 256, true>(design) : dyn_kernel<X, 256, false>(design);
    if (threads == 512) return clocked ? dyn_kernel<X, 512, true>(design) : dyn_kernel<X, 512, false>(design);
    return nullptr;
}

}  // namespace toyk
