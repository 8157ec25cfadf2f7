// Persistent toy decode: the instances of the kernel body with the block exchange (one block
// per row, __syncthreads between stages). Built with persistent.cu (see its header).
#include "persistent_kernels.cuh"

namespace toyk {

// The seed's ultra-light shape with every weight in registers (the designs whose split keeps
// a thread's share of the weights within the register file at these thread counts).
using UltraLight = Fixed<64, 4, 256, 1>;

template <int T, bool C>
static KernelFn ultra_light(int design) {
    if (design == kWide) return toy_kernel<SplitWide, BlockX, T, UltraLight, false, C>;
    if (design == kWideFold) return toy_kernel<SplitWide, BlockX, T, UltraLight, true, C>;
    if constexpr (T == 512) {
        if (design == kFixed) return toy_kernel<SplitFixed, BlockX, T, UltraLight, false, C>;
    }
    return nullptr;
}

KernelFn pick_block(int design, int threads, bool clocked, bool regs, int H, int L, int V) {
    if (!regs) return dyn_kernel<BlockX>(design, threads, clocked);
    if (H != UltraLight::H || L != UltraLight::L || V != UltraLight::V) return nullptr;
    if (threads == 256) return clocked ? ultra_light<256, true>(design) : ultra_light<256, false>(design);
    if (threads == 512) return clocked ? ultra_light<512, true>(design) : ultra_light<512, false>(design);
    return nullptr;
}

}  // namespace toyk
