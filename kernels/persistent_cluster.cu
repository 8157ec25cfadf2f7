// Persistent toy decode: the instances of the kernel body with the cluster exchange (G blocks
// of one thread-block cluster, sm_90: stores into the peers' shared memory, cluster.sync
// between stages). Compiled for every architecture; on older GPUs the planner refuses it and
// the cluster primitives compile as traps. Built with persistent.cu (see its header).
#include "persistent_kernels.cuh"

namespace toyk {

// The seed's h256 shape over a cluster of 16 blocks, every weight in registers.
using H256 = Fixed<256, 4, 256, 16>;

template <bool C>
static KernelFn h256(int design) {
    if (design == kWide) return toy_kernel<SplitWide, ClusterX, 256, H256, false, C>;
    if (design == kWideFold) return toy_kernel<SplitWide, ClusterX, 256, H256, true, C>;
    return nullptr;
}

KernelFn pick_cluster(int design, int threads, bool clocked, bool regs, int H, int L, int V, int G) {
    if (!regs) return dyn_kernel<ClusterX>(design, threads, clocked);
    if (H != H256::H || L != H256::L || V != H256::V || G != H256::G || threads != 256) return nullptr;
    return clocked ? h256<true>(design) : h256<false>(design);
}

}  // namespace toyk
