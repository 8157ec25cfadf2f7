// Persistent toy decode: the instances of the kernel body with the grid exchange (G blocks per
// row under a cooperative launch, the state through L2, grid.sync between stages). Built with
// persistent.cu (see its header).
#include "persistent_kernels.cuh"

namespace toyk {

KernelFn pick_grid(int design, int threads, bool clocked) {
    return dyn_kernel<GridX>(design, threads, clocked);
}

}  // namespace toyk
