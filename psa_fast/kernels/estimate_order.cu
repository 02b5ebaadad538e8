// Stages 1 and 2 on the GPU in one launch, for one request's short orders: psa_estimate_mma's group scores and
// psa_order_runs' order, the same bits as the two launches. At Llama's one request the two stages cost ~10 µs for 8 MB
// of metadata and 16,384 scores, both latency-bound, and the scores make a round trip through global memory between
// them; here they stay in shared memory.
//
// A group is a cluster of R = ceil(Nmax / 256) CTAs (R <= 8), CTA `mine` owning run `mine` (blocks 256 mine ..
// 256 mine + 255, psa_order_runs' run). Each CTA's warps score its run's blocks (estimate_mma.cuh: 8 warps two tiles of
// 16 each, 16 warps one) into shared memory as psa_order_runs' words (orderable() of the score, 0xFFFFFFFF for sink and
// recent blocks), then warp 0 sorts the run (runs.cuh) and pushes it into every placing CTA of the cluster by st.async,
// counted on the receiver's mbarrier (armed at the start; no cluster barrier after the sort), and the CTA's threads
// place its run's blocks at their ranks among the R sorted runs, as psa_order_runs does (a block a thread). CTAs whose
// run holds none of the request's blocks (n = ceil(seq_len / S) of them) score nothing, send nothing and write -1s.
//
// PSA_EO_HEADS (H) orders per cluster: 1, the group's (its PSA_G heads' maximum, gqa="shared"); or PSA_G, one for
// each of the group's heads (gqa="per_head": each head its own order, the KV head's rows read once for all of them,
// as psa_estimate_mma's launch a KV head): H runs a CTA, sorted by warps 0 .. H - 1, every block placed H times (a
// thread's placements in several orders searched in lock-step, runs.cuh run_ranks).
//
//   q        [B, Hq, PSA_D]            as psa_estimate_mma's (PSA_QRAW: the caller's query times q_scale)
//   meta     [B, Hkv, Nmax, 2, PSA_D]  half (cuboid_mean: centre, radius; mean: mean, -)
//   scores   [B, Gn, Nmax] float out:  the group scores (H 1: max over the group's heads; H PSA_G: each head's own
//                                      estimate, Gn = Hq); -inf from n on
//   order    [B, Gn, Nmax] int out:    block indices in processing order; -1 past the group's n blocks
// Launch: grid (R, Hq / PSA_G, B), cluster (R, 1, 1) (PSA_CLUSTER = R), PSA_WARPS 8 or 16 warps; Nmax <= 256 R.
// PSA_L2_FIRST (common.cuh): the blocks placed among the decode's first ones have their K and V asked into L2.
// _kernels.estimate_order launches it where _kernels.fuses_estimate_order (ESTIMATE_ORDER: 16 warps by default).
#include "estimate_order.cuh"

extern "C" __global__ void __cluster_dims__(PSA_CLUSTER, 1, 1) __launch_bounds__(PSA_WARPS * 32)
psa_estimate_order(const q_in_t* __restrict__ q, const __half* __restrict__ meta, const int* __restrict__ seq_lens,
                   float* __restrict__ scores, int* __restrict__ order, int Hq, int Hkv, int Nmax, int sink_blocks,
                   int recent_blocks
#if PSA_QRAW
                   , float q_scale
#endif
                   PSA_L2_FIRST_PARAMS
#if PSA_EO_CLOCK
                   , long long* __restrict__ eo_clocks
#endif
                   ) {
#if !PSA_QRAW
    const float q_scale = 1.f;  // unused: the plan's query is scaled
#endif
    // each order's runs, each sorted descending, and this CTA's run by block index
    __shared__ __align__(16) unsigned int runs[PSA_H][PSA_CLUSTER][PSA_RUN];
    __shared__ __align__(16) unsigned int words[PSA_H][PSA_RUN];
    __shared__ __align__(8) unsigned long long bar;  // counts the runs pushed into `runs`
    estimate_order_cta(q, meta, seq_lens, scores, order, Hq, Hkv, Nmax, sink_blocks, recent_blocks, q_scale, runs,
                       words, bar PSA_L2_FIRST_ARGS
#if PSA_EO_CLOCK
                       , eo_clocks
#endif
    );
}
