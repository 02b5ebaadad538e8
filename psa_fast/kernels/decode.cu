// Stage 3 on the GPU: progressive sparse attention of one decode step (Algorithm 1), with the
// verifier on the device. The same kernel runs top-k (one chunk of k blocks) and dense attention
// (identity order, one chunk of every block). Version 3 (tensor cores); versions 1 and 2 are kept
// beside it for the benchmark, and benchmarks/NOTES.md says why each was replaced.
//
// Work split: a selection group (request b, group g: one KV head's query heads, or one query
// head for gqa="per_head") is handled by PSA_CLUSTER CTAs of PSA_WARPS warps. The group's
// NW = PSA_CLUSTER * PSA_WARPS warps share each chunk's blocks round-robin; a warp attends one block (K and V:
// 2 * S * D halves, 8 KiB at S = 16, D = 128) at a time, or two of the same chunk at once where it has two
// (PSA_PAIR, below: one request's loop is bound by each warp's chain of dependent instructions, which a pair halves).
//
// Arithmetic: version 2 spent ~1200 instructions per block on CUDA-core dot products and
// shuffles and could not keep up with memory. Here both products run on the tensor cores with
// mma.sync m16n8k16 (inputs of the KV's type, float16 or bfloat16; f32 accumulation), transposed so
// that no MMA row is padding: S^T = K Q^T with a block's 16 tokens as the M rows and the group's <= 8
// query heads as the N columns, then O^T += V^T P^T with 16 channels as the rows, P^T's fragments made
// from S^T's accumulator registers by an in-register 8 x 8 transpose (movmatrix). (Until 2026-12-01
// the heads were the M rows, 8 of 16 used: twice the MMAs, and spills at D = 256; benchmarks/NOTES.md.)
// P (and Q unless it is a query of the KV's type scaled by a power of two,
// the rest of the scale applied to the logits) are not numbers of that type, so each is split into
// parts, x = hi + lo (+ lo2) with hi = f16(x), lo = f16(x - hi), ..., and multiplied once per part:
// K and V are exact, so the products keep about 22 bits (float16, two parts) or 24 (bfloat16, three
// parts for P; PSA_QPARTS for Q: 1 for a query of the KV's type, else 2 in float16, 3 in bfloat16),
// as float32 arithmetic would. Each k-step's products go into a fresh accumulator
// that is then added in float32: the tensor cores truncate what they add to the accumulator's
// last place, and a running sum of logit size would cost bits (the tests hold the output to
// twice a naive float32 attention's error; benchmarks/NOTES.md has the measurements).
//
// Memory pipeline: the chunk boundaries are known in advance (forced blocks, then `step` at a
// time), so each warp knows the whole sequence of blocks it will attend if the loop does not
// stop. It keeps PSA_STAGES - 1 of them in flight in a private ring of shared-memory stages
// filled by cp.async, across chunk boundaries: while the cluster runs the verifier between two
// chunks, the next chunk's blocks are already loading. If the loop stops, at most PSA_STAGES - 1
// prefetched blocks per warp go unused. The 16-byte chunks of each row are stored XOR-swizzled by
// the row index so that ldmatrix reads are free of bank conflicts.
//
// Verifier: per iteration only four scalars per query head cross warps and CTAs (the chunk's
// largest logit, its mass and moving-average terms relative to that, its lightest block's
// log-mass); stop = sketch also reads its window's block masses back from global memory. Warp 0 of each CTA
// combines its warps' scalars; after one cluster barrier every warp reads the CTAs' totals through
// distributed shared memory (one round trip) and combines them in rank order, so every warp holds
// bit-identical verifier state and reaches the same decision with no further barrier; the loop
// stops at the first chunk boundary where the rule holds. Nothing is computed for chunks after the
// stop and the host never waits.
//
//   q          [B, Hq, D]  float, zero-padded to PSA_D (a multiple of 16), scaled so that q * qk_scale
//              has the logit scale (the host scales by a power of two: a float16 query stays exact); with
//              PSA_QRAW the caller's query (float16, bfloat16 bits or float32, head dim PSA_D), times q_mul here
//   k_pool     [slots, S, D] kv_t (half or bfloat16);  v_pool likewise
//   block_table[B, Hkv, Nmax] int: slot of each block
//   seq_lens   [B] int
//   order      [B, Gn, Nmax] int (psa_order), or null for the identity order (dense)
//   log_suffix [B, Hq, Nmax + 1] float (stop = certified: of the min/max bounds; stop = sketch: of the
//              per-head estimates), log sum_{i' >= i} n_j exp(x_j) along the order (psa_order)
//   out        [B, Hq, D] float out;  num_used, iterations, reason [B, Gn] int out;
//   mass_est   [B, Hq] float out: the rule's estimated attended fraction when the loop ended
//   ordered    [B, Hq, Nmax] float (stop = sketch): each head's log sketch mass log n_j + s_j of the block at
//              each position of the order (psa_order_suffix)
//   lmass      [B, Hq, Nmax] float scratch (stop = sketch): log of each attended block's true mass, by
//              position in the order, written by the warp that attends it and read by the verifier
//   first_len  [B, Gn] int or null: the ranked blocks of each group's first ranked chunk (first_chunk given or
//              "predicted"); with PSA_FIRST_PREV (first_chunk="previous") the previous call's num_used (the plan
//              passes num_used itself), one step short of which the first ranked chunk ends
//   dynamic shared memory: PSA_WARPS * PSA_STAGES * 2 * SP * D halves, SP = S rounded up to 16
//   (reused for the final merge)
//
// Offload build (PSA_OFFLOAD = 1, psa_fast.offload): one launch runs ONE iteration of the loop, so
// that the host-offload loader can bring the next iteration's blocks into the GPU pool meanwhile.
// The loop's state lives in global memory between launches: per group `istate` (next position,
// iterations done, reason or -1 while running), per head `vstate` (the verifier's M, AS_acc, min
// log-mass, AS_ema, estimated fraction, then the running output's max, mass and unnormalised
// O[D]). A group that has stopped returns at once, so launches past the stop cost nothing. Blocks
// are found through two tables: `block_table` maps a block to its id in the host store and
// `slot_map` (the pool's) maps that id to its slot; the loader guarantees every block of the
// iteration is resident and stays so while the launch runs. When the last group of the batch
// stops, the kernel writes `*token` into `done_host` (mapped pinned memory) for the loader to see.
//
// Resume build (PSA_RESUME = 1): the loop starts from the state in istate/vstate (as the offload
// build's, blocks found through block_table) and runs to its stop; a group already done leaves at once.
// It follows the speculative build.
//
// Speculative build (PSA_SPEC = 1, DecodePlan(speculate=...)): one CTA per chunk of the loop's schedule,
// blockIdx.x = the chunk, each attending its chunk when the chunk starts below the group's speculated
// position `spec_len` (psa_spec_len) and writing its heads' unnormalised output, max logit, mass, min
// log block mass and moving-average terms to `partial [B, Hq, chunks, PSA_D + 4]`; no CTA decides
// anything. psa_spec_verify (spec.cu) then runs the verifier over the chunks in order. The host may launch
// a build of PSA_WARPS warps and one of a single warp back to back, so that the CTA shape follows the chunks
// actually speculated (`spec_total`, counted by psa_spec_len), on the device (_kernels.spec_one_warp_from):
// the one-warp build on the grid above leaves unless they reach `one_warp_from`; the other then runs a
// compact grid, CTA i taking the i-th speculated chunk from `spec_items` (psa_spec_len's list, `gi *
// spec_chunks + chunk`), and leaves when they do reach it, so the launch that leaves is small.
// Pieces (PSA_SPEC_PIECES > 1, DecodePlan(speculate="first_chunk")): only each group's forced chunk and first
// ranked chunk are speculated (`spec_len` null, no list), on a 1-D grid: CTAs [0, F) take the forced chunks (F =
// `spec_groups` = B x Gn where there are forced blocks, else 0), the rest the first ranked chunks cut into contiguous
// pieces, group after group, as many a group as verifier.cuh's spec_pieces_of gives (by its blocks where `spec_extra`
// >= 0, so that the busiest group's pieces are as long as the others'; at most PSA_SPEC_PIECES). A piece is attended
// as the chunk it belongs to would be (its moving-average coefficients by position in the whole chunk) and writes its
// own partial (entry chunk * PSA_SPEC_PIECES + piece); psa_spec_verify combines a chunk's pieces in piece order, as a
// cluster combines its CTAs in rank order. So a large first chunk fills the GPU as the split build's splits do.
//
// Split build (PSA_SPLIT = 1; dense and top-k, which need no verifier decision): one group's
// positions [0, min(n, step)) are cut into gridDim.x splits of `split_len` positions, each attended
// by one CTA (PSA_CLUSTER = 1) with no barrier between CTAs, so that one request over a long cache
// fills every SM (flash-decoding). Each CTA writes its heads' unnormalised output and its log-sum-exp
// terms (max, mass relative to it) to `partial [B, Hq, splits, PSA_D + 2]`; psa_merge_splits (below)
// combines them and writes the outputs and the group's diagnostics. Costs one extra pass over
// splits * (D + 2) floats per head: at B = 1, 32 heads, 16 splits, D 128 that is 264 KiB, ~0.1 us.
//
// Grid build (PSA_GRID = C > 1, _kernels.LOOP_GRID, pick_grid): a group's C CTAs are not a cluster but blockIdx.x =
// 0 .. C - 1 of the grid, so that a group can take more SMs than a cluster holds (one Gemma 3 request at 128K: 64
// CTAs against a cluster of 16, 77 -> 44 µs: benchmarks/NOTES.md, twenty-eighth to thirtieth sessions). What a
// cluster does through distributed shared memory goes through global memory: each iteration a CTA writes its chunk
// statistics to `xstats [B, Gn, 2, C, PSA_G]` float4 and arrives at the group's counter `xcount [B, Gn, 2]` (entry
// 0), waits for all C (group_sync), and warp h combines head h's C totals for every warp; before that barrier each
// warp also writes its output terms so far to `xpart [B, Gn, C * warps, PSA_G, PSA_D + 4]`, so that when the group
// stops every CTA combines its share of the output channels from them at once, with no barrier after the loop's;
// the last CTA to leave (entry 1) resets both counters and the statistics for the next launch
// (_kernels.grid_exchange_shapes). Where PSA_GRID_TAGS holds (groups of up to 32 CTAs, every rule but the sketch
// rules), the statistics are 64-bit words tagged with their iteration, polled by their readers without the counter,
// and one counter barrier at the stop publishes the output terms.
// Every CTA of the grid must be resident at once: the host gives a group at most SMs / groups CTAs and launches the
// build cooperatively (the driver refuses a grid that cannot be), and a wait longer than a second traps.
#include "common.cuh"
#include "mma.cuh"
#include "verifier.cuh"

#ifndef PSA_FUSED_EO
#define PSA_FUSED_EO 0
#endif
// PSA_FUSED_EO = 1 (_kernels.FUSED_STEP; off, not yet run on a GPU): one launch for a step at one request. The loop's
// cluster of a group first runs psa_estimate_order's CTA work (estimate_order.cuh: each CTA scores its run of 256
// blocks, sorts it, pushes it into the cluster and places its blocks into `order`), then one cluster barrier makes
// every CTA's placements visible, and the loop reads the order as the separate launches' loop does (from L2: it was
// written in this launch). The estimate part reads the caller's query (its scale eo_q_scale), as the loop does
// (PSA_QRAW), so the step needs no scaled copy. The launch is the loop's: a group a cluster of PSA_CLUSTER >= its runs
// of 256 blocks (CTAs past the request's runs place nothing), PSA_WARPS 8 warps scoring two tiles each.
#ifndef PSA_FUSED_FIRST
#define PSA_FUSED_FIRST 0
#endif
// PSA_FUSED_FIRST = 1 (with PSA_FUSED_EO; _kernels.FUSED_FIRST, off, not yet run on a GPU): each placing thread also
// writes its block and the block's slot (block-table entry, loaded before the estimate) into the shared memory of the
// warp whose stream's first window holds the block's position (stream_entry), so the loop's first copies wait on no
// order or block-table load: the window's other entries, and every later window, are loaded as before.
static_assert(!PSA_FUSED_FIRST || PSA_FUSED_EO, "the first windows are written by the fused step's placements");
#if PSA_FUSED_EO
#include "estimate_order.cuh"
#define PSA_ORDER_AT(p) __ldcg(p)
#else
#define PSA_ORDER_AT(p) __ldg(p)
#endif

#ifndef PSA_OFFLOAD
#define PSA_OFFLOAD 0
#endif
#ifndef PSA_SPLIT
#define PSA_SPLIT 0
#endif
#ifndef PSA_SPEC
#define PSA_SPEC 0
#endif
#ifndef PSA_SPEC_PIECES
#define PSA_SPEC_PIECES 1  // the speculative build's CTAs a chunk (below)
#endif
#ifndef PSA_RESUME
#define PSA_RESUME 0
#endif
#ifndef PSA_STREAM_WINDOW
#define PSA_STREAM_WINDOW 0  // _kernels.DECODE_STREAM_WINDOW: the stream's entries loaded a window ahead (below)
#endif
#ifndef PSA_GRID
#define PSA_GRID 0  // _kernels.LOOP_GRID: a group's CTAs spread over the grid, not a cluster (below); 0: a cluster
#endif
#define PSA_STATEFUL (PSA_OFFLOAD || PSA_RESUME)  // the loop starts from (and the offload build saves) istate/vstate
#define PSA_GROUP_CTAS (PSA_GRID ? PSA_GRID : PSA_CLUSTER)  // CTAs of one group
static_assert(!(PSA_SPLIT && (PSA_OFFLOAD || PSA_CLUSTER > 1)), "the split build runs one CTA per split");
static_assert(!(PSA_SPEC && (PSA_SPLIT || PSA_STATEFUL || PSA_CLUSTER > 1)),
              "the speculative build runs one CTA per chunk");
static_assert(PSA_SPEC || PSA_SPEC_PIECES == 1, "pieces share the speculative build's chunks");
static_assert(!(PSA_OFFLOAD && PSA_RESUME), "offload and resume are different builds");
static_assert(!(PSA_GRID && (PSA_CLUSTER > 1 || PSA_SPLIT || PSA_SPEC || PSA_STATEFUL)),
              "the grid build is the plain loop's, its CTAs not a cluster");
#ifndef PSA_FIRST_PREV
#define PSA_FIRST_PREV 0  // first_chunk="previous": first_len is the num_used this launch writes (below)
#endif
static_assert(!(PSA_FIRST_PREV && (PSA_SPLIT || PSA_SPEC || PSA_STATEFUL)),
              "first_chunk='previous' reads the plain loop's own num_used of the previous call");
#ifndef PSA_EARLY_WINDOW
// 1: the stream's first windows loaded before the request's length is known (below; s38). On by default in the
// split build at head dims <= 128 (s41: with PSA_SPLIT_LEAVE, dense one request Llama 41.0 -> 39.6 µs, SmolLM2
// 15.9 -> 14.2); elsewhere it measured level (the ema loop) and was never timed at D 256.
#define PSA_EARLY_WINDOW (PSA_SPLIT && PSA_D <= 128)
#endif
// (the plain loop, the split and the grid builds, windowed stream; the speculative and stateful ones start elsewhere)
#define PSA_EARLY_WINDOW_ON (PSA_EARLY_WINDOW && PSA_STREAM_WINDOW && !PSA_SPEC && !PSA_STATEFUL)
#ifndef PSA_SPLIT_LEAVE
// 1: the split build leaves its loop after its one chunk, before the verifier (below; s38). On by default at head
// dims <= 128 (s41: Llama dense 32K B = 1 41.0 -> 39.9 µs, SmolLM2 15.9 -> 14.9); at D 256 it lost (Gemma 3 B = 8
// 74.3 -> 82.1, as in s18), so Gemma's build keeps the verifier's tail.
#define PSA_SPLIT_LEAVE (PSA_D <= 128)
#endif
#ifndef PSA_SKETCH_RULE
// 1 (_kernels.decode, the plain loop and the grid build of a plan whose stop is sketch or sketch_avg): the decision's
// loads below default on. s46 (H100, graph µs, off / on / off): real Gemma 3 layer 5 spread, sketch_avg, B = 8 170.7 /
// 164.4 / 169.9, B = 32 467.8 / 455.9 / 466.0, with the share rank 134.4 / 130.6 / 138.5 and 388.9 / 379.5 / 388.6;
// Llama 5% B = 8 207.0 -> 202.3; but ema, which reads neither input, 131.2 -> 134.6 at B = 8: off for the other rules.
#define PSA_SKETCH_RULE 0
#endif
#ifndef PSA_DECIDE_PREFETCH
// 1: once a warp has attended its part of a chunk, the last warp of each CTA asks L2 for the decision's inputs that no
// CTA writes during the loop (stop = sketch / sketch_avg: the calibration window's and the next block's sketch masses
// in `ordered`; with them and stop = certified: each head's log-suffix at the chunk's end), so that they arrive
// while the group waits at its barrier, not after it. A hint only: no value or decision changes (s43, prepared; the
// loop clock of s42a put the sketch sums at ~3 µs and the rest of the decision at ~2 µs an iteration on the grid
// build, about two loads' latency each under the chunk's streaming).
#define PSA_DECIDE_PREFETCH PSA_SKETCH_RULE
#endif
#ifndef PSA_DECIDE_OVERLAP
// 1: the sketch rules' window loads (the window's true and sketch masses, the next block's sketch mass) are issued as
// soon as the barrier after a chunk has passed, beside the combine of the chunk's statistics, instead of after it; the
// values and their reductions are the same (s43, prepared). The log-suffixes stay where they were: loading them early
// too made NVVM unroll the decision per head (+~1,050 instructions, Gemma 3's grid build spilling 260 bytes against
// 92); without them the Gemma 3 builds spill less than the default (grid 44 bytes, clusters 12).
#define PSA_DECIDE_OVERLAP PSA_SKETCH_RULE
#endif
// Iterations' statistics the grid build keeps, double-buffered by the iteration's parity (xstats [B, Gn, 2, C, PSA_G]),
// and its barrier counters (xcount [B, Gn, 2]: the arrivals, then the CTAs out); a cluster's CTA totals (cta_stats) are
// double-buffered likewise. (Until the forty-sixth session a look-ahead build, PSA_LOOKAHEAD, kept more; NOTES.md,
// s46.)
#define PSA_XSTATS 2
#define PSA_XCOUNT 2
// (both in the builds that decide: not the speculative one, which leaves after its chunk, nor the split build, whose
// stop rules read neither array)
#ifndef PSA_GRID_TAGS
// > 0: the grid build of groups of at most this many CTAs, for the rules that read nothing other CTAs write during
// the loop but the chunk statistics (every rule but the sketch rules, whose window sums read the group's `lmass`),
// exchanges those statistics without the counter: each is stored as one 64-bit word, its float's bits under a tag of
// the iteration (it + 1), and each reader polls the words themselves until every one carries the iteration it waits
// for (an aligned 8-byte access is single-copy atomic, so a word is either the old one or the new one, whole). One
// L2 round trip after the last CTA's store instead of three (the counter's release, its poll, the statistics' load:
// NOTES.md, fifty-fifth session); the warps' output terms, written each iteration as before, are published by one
// counter barrier at the stop. 0: the counter every iteration, as the sketch rules keep. Fifty-sixth session (H100,
// off / on / on / off, ema): real Gemma 3 layer 17 B = 8 (16 CTAs) 97.5 -> 96.6 µs, B = 32 (4) 268.5 -> 267.7, the
// drawn 20% 81.1 -> 79.9 and 229.5 -> 224.7, Llama 128K B = 1 level; the loop clock's barrier 3.4 -> 3.0 µs an
// iteration (the rest is the CTAs' skew). With 64 CTAs (one Gemma 3 request), where a lane waits for two ranks in
// turn and 64 CTAs poll each rank's line, a first version lost 7% (32.5 -> 34.7 µs): hence at most 32.
#define PSA_GRID_TAGS 32
#endif
#define PSA_GRID_TAGS_ON (PSA_GRID && PSA_GRID <= PSA_GRID_TAGS && !PSA_SKETCH_RULE)
#define PSA_DECIDE_PREFETCH_ON (PSA_DECIDE_PREFETCH && !PSA_SPEC && !PSA_SPLIT)
#define PSA_DECIDE_OVERLAP_ON (PSA_DECIDE_OVERLAP && !PSA_SPEC && !PSA_SPLIT)
#ifndef PSA_PUSH
// 1: the cluster's exchanges by push (common.cuh's push4 / mbar_wait; _kernels.DECODE_PUSH). Each decision: warp 0
// writes the CTA's chunk totals into every CTA's cta_stats[parity][rank] by st.async and each CTA waits on its own
// mbarrier of that parity for all of them, then reads them from its own shared memory (no cluster_sync, whose release
// fence is a MEMBAR.ALL.GPU, and no remote reads). The finish, where rank 0's receiving buffers fit
// PSA_PUSH_FINISH_BYTES: every CTA pushes its combined terms into rank 0's and leaves; rank 0 waits for them (no
// cluster_sync before it, none at the end). The same terms combined in the same order: the same bits.
#define PSA_PUSH 0
#endif
#define PSA_PUSH_ON (PSA_PUSH && PSA_CLUSTER > 1 && !PSA_GRID && !PSA_SPLIT && !PSA_SPEC)
#define PSA_PUSH_FINISH_BYTES 16384  // _kernels.PUSH_FINISH_BYTES (push_fits sizes the static buffers by it)
#define PSA_PUSH_FINISH_ON (PSA_PUSH_ON && PSA_CLUSTER * PSA_G * PSA_D * 4 <= PSA_PUSH_FINISH_BYTES)
#define PSA_VSTATE (7 + PSA_D)  // floats per head of vstate: M, acc, min, ema, frac, oM, oL, O[D]
#ifndef PSA_LOOP_CLOCK
#define PSA_LOOP_CLOCK 0
#endif
// PSA_LOOP_CLOCK = 1 (benchmarks/exp_verify_clock.py --loop): thread 0 of each group's rank-0 CTA reads the SM clock
// around the loop and writes per group to loop_clocks [B, Gn, 18] the cycles of the whole kernel, its start (up to
// the loop), the chunks' attention, the barriers after them, the decisions in three parts (the cluster's
// statistics, the sketch window sums, the rest; each summed over iterations), the finish (the cluster's merge and
// the writes), the iterations, 1, within the start the cycles to the query's registers and to the first blocks'
// copies issued, within the finish the cycles to the prefetches drained, the warps' outputs combined, the end's
// barrier passed and the outputs written, then the global timer (ns) at the kernel's start and end (words 16, 17:
// the step's timeline beside other kernels' marks, benchmarks/exp_step_timeline.py; PSA_FUSED_EO: the start before
// the estimate and order, the cycles' marks from the loop's start after them). Groups that leave at once write
// nothing.
// Not for production; the loop builds only (plain, resumed and grid; in the grid build the barrier phase holds the
// wait for the other CTAs of the group and the attend the warps' output terms written each iteration, and the
// finish has no warps' combine or end barrier: its second and third marks bracket the outputs' combine).
static_assert(!(PSA_LOOP_CLOCK && (PSA_SPLIT || PSA_SPEC || PSA_OFFLOAD)),
              "the loop clock times the loop builds (cluster and grid: the rank-0 CTA's thread 0)");
// The marks and sums live in shared memory (volatile), not registers: the D 256 builds have none to spare.
#if PSA_LOOP_CLOCK
#define PSA_LMARK(i) if (rank == 0 && threadIdx.x == 0) lclk[i] = clock64()
#define PSA_LADD(acc, from) if (rank == 0 && threadIdx.x == 0) lclk[acc] += clock64() - lclk[from]
#else
#define PSA_LMARK(i)
#define PSA_LADD(acc, from)
#endif
// lclk slots: 0 kernel start, 1 loop start, 2 this iteration's mark, then sums over iterations: 3 attention,
// 4 barriers, 5 the decision's cluster statistics, 6 its sketch window sums, 7 the rest of it; 8 finish start,
// 9 iterations; 10 the query loaded, 11 the first copies issued; within the finish: 12 the prefetches drained, 13 the
// warps' outputs combined, 14 the end's barrier passed, 15 the outputs written (grid: 13 the combine's start, 14 the
// outputs written, 15 the end)

#ifndef PSA_QPARTS
#define PSA_QPARTS 2  // parts of Q's split (see above); 1 only when the query is of the KV's type
#endif
#define PSA_PPARTS (PSA_BF16 ? 3 : 2)  // parts of P's split
#ifndef PSA_PAIR
#define PSA_PAIR 1  // _kernels.DECODE_PAIR: a warp attends two blocks of a chunk at once where it has two
#endif
// Pairs need a third stage: two blocks computed while the next loads (with two stages nothing would be in flight).
// Not in the split build (dense, top-k): memory-bound there, it wants the single path's two blocks in flight a warp
// (Llama 128K B = 8 dense 954 -> 993 µs paired, while the ema loop went 345 -> 320; benchmarks/NOTES.md).
#define PSA_PAIR_ON (PSA_PAIR && PSA_STAGES >= 3 && !PSA_SPLIT)

#ifndef PSA_STAGES
#define PSA_STAGES 3
#endif
#define PSA_SP (((PSA_S + 15) / 16) * 16)      // tokens per block, padded for the MMA tiles
#define PSA_KS (PSA_D / 16)                    // channel steps (k = 16) of K Q^T
#define PSA_NC (PSA_D / 8)                     // 16-byte chunks per row
#define PSA_SWZ (PSA_NC < 8 ? PSA_NC - 1 : 7)  // XOR mask of the chunk swizzle
#define PSA_STAGE_HALVES (2 * PSA_SP * PSA_D)
static_assert(PSA_D % 16 == 0, "decode v3 needs the head dimension padded to a multiple of 16");
static_assert(PSA_G <= 8, "decode v3 takes at most 8 query heads per group (the MMA's first 8 rows)");

__device__ __forceinline__ void cp_async16(unsigned int smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// chunk_end(e, ...) for a chunk boundary e (0, first, first2 or first2 + k step) without its division: the
// loop's positions advance chunk by chunk, so it never needs to find the chunk of an arbitrary position.
__device__ __forceinline__ int boundary_end(int e, int first, int first2, int step, int n) {
    return min(e < first ? first : e < first2 ? first2 : e + step, n);
}

// The first position of the order at or after `from` (a chunk boundary) that warp `gw` attends (n if none);
// `e` becomes the end of its chunk.
__device__ __forceinline__ int first_position(int gw, int from, int& e, int first, int first2, int step, int n) {
    for (int s = from; s < n;) {
        e = boundary_end(s, first, first2, step, n);
        if (s + gw < e) return s + gw;
        s = e;
    }
    return n;
}

// The next position of the order that warp `gw` of nw attends after position i, whose chunk ends at `e` (n if
// none); `e` becomes the end of the returned position's chunk.
__device__ __forceinline__ int next_position(int i, int& e, int gw, int nw, int first, int first2, int step, int n) {
    return i + nw < e ? i + nw : first_position(gw, e, e, first, first2, step, n);
}

// Entry m of warp gw's stream from chunk boundary `from`: the warp's positions of each chunk [s, e) in order (s + gw,
// s + gw + nw, ...), chunk after chunk up to lim, then lim: first_position, then next_position m times. The forced and
// first ranked chunks are walked; after them every chunk holds `step` positions, c of them the warp's, so entry m
// is found without a walk (a long stream's window costs the same as the first).
__device__ __forceinline__ int stream_position(int m, int from, int gw, int nw, int first, int first2, int step,
                                               int lim) {
    int s = from;
    while (s < lim && s < first2) {  // at most the two chunks before first2
        const int e = boundary_end(s, first, first2, step, lim);
        const int count = e - s > gw ? (e - s - gw + nw - 1) / nw : 0;
        if (m < count) return s + gw + m * nw;
        m -= count;
        s = e;
    }
    const int c = step > gw ? (step - gw + nw - 1) / nw : 0;
    if (s >= lim || c == 0) return lim;
    const int k = m / c, r = m - k * c;
    if (k >= (lim - s + step - 1) / step) return lim;
    const int p = s + k * step + gw + r * nw;
    return p < lim ? p : lim;
}

// stream_position's inverse (from 0): the entry of warp gw's stream that holds position p < lim (its return) and gw,
// the chunks walked as stream_position walks them (those starting before first2 one by one, then `step` at a time).
// The fused step's placing CTAs (PSA_FUSED_FIRST) write each position's block where the warp that attends it reads
// its stream's first window.
__device__ __forceinline__ int stream_entry(int p, int nw, int first, int first2, int step, int lim, int& gw) {
    int s = 0, c0 = -1;  // the chunks walked one by one: p's chunk starts at c0, or they end at s
    while (s < lim && s < first2) {
        const int e = boundary_end(s, first, first2, step, lim);
        if (p < e) {
            c0 = s;
            break;
        }
        s = e;
    }
    const int k = c0 < 0 ? (p - s) / step : 0;  // p's chunk among those of `step` from s
    if (c0 < 0) c0 = s + k * step;
    gw = (p - c0) % nw;
    int m = (p - c0) / nw + k * (step > gw ? (step - gw + nw - 1) / nw : 0);
    for (int t = 0; t < c0 && t < lim && t < first2;) {  // gw's entries in the chunks walked before p's
        const int e = boundary_end(t, first, first2, step, lim);
        m += e - t > gw ? (e - t - gw + nw - 1) / nw : 0;
        t = e;
    }
    return m;
}

__device__ __forceinline__ int swz(int t, int c) { return c ^ (t & PSA_SWZ); }

__device__ __forceinline__ unsigned int smem_u32(const void* p) {
    return static_cast<unsigned int>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned int addr, unsigned int (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned int addr, unsigned int (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

#if PSA_GRID
// The grid build's barrier of a group: every CTA arrives at `count` and waits until `target` CTAs have (the
// counter grows by C an iteration within a launch). Thread 0 arrives with a release (after the CTA's barrier, so
// every thread's earlier writes are ordered before it) and polls with acquire loads, which order every thread's
// later reads after the other CTAs' arrivals once the second CTA barrier has passed (cooperative groups' grid sync,
// without its two full fences); readers use L2 loads (__ldcg). A group whose CTAs are not all resident would wait
// forever: after a second the kernel traps (a launch error) instead.
__device__ __forceinline__ void group_arrive(unsigned int* count) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
}

__device__ __forceinline__ void group_wait(unsigned int* count, unsigned int target) {
    if (threadIdx.x == 0) {
        unsigned int seen;
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        for (int polls = 1;; ++polls) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (seen >= target) break;
            if ((polls & 1023) == 0) {
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
                if (t - t0 > 1000000000ull) __trap();
            }
        }
    }
    __syncthreads();
}

// (the grid build's barrier: arrive, then wait)
__device__ __forceinline__ void group_sync(unsigned int* count, unsigned int target) {
    group_arrive(count);
    group_wait(count, target);
}

#if PSA_GRID_TAGS_ON
typedef unsigned long long xstat_t;  // a statistic: (tag << 32) | its float's bits; 0 = none (PSA_GRID_TAGS)
#define PSA_XSTAT_ELEMS 4            // xstat_t elements of one (parity, CTA, head) entry: its four statistics
#else
typedef float4 xstat_t;
#define PSA_XSTAT_ELEMS 1
#endif

// PSA_GRID_TAGS: a CTA's four statistics of a head (max, mass, min, moving-average terms) as four tagged words at `p`
// (32 bytes), stored relaxed at gpu scope: no fence, nothing waits for them here. Two parities suffice: a CTA stores
// iteration it + 2's words over those of iteration it only after it has read every CTA's words of iteration it + 1,
// which each CTA stores only after its own reads of iteration it (and a word of the wrong iteration is never taken,
// only waited past).
__device__ __forceinline__ void xstats_publish(unsigned long long* p, float4 t, unsigned int tag) {
    const unsigned long long hi = (unsigned long long)tag << 32;
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};"
                 ::"l"(p), "l"(hi | __float_as_uint(t.x)), "l"(hi | __float_as_uint(t.y)) : "memory");
    asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};"
                 ::"l"(p + 2), "l"(hi | __float_as_uint(t.z)), "l"(hi | __float_as_uint(t.w)) : "memory");
}

// ... and the reader's side: polls the four words (relaxed loads at gpu scope: from L2) until each carries `tag`, and
// returns their floats. A vector access is one single-copy atomic access per 8-byte element, so each word is whole;
// the reader needs no ordering with anything else the writer stored (nothing else is read until the group's stop).
// Traps after 2^21 polls (each an L2 round trip: a second or more) rather than reading the clock as group_wait does
// (two registers fewer where Gemma 3's build has none to spare). Probes of s56b, not kept: polling the last word alone
// before loading the four (+1-4%), a 64 ns sleep after a poll that missed (+0-1%).
__device__ __forceinline__ float4 xstats_await(const unsigned long long* p, unsigned int tag) {
    unsigned long long a, b, c, d;
    for (int polls = 1;; ++polls) {
        asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p));
        asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(c), "=l"(d) : "l"(p + 2));
        if ((unsigned int)(a >> 32) == tag && (unsigned int)(b >> 32) == tag && (unsigned int)(c >> 32) == tag
            && (unsigned int)(d >> 32) == tag)
            break;
        if (polls == 1 << 21) __trap();
    }
    return make_float4(__uint_as_float((unsigned int)a), __uint_as_float((unsigned int)b),
                       __uint_as_float((unsigned int)c), __uint_as_float((unsigned int)d));
}

// The grid build's statistics entry of group `gid`, iteration `it` (its parity of PSA_XSTATS), CTA `rank`, head `h`
// (_kernels.grid_exchange_shapes' xstats), in xstat_t units of PSA_XSTAT_ELEMS: where a CTA publishes its statistics
// and where the group's CTAs read them. (`rank` keeps its caller's type: the CTA's own is unsigned, a reader's loop
// index an int, and each extends to 64 bits as it did written out.)
template <typename Rank>
__device__ __forceinline__ long xstat_entry(long gid, int it, Rank rank, int h) {
    return ((PSA_XSTATS * gid + (it & (PSA_XSTATS - 1))) * PSA_GRID + rank) * PSA_G + h;
}

// Threads that add one piece's entries in the grid build's finish (a piece: the 1 or 4 output channels a thread
// makes): a power of two up to a warp, as many as the CTA's threads give each of its `pieces`.
__host__ __device__ constexpr int grid_finish_threads(int threads, int pieces) {
    int f = 1;
    while (2 * f <= 32 && 2 * f * pieces <= threads) f *= 2;
    return f;
}
#endif

// ---- one block's arithmetic, shared by the single and the paired loop ----
// Lane layout of the MMA fragments: hh = lane / 4 is the fragment's row (a token or a channel), quad = lane % 4 its
// column pair (heads 2 quad, 2 quad + 1). The lane's two heads are indexed e = 0, 1 below.

// S^T = K Q^T of the block in stage `stk` (tokens as the MMA's 16 rows, heads as its 8 columns): token tile mt holds
// the logits of tokens 16 mt + hh (elements 0, 1) and 16 mt + hh + 8 (2, 3). Scaled by qk_scale, the padding and
// tokens at or past `ntok` masked, then taken relative to the block's max: on return sacc holds exp(logit - bm[e]),
// bm[e] and bs[e] the block's max logit and mass relative to it for head 2 quad + e (over the 8 lanes that share it).
__device__ __forceinline__ void block_logits(const kv_t* stk, const unsigned int (&qa)[PSA_KS][PSA_QPARTS][2],
                                             bool q_has_lo, int ntok, float qk_scale, int lane,
                                             float (&sacc)[PSA_SP / 16][4], float (&bm)[2], float (&bs)[2]) {
    const int hh = lane >> 2;
#pragma unroll
    for (int mt = 0; mt < PSA_SP / 16; ++mt) sacc[mt][0] = sacc[mt][1] = sacc[mt][2] = sacc[mt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < PSA_KS; ++ks)
#pragma unroll
        for (int mt = 0; mt < PSA_SP / 16; ++mt) {
            const int mi = lane >> 3;
            const int t = mt * 16 + (mi & 1) * 8 + (lane & 7), c = 2 * ks + (mi >> 1);
            unsigned int ka[4];
            ldmatrix_x4(smem_u32(stk + t * PSA_D + swz(t, c) * 8), ka);
            mma16_parts(sacc[mt], ka, qa[ks], q_has_lo);
        }
    bm[0] = bm[1] = -PSA_INF;
    bs[0] = bs[1] = 0.f;
#pragma unroll
    for (int mt = 0; mt < PSA_SP / 16; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sacc[mt][e] = 16 * mt + hh + (e >> 1) * 8 < ntok ? sacc[mt][e] * qk_scale : -PSA_INF;
            bm[e & 1] = fmaxf(bm[e & 1], sacc[mt][e]);
        }
#pragma unroll
    for (int e = 0; e < 2; ++e) bm[e] = column_max(bm[e]);
#pragma unroll
    for (int mt = 0; mt < PSA_SP / 16; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sacc[mt][e] = __expf(sacc[mt][e] - bm[e & 1]);
            bs[e & 1] += sacc[mt][e];
        }
#pragma unroll
    for (int e = 0; e < 2; ++e) bs[e] = column_sum(bs[e]);
}

// Fold the block at position `cur` of the chunk [pos, pos + clen) (iteration `it`) into the warp's share of the
// chunk's statistics for the lane's heads: max logit cm, mass cs and (stop = ema) moving-average terms ce relative
// to cm, min log block mass cmin. AS_ema after the chunk = (1-w)^clen AS_ema + sum_i w (1-w)^(clen-1-i) m_i over
// the chunk's blocks i in order; the very first block of the loop enters with weight 1, not w. stop = sketch: the
// block's log mass goes to lmass [B, Hq, nmax] at head head0 + h (h the lane's head), position base + cur.
__device__ __forceinline__ void fold_block(int cur, int pos, int clen, int it, float log_keep, float ema_w,
                                           const float (&bm)[2], const float (&bs)[2], float (&cm)[2],
                                           float (&cs)[2], float (&cmin)[2], float (&ce)[2], bool sketchy,
                                           float* lmass, long head0, int nmax, int base, int lane) {
    const int i_in_chunk = cur - pos;
    const float coef = __expf((clen - 1 - i_in_chunk) * log_keep) * (it == 0 && i_in_chunk == 0 ? 1.f : ema_w);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const float log_mass = bm[e] + __logf(bs[e]);
        cmin[e] = fminf(cmin[e], log_mass);
        if (sketchy && (lane >> 2) == 0 && 2 * (lane & 3) + e < PSA_G)
            lmass[(head0 + 2 * (lane & 3) + e) * nmax + base + cur] = log_mass;
        const float nm = fmaxf(cm[e], bm[e]);
        const float rescale = __expf(cm[e] - nm), here = bs[e] * __expf(bm[e] - nm);
        cs[e] = cs[e] * rescale + here;
        ce[e] = ce[e] * rescale + coef * here;
        cm[e] = nm;
    }
}

// The warp's online softmax for the lane's heads: the running max wm moves up to `to` (a block's max, or a pair's)
// and the running mass wl and output O^T (oacc) are rescaled to it; the caller then adds each block's terms
// relative to the new wm.
__device__ __forceinline__ void move_max(const float (&to)[2], float (&wm)[2], float (&wl)[2],
                                         float (&oacc)[PSA_D / 16][4]) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const float nw = fmaxf(wm[e], to[e]);
        const float alpha = __expf(wm[e] - nw);
        wl[e] *= alpha;
        wm[e] = nw;
#pragma unroll
        for (int ct = 0; ct < PSA_D / 16; ++ct) {
            oacc[ct][e] *= alpha;
            oacc[ct][e + 2] *= alpha;
        }
    }
}

// O^T += V^T (P^T c) for the block whose V tile is `stv`, P = sacc (exp(logit - block max), block_logits) and c the
// block's factor exp(block max - running max) per head. P's tile (tokens x heads) is the lane's accumulator; as the
// B operand each lane needs head hh's tokens 2 quad, 2 quad + 1 (and + 8): split into PSA_PPARTS parts, each part's
// 8 x 8 halves transposed in registers (movmatrix moves bits: the parts stay exact). Consumes sacc.
__device__ __forceinline__ void block_output(const kv_t* stv, float (&sacc)[PSA_SP / 16][4], const float (&c)[2],
                                             int lane, float (&oacc)[PSA_D / 16][4]) {
#pragma unroll
    for (int kt = 0; kt < PSA_SP / 16; ++kt) {
        unsigned int pb[PSA_PPARTS][2];
        float x0 = sacc[kt][0] * c[0], y0 = sacc[kt][1] * c[1];
        float x1 = sacc[kt][2] * c[0], y1 = sacc[kt][3] * c[1];
#pragma unroll
        for (int p = 0; p < PSA_PPARTS; ++p) {
            pb[p][0] = movmatrix_trans(pack_rest(x0, y0));
            pb[p][1] = movmatrix_trans(pack_rest(x1, y1));
        }
#pragma unroll
        for (int ct = 0; ct < PSA_D / 16; ++ct) {
            const int mi = lane >> 3;
            const int t = kt * 16 + (mi >> 1) * 8 + (lane & 7), ch = 2 * ct + (mi & 1);
            unsigned int va[4];
            ldmatrix_x4_trans(smem_u32(stv + t * PSA_D + swz(t, ch) * 8), va);
            mma16_parts(oacc[ct], va, pb);
        }
    }
}

// A stage's V tile follows its K tile.
__device__ __forceinline__ const kv_t* ring_v(const kv_t* stk) { return stk + PSA_SP * PSA_D; }

#if PSA_DECIDE_PREFETCH_ON
// PSA_DECIDE_PREFETCH, called by one warp after its part of the chunk ending at `end`: lanes 3 h, 3 h + 1 and 3 h + 2
// ask L2 for the lines of head h (row row0 + h) that the decision reads and no CTA writes in the loop: in `ordered` the
// window's first position and the next block's (the window and the next block, at most 33 floats, lie on those two
// lines), and in `log_suffix` the entry at `end`. Positions are clamped into the group's n blocks, as
// sketch_window_load clamps its loads. Marked evict-last, so that the chunk streaming through L2 meanwhile does not
// push them out.
__device__ __forceinline__ void decide_prefetch(const float* __restrict__ ordered, const float* __restrict__ log_suffix,
                                                long row0, int Nmax, int first, int end, int n, int window,
                                                bool sketchy, bool tail) {
    const int lane = threadIdx.x & 31, h = lane / 3, part = lane % 3;
    if (h >= PSA_G || n <= 0) return;
    const float* line = nullptr;
    if (part < 2 && sketchy) {
        const int at = part == 0 ? max(first, end - window) : end;
        line = ordered + (row0 + h) * Nmax + max(0, min(at, n - 1));
    } else if (part == 2 && tail) {
        line = log_suffix + (row0 + h) * (Nmax + 1) + end;
    }
    if (line) asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(line));
}
#endif

// Each build has its own name, so that a profile tells the speculative and resumed launches apart.
#if PSA_SPEC
#define PSA_DECODE_ENTRY psa_decode_spec
#elif PSA_RESUME
#define PSA_DECODE_ENTRY psa_decode_resume
#else
#define PSA_DECODE_ENTRY psa_decode
#endif

extern "C" __global__ void
#if PSA_CLUSTER > 1
__cluster_dims__(PSA_CLUSTER, 1, 1)
#endif
__launch_bounds__(PSA_WARPS * 32)
PSA_DECODE_ENTRY(const q_in_t* __restrict__ q, const kv_t* __restrict__ k_pool, const kv_t* __restrict__ v_pool,
           const int* __restrict__ block_table, const int* __restrict__ seq_lens, const int* __restrict__ order,
           const float* __restrict__ log_suffix, float* __restrict__ out, int* __restrict__ num_used,
           int* __restrict__ iterations, int* __restrict__ reason, float* __restrict__ mass_est,
           int Hq, int Hkv, int Nmax, int stop, float threshold, int step, int forced, float ema_w,
           const float* __restrict__ ordered, float* __restrict__ lmass, float sketch_share, int sketch_window,
           float qk_scale, const int* __restrict__ first_len
#if PSA_STATEFUL
           , const int* __restrict__ slot_map, int* __restrict__ istate, float* __restrict__ vstate,
           int* __restrict__ groups_left, volatile int* done_host, const int* __restrict__ token
#endif
#if PSA_SPLIT
           , int split_len, float* __restrict__ partial
#endif
#if PSA_SPEC
           , const int* __restrict__ spec_len, float* __restrict__ partial, const int* __restrict__ spec_total,
           int one_warp_from, const int* __restrict__ spec_items, int spec_chunks, int spec_groups, int spec_extra
#endif
#if PSA_GRID
           , xstat_t* __restrict__ xstats, unsigned int* __restrict__ xcount, float* __restrict__ xpart
#endif
#if PSA_LOOP_CLOCK
           , long long* __restrict__ loop_clocks
#endif
#if PSA_QRAW
           , float q_mul
#endif
#if PSA_FUSED_EO
           , const __half* __restrict__ eo_meta, float* __restrict__ eo_scores, int eo_sink, int eo_recent,
           float eo_q_scale
#endif
           ) {
#if !PSA_QRAW
    const float q_mul = 1.f;  // unused: the plan's copy is scaled
#endif
    constexpr int NW = PSA_GROUP_CTAS * PSA_WARPS;  // warps sharing a chunk
    // The rings start on a 128-byte line. After the static shared memory (not a multiple of 128 bytes in most builds)
    // a 16-byte alignment started them off one, and every build was slower for it: one Gemma 3 request's grid build
    // by up to 4 µs, Llama's clusters at 128K B = 8 by 12 (NOTES.md, thirty-second session, s32d-g; why, not profiled:
    // the swizzle keeps a phase's eight 16-byte pieces on distinct banks at any 16-byte offset).
    extern __shared__ __align__(128) unsigned char dyn_smem[];
#if PSA_FUSED_EO
    static_assert(PSA_QRAW && PSA_CLUSTER > 1 && !PSA_GRID && !PSA_SPLIT && !PSA_SPEC && !PSA_STATEFUL && PSA_H == 1 &&
                  !PSA_EO_CLOCK, "the fused step: the loop on clusters, one order a group, the caller's query");
#if PSA_LOOP_CLOCK
    const long long fused_t0 = globaltimer_ns();  // (the loop clock's kernel start: before the estimate and order)
#endif
#if PSA_FUSED_FIRST
    // the first window of each warp's stream (entry = lane): its blocks and slots, written by the placing CTAs
    __shared__ int fw_blk[PSA_WARPS][32], fw_slot[PSA_WARPS][32];
#endif
    {
        // stages 1 and 2: this CTA's run of its group scored, sorted, pushed into the cluster and placed into `order`
        __shared__ __align__(16) unsigned int eo_runs[1][PSA_CLUSTER][PSA_RUN];
        __shared__ __align__(16) unsigned int eo_words[1][PSA_RUN];
        __shared__ __align__(8) unsigned long long eo_bar;
#if PSA_FUSED_FIRST
        static_assert(PSA_STREAM_WINDOW && !PSA_EARLY_WINDOW_ON && !PSA_OFFLOAD && PSA_WARPS * 32 == PSA_RUN,
                      "the first windows: the loop's windowed stream, one block a placing thread");
        // thread t places block t of the CTA's run (if below n): its slot, asked for before the estimate's loads
        const int fw_mine = (int)blockIdx.x * PSA_RUN + (int)threadIdx.x;
        const int fw_kv = (int)blockIdx.y * PSA_G / (Hq / Hkv);
        const int fw_slot_mine = fw_mine < Nmax ? __ldg(block_table + ((long)blockIdx.z * Hkv + fw_kv) * Nmax
                                                        + fw_mine) : 0;
        auto on_place = [&](int p, int blk, int n) {  // (blk is fw_mine)
            const int first = min(n, forced);  // the loop's chunks (no first_len; lim = n: not the budget rule)
            int gw;
            const int m = stream_entry(p, PSA_GROUP_CTAS * PSA_WARPS, first, first, step, n, gw);
            if (m < 32) {
                dsmem_store_int(&fw_blk[gw % PSA_WARPS][m], gw / PSA_WARPS, blk);
                dsmem_store_int(&fw_slot[gw % PSA_WARPS][m], gw / PSA_WARPS, fw_slot_mine);
            }
        };
#else
        const eo_place_nothing on_place;
#endif
        const bool waited = estimate_order_cta(q, eo_meta, seq_lens, eo_scores, const_cast<int*>(order), Hq, Hkv, Nmax,
                                               eo_sink, eo_recent, eo_q_scale, eo_runs, eo_words, eo_bar, on_place);
        __syncwarp();  // (a warp's threads left the placements apart; the cluster barriers are .aligned)
        if (!waited) cluster_wait();  // (the CTAs past the request's runs arrived at its barrier, did not wait)
        cluster_sync();  // every CTA's placements (global memory) visible to the cluster's loop
    }
#endif
#if PSA_SPEC
    // The CTA's request, group and chunk: from the grid (chunk, Gn, B), the compact list's entry blockIdx.x, or
    // (pieces) the 1-D grid's share-out. Each build leaves unless the chunks speculated pick its shape (above).
    const int Gn = Hq / PSA_G;
    constexpr unsigned int rank = 0;  // (one CTA a chunk or piece)
#if PSA_SPEC_PIECES > 1
    // Pieces: the forced chunk of group blockIdx.x, or the piece blockIdx.x - F of the groups' first ranked chunks,
    // found by warp 0's scan of the groups' piece counts.
    const bool spec_forced = forced > 0 && (int)blockIdx.x < spec_groups;
    int spec_piece = 0, spec_npieces = 1, chunk = 0;
    int b = blockIdx.x / Gn, g = blockIdx.x % Gn;
    if (!spec_forced) {
        __shared__ int s_piece[3];  // group (-1: the CTA has none), piece, pieces
        if (threadIdx.x < 32) {
            const long long total = spec_blocks_total(first_len, seq_lens, spec_groups, Gn, forced);
            const int idx = (int)blockIdx.x - (forced > 0 ? spec_groups : 0), lane = threadIdx.x;
            if (lane == 0) s_piece[0] = -1;
            __syncwarp();
            for (int g0 = 0, before = 0; g0 < spec_groups && before <= idx; g0 += 32) {
                const int gi = g0 + lane;
                const int w = gi < spec_groups ? spec_ranked_blocks(first_len, seq_lens, gi, Gn, forced) : 0;
                const int p = gi < spec_groups ? spec_pieces_of(w, total, spec_extra, PSA_SPEC_PIECES) : 0;
                int incl = p;  // the lanes' inclusive scan of the pieces
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const int x = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += x;
                }
                const int start = before + incl - p;
                if (p > 0 && idx >= start && idx < start + p) {
                    s_piece[0] = gi;
                    s_piece[1] = idx - start;
                    s_piece[2] = p;
                }
                before += __shfl_sync(0xffffffffu, incl, 31);
            }
        }
        __syncthreads();
        if (s_piece[0] < 0) return;  // past the last piece
        b = s_piece[0] / Gn;
        g = s_piece[0] % Gn;
        spec_piece = s_piece[1];
        spec_npieces = s_piece[2];
        chunk = 1;  // the first ranked chunk: entry 1, or 0 below where the request has no forced chunk
    }
#else
    constexpr int spec_piece = 0, spec_npieces = 1;
    const int spec_count = __ldg(spec_total);
    int b = blockIdx.z, g = blockIdx.y, chunk = blockIdx.x;
    if (spec_items) {
        if (spec_count >= one_warp_from || (int)blockIdx.x >= spec_count) return;
        const int item = __ldg(spec_items + blockIdx.x);
        chunk = item % spec_chunks;
        g = item / spec_chunks % Gn;
        b = item / spec_chunks / Gn;
    } else if ((spec_count >= one_warp_from) != (PSA_WARPS == 1)) {
        return;
    }
#endif
#else
    const int b = blockIdx.z, g = blockIdx.y, Gn = gridDim.y;
    const unsigned int rank = PSA_GRID ? blockIdx.x : cluster_rank();  // this CTA's index within the group
#endif
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if PSA_LOOP_CLOCK
    __shared__ long long lclk_store[17];
    volatile long long* lclk = lclk_store;
    if (threadIdx.x == 0)
        for (int i = 0; i < 17; ++i) lclk[i] = 0;
#if PSA_FUSED_EO
    if (rank == 0 && threadIdx.x == 0) lclk[16] = fused_t0;
#else
    if (rank == 0 && threadIdx.x == 0) lclk[16] = globaltimer_ns();
#endif
#endif
    PSA_LMARK(0);
    const int gw = (int)rank * PSA_WARPS + warp;   // this warp's index within the group
    const int h0 = g * PSA_G, kv = h0 / (Hq / Hkv);
    const float log_keep = __logf(1.f - ema_w);    // stop = ema: log of the weight kept per block
#if PSA_EARLY_WINDOW_ON
    // The start's chain is the request's length -> its first positions -> their order entries -> their block-table
    // entries -> their copies. The positions depend on the length only through the group's block count n, so the
    // stream's first two windows are loaded as if n were the table's Nmax, before the length is read (positions past
    // the true end are found and dropped once it is, below; the loads for them read inside the order's and the table's
    // rows, garbage entries skipped): one dependent load less before the first copies. Where the guess gives other
    // chunk boundaries (a request shorter than its forced or first ranked chunk) the windows are loaded again.
#if PSA_SPLIT
    const int total_g = min(Nmax, step);
    const int base_g = min(total_g, (int)blockIdx.x * split_len);
    const int n_g = min(total_g - base_g, split_len);
    const int first_g = n_g, first2_g = n_g;  // the split's one chunk (as first, first2 = n below)
#else
    constexpr int base_g = 0;
    const int n_g = Nmax;
    const int first_g = min(n_g, forced);
#if PSA_FIRST_PREV
    const int first2_g = min(n_g, first_g + max(0, __ldcg(first_len + (long)b * Gn + g) - first_g - step));
#else
    const int first2_g = first_len ? min(n_g, first_g + __ldg(first_len + (long)b * Gn + g)) : first_g;
#endif
#endif
    const int lim_g = stop == PSA_STOP_BUDGET ? min(n_g, step) : n_g;
    int g_pos[2], g_blk[2], g_slot[2];
    {
        const int* orow_g = order ? order + ((long)b * Gn + g) * Nmax + base_g : nullptr;
        const int* btab_g = block_table + ((long)b * Hkv + kv) * Nmax;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
            constexpr int from_g = 0;
            const int p = stream_position(32 * w + lane, from_g, gw, NW, first_g, first2_g, step, lim_g);
            const int blk = p < lim_g ? (orow_g ? PSA_ORDER_AT(orow_g + p) : base_g + p) : 0;
            g_pos[w] = p;
            g_blk[w] = blk;
            g_slot[w] = p < lim_g && (unsigned)blk < (unsigned)Nmax ? __ldg(btab_g + blk) : 0;
        }
    }
#endif
    const int len = seq_lens[b];
#if PSA_SPLIT
    // This CTA's positions [base, base + n) of the group's min(blocks, step): one chunk, no decision.
    const int total = min((len + PSA_S - 1) / PSA_S, step);
    const int base = min(total, (int)blockIdx.x * split_len);
    const int n = min(total - base, split_len);
    const int first = n;
#elif PSA_SPEC
    // This CTA's chunk of the group's schedule, attended as one chunk with no decision when it
    // starts before the group's speculated positions (psa_spec_len); the others leave at once.
    const int n_all = (len + PSA_S - 1) / PSA_S, first_all = min(n_all, forced);
    const int first2_all = first_len ? min(n_all, first_all + __ldg(first_len + (long)b * Gn + g)) : first_all;
#if PSA_SPEC_PIECES > 1
    if (first_all == 0) {  // the request has no forced chunk: its forced CTA leaves, its first ranked chunk is entry 0
        if (spec_forced) return;
        chunk = 0;
    }
#endif
    const int base_c = chunk_start(chunk, first_all, first2_all, step);
    if (base_c >= min(n_all, spec_len ? __ldg(spec_len + (long)b * Gn + g) : first2_all)) return;
    const int n_c = chunk_end(base_c, first_all, first2_all, step, n_all) - base_c;
    // This CTA's positions [spec_off, spec_off + n) of the chunk (a piece, or all of it)
    const int spec_off = spec_piece_start(spec_piece, spec_npieces, n_c);
    const int base = base_c + spec_off, n = spec_piece_start(spec_piece + 1, spec_npieces, n_c) - spec_off;
    const int first = n;
    if (PSA_SPEC_PIECES > 1 && n <= 0) {
        // A piece that holds no position of the chunk (the counts never give more pieces than blocks): its partial
        // says so at once (no mass, no output), without the start that loads the query and the stream.
        constexpr int PW = PSA_D + 4;
        for (int idx = threadIdx.x; idx < PSA_G * PW; idx += blockDim.x) {
            const int h = idx / PW, d = idx % PW;
            partial[((((long)b * Hq + h0 + h) * spec_chunks + chunk) * PSA_SPEC_PIECES + spec_piece) * PW + d] =
                d == PSA_D ? -PSA_INF : d == PSA_D + 2 ? PSA_INF : 0.f;
        }
        return;
    }
#else
    constexpr int base = 0;
    const int n = (len + PSA_S - 1) / PSA_S;
    const int first = min(n, forced);
#endif
    // stop = sketch / sketch_avg: the next block's share test (sketch_avg: of an average block, c / n)
    const bool sketchy = stop == PSA_STOP_SKETCH || stop == PSA_STOP_SKETCH_AVG;
    const float next_share = stop == PSA_STOP_SKETCH_AVG ? sketch_share / (float)n : sketch_share;
#if PSA_FIRST_PREV
    // first_chunk="previous" (psa_ref.progressive.previous_first_chunk): first_len holds the blocks the group
    // attended at its previous call (0 before the first); the plan passes this layer's num_used itself, which this
    // launch overwrites when the group stops. The first ranked chunk ends one step short of where that call stopped
    // (none if that leaves no ranked block). An L2 load (the buffer is not read-only for the kernel's life), made
    // before the group's first barrier; the write comes after its last.
    const int prev = __ldcg(first_len + (long)b * Gn + g);
    const int first2 = min(n, first + max(0, prev - first - step));
#else
    // first_chunk: the ranked blocks of the first ranked chunk, per group (psa_first_chunk), or none
    const int first2 = first_len ? min(n, first + __ldg(first_len + (long)b * Gn + g)) : first;
#endif
    const int* orow = order ? order + ((long)b * Gn + g) * Nmax + base : nullptr;
    const int* btab = block_table + ((long)b * Hkv + kv) * Nmax;
#if PSA_STATEFUL
    const long gi = (long)b * Gn + g;
    int pos = istate[gi * 4], it = istate[gi * 4 + 1], why = istate[gi * 4 + 2];
    if (why >= 0) return;                          // stopped in an earlier launch: the whole cluster leaves
#if PSA_OFFLOAD
    const int lim = chunk_end(pos, first, first2, step, n);  // this launch attends [pos, lim) only
#define PSA_SLOT(blk) __ldg(slot_map + __ldg(btab + (blk)))
#define PSA_FIRST_POS(e) (e = lim, from + gw < lim ? from + gw : lim)
#else
    const int lim = n;                             // resume: the rest of the loop from chunk boundary pos
#define PSA_SLOT(blk) __ldg(btab + (blk))
#define PSA_FIRST_POS(e) first_position(gw, from, e, first, first2, step, n)
#endif
    const int from = pos;                          // the stream starts at the launch's chunk boundary
#else
    // spec: the chunk's index, so that only chunk 0's first block enters the moving average with weight 1
#if PSA_SPEC
    int pos = 0, it = chunk, why = -1;
#else
    int pos = 0, it = 0, why = -1;
#endif
    // Top-k reads only the first chunk of its order (psa_order_head writes no more): no prefetch past it.
    const int lim = stop == PSA_STOP_BUDGET ? min(n, step) : n;
#define PSA_SLOT(blk) __ldg(btab + (blk))
#define PSA_FIRST_POS(e) first_position(gw, from, e, first, first2, step, n)
    constexpr int from = 0;
#endif
#if PSA_PUSH_ON
    // The pushes' mbarriers: the decision's two (by the parity of this launch's decisions) and rank 0's finish, each
    // armed for its first phase before any CTA of the cluster may push into it (the cluster's arrival here, its wait
    // before the loop).
    __shared__ __align__(8) unsigned long long push_bar[3];
    constexpr unsigned int PUSH_STATS_BYTES = PSA_CLUSTER * PSA_G * sizeof(float4);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < 3; ++i) mbar_init(&push_bar[i], 1);
        mbar_expect(&push_bar[0], PUSH_STATS_BYTES);
        mbar_expect(&push_bar[1], PUSH_STATS_BYTES);
#if PSA_PUSH_FINISH_ON
        if (rank == 0) mbar_expect(&push_bar[2], PSA_CLUSTER * PSA_G * (PSA_D + 2) * sizeof(float));
#endif
        mbar_init_fence();
    }
    cluster_arrive_relaxed();
    int pushes = 0;  // decisions so far in this launch
#endif
    const int hh = lane >> 2;   // the row of this lane's fragments (token or channel; the head of Q's fragments)
    const int quad = lane & 3;  // its column pair within a tile: heads 2 quad, 2 quad + 1 (tokens or channels of B)
    kv_t* ring = reinterpret_cast<kv_t*>(dyn_smem) + warp * (PSA_STAGES * PSA_STAGE_HALVES);
    auto stage = [&](int element) { return ring + (element % PSA_STAGES) * PSA_STAGE_HALVES; };  // its K, then V

    // The kernel starts with two independent waits: the query's loads, and the chain that finds the first blocks
    // (the request's length -> their positions' order entries -> their block-table entries -> their copies). The
    // query's loads are issued first and used only after the first copies are issued, so the two overlap.
    // The query is lane (hh, quad)'s part of the B operand of S^T = K Q^T: head hh, channels 16 ks + 2 quad, + 1
    // (half 0) and + 8, + 9 (half 1); heads >= PSA_G are zero.
    float qx[PSA_KS][2][2];
#pragma unroll
    for (int ks = 0; ks < PSA_KS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            qx[ks][half][0] = qx[ks][half][1] = 0.f;
            if (hh < PSA_G) {
                const float2 x =
                    query_pair(q + ((long)b * Hq + h0 + hh) * PSA_D + ks * 16 + half * 8 + 2 * quad, q_mul);
                qx[ks][half][0] = x.x;
                qx[ks][half][1] = x.y;
            }
        }
    // Rows S..SP-1 of every stage are padding the MMA reads: zero them once.
    constexpr int pad_per = (PSA_SP - PSA_S) * PSA_NC;  // 16-byte chunks of padding per K or V tile
    for (int e = lane; pad_per > 0 && e < PSA_STAGES * 2 * pad_per; e += 32) {
        const int per = pad_per > 0 ? pad_per : 1;
        const int st = e / (2 * per), rest = e % (2 * per), kvh = rest / per, r = rest % per;
        *reinterpret_cast<uint4*>(ring + st * PSA_STAGE_HALVES + kvh * PSA_SP * PSA_D
                                  + (PSA_S + r / PSA_NC) * PSA_D + (r % PSA_NC) * 8) = make_uint4(0, 0, 0, 0);
    }
    __syncwarp();

#if PSA_STREAM_WINDOW
    // ---- the stream: the positions of the order this warp attends, in sequence (stream_position) ----
    // Entry m is held by lane m % 32 of window m / 32: its position, block and slot (block-table entry), loaded
    // by the lanes at once; two windows alternate between two sets of registers, and window w + 1 is loaded
    // when the consumer enters window w, so neither a copy nor the consumer waits on an order or block-table
    // load. (Loaded one entry a call ahead, a pair's second copy waited on both: a third of the paired loop's
    // stall samples at Llama 128K B = 1, ncu source counters, twenty-fifth session.)
    int w_pos0, w_blk0, w_slot0, w_pos1, w_blk1, w_slot1;
    auto load_window = [&](int w) {
        const int p = stream_position(32 * w + lane, from, gw, NW, first, first2, step, lim);
#if PSA_FUSED_FIRST
        // window 0 written by the placements (below n every position of it, so every p < lim); later ones loaded
        const int blk = p < lim ? (w == 0 ? fw_blk[warp][lane] : PSA_ORDER_AT(orow + p)) : 0;
        const int slot = p < lim ? (w == 0 ? fw_slot[warp][lane] : PSA_SLOT(blk)) : 0;
#else
        const int blk = p < lim ? (orow ? PSA_ORDER_AT(orow + p) : base + p) : 0;  // (past lim: unused, not loaded)
        const int slot = p < lim ? PSA_SLOT(blk) : 0;
#endif
        if (w & 1) {
            w_pos1 = p; w_blk1 = blk; w_slot1 = slot;
        } else {
            w_pos0 = p; w_blk0 = blk; w_slot0 = slot;
        }
    };
    // Entry m's value v (v0 in even windows, v1 in odd ones), m the same for every lane.
    auto entry = [&](int m, int v0, int v1) { return __shfl_sync(0xffffffffu, (m >> 5) & 1 ? v1 : v0, m & 31); };
#if PSA_EARLY_WINDOW_ON
    // The guessed windows (above) with the true n: the same chunk boundaries (the split's one chunk whatever its n; the
    // loop's where n reaches the guessed first ranked chunk) give the same positions below the true end and the end
    // past it, the same blocks and slots below it (the split: base = base_g wherever n > 0). Else: loaded again.
    if (PSA_SPLIT || (first == first_g && first2 == first2_g)) {
        w_pos0 = g_pos[0] < lim ? g_pos[0] : lim;
        w_pos1 = g_pos[1] < lim ? g_pos[1] : lim;
        w_blk0 = g_blk[0];
        w_blk1 = g_blk[1];
        w_slot0 = g_slot[0];
        w_slot1 = g_slot[1];
    } else {
        load_window(0);
        load_window(1);
    }
#else
    load_window(0);
    load_window(1);
#endif
#else
    // ---- the prefetch stream: positions of the order this warp will attend, in sequence ----
    int a_end = lim;                                                 // the end of a_pos's chunk
    int f_pos = PSA_FIRST_POS(a_end);                                // next position to load
    int f_blk = f_pos < lim ? (orow ? PSA_ORDER_AT(orow + f_pos) : base + f_pos) : 0;
    a_end = min(a_end, lim);
    int a_pos = f_pos < lim ? next_position(f_pos, a_end, gw, NW, first, first2, step, lim) : lim;  // the one after
    int a_blk = a_pos < lim ? (orow ? PSA_ORDER_AT(orow + a_pos) : base + a_pos) : 0;
    int f_slot = f_pos < lim ? PSA_SLOT(f_blk) : 0;
    const int a_slot = a_pos < lim ? PSA_SLOT(a_blk) : 0;  // the first two slots' loads in flight together
#endif
    int issued = 0;
    // A block's K (then V) is S x D halves, contiguous: lane l copies its 16-byte chunks l, l + 32, ... (row t =
    // e / NC, chunk c = e % NC of element e) to row t's swizzled chunk swz(t, c) of the stage. Where NC divides 32,
    // copy i of a lane reads at 16 l + 512 i bytes of the block and writes at (dst0 ^ X_i) + 512 i of the stage,
    // X_i = 16 ((32 i / NC) & SWZ) (its rows' bits of the swizzle; the lane's own are in dst0): one XOR and the
    // copies' immediate offsets, where the general form recomputed rows, chunks and swizzles for every copy.
    constexpr bool lane_copies = 32 % PSA_NC == 0 && (PSA_S * PSA_NC) % 32 == 0;
    const unsigned int dst0 = 2 * PSA_D * (lane / PSA_NC) + 16 * ((lane % PSA_NC) ^ ((lane / PSA_NC) & PSA_SWZ));
#if PSA_STREAM_WINDOW
    // issue(): copy the stream's next entry into the next stage (the argument serves the other stream).
    auto issue = [&](bool) {
        if (entry(issued, w_pos0, w_pos1) < lim) {
            const int slot = entry(issued, w_slot0, w_slot1);
#else
    // issue(known): copy the block at f_pos into the next stage, then advance the stream; the next block's slot
    // is a_slot where `known` (the prologue's first call), else loaded now (its order entry was, a call ago).
    auto issue = [&](bool known) {
        if (f_pos < lim) {
            const int slot = f_slot;
#endif
            const kv_t* kb = k_pool + (long)slot * (PSA_S * PSA_D);
            const kv_t* vb = v_pool + (long)slot * (PSA_S * PSA_D);
            const unsigned int st = smem_u32(stage(issued));
            if constexpr (lane_copies) {
                const char* kl = reinterpret_cast<const char*>(kb) + 16 * lane;
                const char* vl = reinterpret_cast<const char*>(vb) + 16 * lane;
#pragma unroll
                for (int i = 0; i < PSA_S * PSA_NC / 32; ++i) {
                    const unsigned int d = st + ((dst0 ^ (16u * ((i * (32 / PSA_NC)) & PSA_SWZ))) + 512 * i);
                    cp_async16(d, kl + 512 * i);
                    cp_async16(d + 2 * PSA_SP * PSA_D, vl + 512 * i);
                }
            } else {
#pragma unroll
                for (int e = lane; e < PSA_S * PSA_NC; e += 32) {
                    const int t = e / PSA_NC, c = e % PSA_NC;
                    cp_async16(st + 2 * (t * PSA_D + swz(t, c) * 8), kb + t * PSA_D + c * 8);
                    cp_async16(st + 2 * ((PSA_SP + t) * PSA_D + swz(t, c) * 8), vb + t * PSA_D + c * 8);
                }
            }
        }
        cp_async_commit();  // one group per element, empty past the end, so group counts stay aligned
        ++issued;
#if !PSA_STREAM_WINDOW
        f_pos = a_pos;      // advance: the slot load below was made possible by a_blk, loaded a step ago
        f_blk = a_blk;
        f_slot = known ? a_slot : f_pos < lim ? PSA_SLOT(f_blk) : 0;
        a_pos = f_pos < lim ? next_position(f_pos, a_end, gw, NW, first, first2, step, lim) : lim;
        a_blk = a_pos < lim ? (orow ? PSA_ORDER_AT(orow + a_pos) : base + a_pos) : 0;
#endif
    };
#pragma unroll
    for (int s = 0; s < PSA_STAGES - 1; ++s) issue(s == 0);
    PSA_LMARK(11);  // the first blocks' copies issued (their positions and block-table entries loaded)

    // The query, split into PSA_QPARTS parts.
    unsigned int qa[PSA_KS][PSA_QPARTS][2];
#pragma unroll
    for (int ks = 0; ks < PSA_KS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int p = 0; p < PSA_QPARTS; ++p) qa[ks][p][half] = pack_rest(qx[ks][half][0], qx[ks][half][1]);
    // A query of the KV's type scaled by a power of two (the host's q_mma) has no lo part: skip its products.
    unsigned int lo_bits = 0;
#pragma unroll
    for (int ks = 0; ks < PSA_KS; ++ks)
#pragma unroll
        for (int p = 1; p < PSA_QPARTS; ++p) lo_bits |= qa[ks][p][0] | qa[ks][p][1];
    const bool q_has_lo = __any_sync(0xffffffffu, lo_bits != 0);
    PSA_LMARK(10);  // the query is in registers

    // This warp's running output for the lane's heads 2 quad + e (e = 0, 1): max logit, mass relative to it,
    // and O^T = sum V^T p in the MMA accumulator layout (channel tile ct holds channels 16 ct + hh in
    // elements e and 16 ct + hh + 8 in elements 2 + e).
    float wm[2] = {-PSA_INF, -PSA_INF}, wl[2] = {0.f, 0.f};
    float oacc[PSA_D / 16][4];
#pragma unroll
    for (int ct = 0; ct < PSA_D / 16; ++ct) oacc[ct][0] = oacc[ct][1] = oacc[ct][2] = oacc[ct][3] = 0.f;

    // Chunk statistics per head, as float4 (max logit, mass relative to it, min log block mass, -):
    // each warp's, then each CTA's (read by the whole cluster, double-buffered by iteration parity).
    __shared__ float4 warp_stats[PSA_WARPS][PSA_G];
#if PSA_GRID
    __shared__ float4 grid_tot[PSA_G];  // the group's totals of an iteration (warp h's combine of head h)
    const long gid = (long)b * Gn + g;
#elif PSA_PUSH_ON
    __shared__ float4 cta_stats[2][PSA_CLUSTER][PSA_G];  // [parity][rank]: every CTA's totals, pushed by its warp 0
#else
    __shared__ float4 cta_stats[2][PSA_G];
#endif
    // Verifier state per head (verifier.cuh), kept identically by every lane of every warp.
    Verifier ver[PSA_G];
#pragma unroll
    for (int h = 0; h < PSA_G; ++h) {
#if PSA_STATEFUL
        const float* vs = vstate + ((long)b * Hq + h0 + h) * PSA_VSTATE;
        ver[h] = Verifier{vs[0], vs[1], vs[2], vs[3], vs[4]};
#else
        ver[h] = verifier_start();
#endif
    }

    // The consumer's view of the stream: the block of entry m (at `position`), the position of entry m (the one
    // after `after`, in a chunk ending at e), and the advance past the entries just consumed.
#if PSA_STREAM_WINDOW
    int consumed = 0, cur = entry(0, w_pos0, w_pos1);
    // After the entries from `consumed` up to `next` are consumed: the next one's position, and window w + 1
    // loaded when the consumer enters window w.
    auto advance = [&](int next) {
        if ((next >> 5) != (consumed >> 5)) load_window((next >> 5) + 1);
        cur = entry(next, w_pos0, w_pos1);
    };
#define PSA_BLOCK_AT(m, position) entry(m, w_blk0, w_blk1)
#define PSA_POSITION_AT(m, e, after) entry(m, w_pos0, w_pos1)
#define PSA_ADVANCE(next, after, e) advance(next)
#else
    int unused_end = 0;  // (the consumer takes its chunk ends from `end`, chunk by chunk)
    int cur = PSA_FIRST_POS(unused_end), consumed = 0;
#define PSA_POSITION_AT(m, e, after) next_position(after, e, gw, NW, first, first2, step, lim)
#define PSA_BLOCK_AT(m, position) (orow ? PSA_ORDER_AT(orow + (position)) : base + (position))
#define PSA_ADVANCE(next, after, e) cur = next_position(after, e, gw, NW, first, first2, step, lim)
#endif
    PSA_LMARK(1);
#if PSA_PUSH_ON
    cluster_wait();  // every CTA's mbarriers armed
#endif
    // Each pass attends chunk `it` = [pos, end), publishes its statistics and decides.
    while (why < 0) {
        PSA_LMARK(2);
        const int end = boundary_end(pos, first, first2, step, n);  // (pos: a chunk boundary)
        // This warp's share of the chunk for heads 2 quad + e (e = 0, 1): max logit, mass relative to it, min
        // log block mass, and (stop = ema) its blocks' terms of the moving average, relative to the same max.
        float cm[2] = {-PSA_INF, -PSA_INF}, cs[2] = {0.f, 0.f}, cmin[2] = {PSA_INF, PSA_INF}, ce[2] = {0.f, 0.f};
        // fold_block's coefficients are by position in the chunk [fpos, fpos + clen): the speculative build's whole
        // chunk, of which a piece holds [spec_off, spec_off + n) (the others: [pos, end))
#if PSA_SPEC
        const int fpos = pos - spec_off, clen = n_c;
#else
        const int fpos = pos, clen = end - pos;
#endif

        for (; cur < end; ++consumed) {
            const int j = PSA_BLOCK_AT(consumed, cur);
            __syncwarp();  // every lane is done reading the stages that issue() refills
            issue(false);  // blocks up to consumed + PSA_STAGES - 1 issued (the rule before every block or pair)
#if PSA_PAIR_ON
            if (issued < consumed + PSA_STAGES) issue(false);  // after a pair: its second stage refilled as well
            int e2 = min(end, lim);  // the end of the chunk of cur (and of cur2, if in it)
            const int cur2 = PSA_POSITION_AT(consumed + 1, e2, cur);
            if (cur2 < end) {
                // Two blocks of the chunk at once (twice the independent work a warp; the ring's third stage
                // loads meanwhile). The chunk's statistics take the blocks one by one in order, as the single
                // path does, so every decision is the same; the output moves to the pair's max once.
                const int j2 = PSA_BLOCK_AT(consumed + 1, cur2);
                cp_async_wait<PSA_STAGES - 2>();  // this lane's copies for `cur` and `cur2` have landed ...
                __syncwarp();                      // ... and so have every other lane's
                const kv_t* stk = stage(consumed);
                const kv_t* stk2 = stage(consumed + 1);
                float sacc[PSA_SP / 16][4], sacc2[PSA_SP / 16][4], bm[2], bs[2], bm2[2], bs2[2];
                block_logits(stk, qa, q_has_lo, min(PSA_S, len - j * PSA_S), qk_scale, lane, sacc, bm, bs);
                block_logits(stk2, qa, q_has_lo, min(PSA_S, len - j2 * PSA_S), qk_scale, lane, sacc2, bm2, bs2);
                fold_block(cur, fpos, clen, it, log_keep, ema_w, bm, bs, cm, cs, cmin, ce, sketchy, lmass,
                           (long)b * Hq + h0, Nmax, base, lane);
                fold_block(cur2, fpos, clen, it, log_keep, ema_w, bm2, bs2, cm, cs, cmin, ce, sketchy, lmass,
                           (long)b * Hq + h0, Nmax, base, lane);
                float top[2], c_new[2], c_new2[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) top[e] = fmaxf(bm[e], bm2[e]);
                move_max(top, wm, wl, oacc);
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    c_new[e] = __expf(bm[e] - wm[e]);
                    c_new2[e] = __expf(bm2[e] - wm[e]);
                    wl[e] += bs[e] * c_new[e] + bs2[e] * c_new2[e];
                }
                block_output(ring_v(stk), sacc, c_new, lane, oacc);
                block_output(ring_v(stk2), sacc2, c_new2, lane, oacc);
                e2 = min(end, lim);
                PSA_ADVANCE(consumed + 2, cur2, e2);
                ++consumed;  // the loop's increment adds the second
                continue;
            }
#endif
            cp_async_wait<PSA_STAGES - 1>();  // this lane's copies for `cur` have landed ...
            __syncwarp();                      // ... and so have every other lane's
            const kv_t* stk = stage(consumed);
            float sacc[PSA_SP / 16][4], bm[2], bs[2];
            block_logits(stk, qa, q_has_lo, min(PSA_S, len - j * PSA_S), qk_scale, lane, sacc, bm, bs);
            fold_block(cur, fpos, clen, it, log_keep, ema_w, bm, bs, cm, cs, cmin, ce, sketchy, lmass,
                       (long)b * Hq + h0, Nmax, base, lane);
            move_max(bm, wm, wl, oacc);
            float c_new[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                c_new[e] = __expf(bm[e] - wm[e]);
                wl[e] += bs[e] * c_new[e];
            }
            block_output(ring_v(stk), sacc, c_new, lane, oacc);
            int e1 = min(end, lim);
            PSA_ADVANCE(consumed + 1, cur, e1);
        }

#if PSA_SPLIT && PSA_SPLIT_LEAVE
        // The split build attends one chunk and decides nothing (psa_merge_splits writes the diagnostics): it leaves
        // here, without the verifier's two barriers and its combine, which otherwise sit in every CTA's tail. (Tried
        // in the eighteenth session for every head dim: Llama's dense at 32K B = 1 42.7 against 44.3 µs, but Gemma 3's
        // D 256 slower at every batch, cause not found; that was before the rings were aligned, s32.)
        why = PSA_REASON_EXHAUSTED;
        pos = end;
        break;
#endif
#if PSA_DECIDE_PREFETCH_ON
        if (warp == PSA_WARPS - 1)
            decide_prefetch(ordered, log_suffix, (long)b * Hq + h0, Nmax, first, end, n, sketch_window, sketchy,
                            stop == PSA_STOP_CERTIFIED || sketchy);
#endif
        // ---- verifier: combine the chunk's statistics over warps, then over the cluster ----
        // First the chunk's statistics (and, grid build, every warp's output terms as they stand) are published where
        // the group reads them; then the group's totals of chunk `it` = [pos, end) are read and the rule decides.
        {
#if PSA_GRID
            // This warp's output terms as they stand (its unnormalised output, max logit and mass relative to it), as
            // if the loop stopped here: the group's barrier below publishes them with the chunk's statistics, so a CTA
            // that leaves the loop combines every warp's entry at once with no barrier of its own (the finish, below).
            // An iteration that goes on overwrites them before its barrier; nobody reads them unless the group stops.
            // (PSA_GRID_TAGS: one barrier at the stop publishes them; written here all the same, so that they have
            // landed by the time its release waits for them.)
            {
                float* part = xpart + (gid * NW + gw) * (PSA_G * (PSA_D + 4));
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int h = 2 * quad + e;
                    if (h < PSA_G) {
                        float* ph = part + h * (PSA_D + 4);
#pragma unroll
                        for (int ct = 0; ct < PSA_D / 16; ++ct) {
                            __stcg(ph + 16 * ct + hh, oacc[ct][e]);
                            __stcg(ph + 16 * ct + hh + 8, oacc[ct][e + 2]);
                        }
                        if (hh == 0) {
                            __stcg(ph + PSA_D, wm[e]);
                            __stcg(ph + PSA_D + 1, wl[e]);
                        }
                    }
                }
            }
#endif
            if (hh == 0)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (2 * quad + e < PSA_G)
                        warp_stats[warp][2 * quad + e] = make_float4(cm[e], cs[e], cmin[e], ce[e]);
            PSA_LADD(3, 2);
            PSA_LMARK(2);
            __syncthreads();
            if (warp == 0 && lane < PSA_G) {
                float4 w[PSA_WARPS];
#pragma unroll
                for (int i = 0; i < PSA_WARPS; ++i) w[i] = warp_stats[i][lane];
                float4 t = make_float4(-PSA_INF, 0.f, PSA_INF, 0.f);
#pragma unroll
                for (int i = 0; i < PSA_WARPS; ++i) t = combine_stats(t, w[i]);
#if PSA_GRID_TAGS_ON
                xstats_publish(xstats + xstat_entry(gid, it, rank, lane) * PSA_XSTAT_ELEMS, t, it + 1);
#elif PSA_GRID
                xstats[xstat_entry(gid, it, rank, lane)] = t;
#elif PSA_PUSH_ON
#pragma unroll
                for (int r = 0; r < PSA_CLUSTER; ++r)
                    push4(&cta_stats[pushes & 1][rank][lane], r, t, &push_bar[pushes & 1]);
#else
                cta_stats[it & 1][lane] = t;
#endif
            }
        }
        {
#if PSA_DECIDE_OVERLAP_ON
            float dec_x[2 * PSA_G], dec_next[PSA_G];  // the sketch window's inputs, loaded early (-inf unless sketchy)
#pragma unroll
            for (int i = 0; i < 2 * PSA_G; ++i) dec_x[i] = -PSA_INF;
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) dec_next[h] = -PSA_INF;
#endif
#if PSA_GRID_TAGS_ON
            // (no barrier: the combine below polls the statistics' words themselves)
#elif PSA_GRID
            group_sync(xcount + 2 * gid, PSA_GRID * (it + 1));
#elif PSA_PUSH_ON
            mbar_wait(&push_bar[pushes & 1], (pushes >> 1) & 1);
            // armed again for the decision after next: no thread of this CTA still waits for this phase when a push
            // of that one lands (it follows this CTA's own push of the next decision, after a __syncthreads)
            if (threadIdx.x == 0) mbar_expect(&push_bar[pushes & 1], PUSH_STATS_BYTES);
#else
            cluster_sync();
#endif
#if PSA_DECIDE_OVERLAP_ON
            if (sketchy)  // (reduced after the statistics' combine)
                sketch_window_load(lmass, ordered, (long)b * Hq + h0, Nmax, first, end, n, sketch_window, dec_x,
                                   dec_next);
#endif
#if PSA_GRID
            // Warp h (warps take the heads round-robin) combines head h's C totals: lane l those of ranks l, l + 32,
            // ... in order, then the lanes pairwise by halves; lane 0's total goes to shared memory for every warp.
            for (int h = warp; h < PSA_G; h += PSA_WARPS) {
                float4 t = make_float4(-PSA_INF, 0.f, PSA_INF, 0.f);
                for (int r = lane; r < PSA_GRID; r += 32) {
                    const long at = xstat_entry(gid, it, r, h);
#if PSA_GRID_TAGS_ON
                    t = combine_stats(t, xstats_await(xstats + at * PSA_XSTAT_ELEMS, it + 1));
#else
                    t = combine_stats(t, __ldcg(xstats + at));
#endif
                }
#pragma unroll
                for (int m = 16; m > 0; m >>= 1) {
                    const float4 o = make_float4(__shfl_down_sync(0xffffffffu, t.x, m),
                                                 __shfl_down_sync(0xffffffffu, t.y, m),
                                                 __shfl_down_sync(0xffffffffu, t.z, m),
                                                 __shfl_down_sync(0xffffffffu, t.w, m));
                    t = combine_stats(t, o);  // (lanes >= 32 - m combine a stale copy: only lane 0's chain is used)
                }
                if (lane == 0) grid_tot[h] = t;
            }
            __syncthreads();
#endif
#if PSA_SPEC
            why = PSA_REASON_EXHAUSTED;  // one chunk, no decision: psa_spec_verify decides over the chunks
            break;
#endif
            PSA_LADD(4, 2);
            PSA_LMARK(2);
            // Every warp reads the cluster's CTA totals (lane h, all ranks at once: one round trip) and
            // combines them in rank order, so every warp reaches the same decision without another barrier.
            // Lane h (< PSA_G) makes head h's totals `lt`: the cluster's CTA totals combined in rank order, or the
            // grid's.
            float4 lt = make_float4(-PSA_INF, 0.f, PSA_INF, 0.f);
#if PSA_GRID
            lt = grid_tot[lane < PSA_G ? lane : 0];
#else
            if (lane < PSA_G) {
                float4 c[PSA_CLUSTER];
#pragma unroll
                for (int r = 0; r < PSA_CLUSTER; ++r)
#if PSA_PUSH_ON
                    c[r] = cta_stats[pushes & 1][r][lane];
#else
                    c[r] = dsmem_load4(&cta_stats[it & 1][lane], r);
#endif
#pragma unroll
                for (int r = 0; r < PSA_CLUSTER; ++r) lt = combine_stats(lt, c[r]);
            }
#if PSA_PUSH_ON
            ++pushes;
#endif
#endif
            // (every lane decides every head: the heads' totals from shared memory (grid) or from their lanes)
            float tm[PSA_G], ts[PSA_G], tmin[PSA_G], te[PSA_G];
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
#if PSA_GRID
                const float4 t = grid_tot[h];
                tm[h] = t.x;
                ts[h] = t.y;
                tmin[h] = t.z;
                te[h] = t.w;
#else
                tm[h] = __shfl_sync(0xffffffffu, lt.x, h);
                ts[h] = __shfl_sync(0xffffffffu, lt.y, h);
                tmin[h] = __shfl_sync(0xffffffffu, lt.z, h);
                te[h] = __shfl_sync(0xffffffffu, lt.w, h);
#endif
            }
            PSA_LADD(5, 2);
            PSA_LMARK(2);
            // stop = sketch / sketch_avg: the calibration window's sums and the next block's sketch mass.
            float w_true[PSA_G], w_sketch[PSA_G], next_sketch[PSA_G];
#if PSA_DECIDE_OVERLAP_ON
            // (unconditional, on -inf where the rule is not a sketch rule: under `if (sketchy)` Gemma 3's builds spill
            // 84-140 bytes instead of 12-44)
            sketch_window_reduce(dec_x, w_true, w_sketch);
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) next_sketch[h] = dec_next[h];
#else
            if (sketchy)
                sketch_window_sums(lmass, ordered, (long)b * Hq + h0, Nmax, first, end, n, sketch_window, w_true,
                                   w_sketch, next_sketch);
#endif
            PSA_LADD(6, 2);
            PSA_LMARK(2);
            bool all_hold = true;
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) {
                const bool tail = stop == PSA_STOP_CERTIFIED || sketchy;
                const float log_tail = tail ? __ldg(log_suffix + ((long)b * Hq + h0 + h) * (Nmax + 1) + end) : 0.f;
                const bool hold = verify_step(ver[h], tm[h], ts[h], tmin[h], te[h], end - pos, end, first, n, stop,
                                              threshold, log_keep, log_tail, sketchy ? w_true[h] : 0.f,
                                              sketchy ? w_sketch[h] : 0.f, sketchy ? next_sketch[h] : 0.f, next_share);
                all_hold = all_hold && hold;
            }
            if (stop == PSA_STOP_BUDGET) why = PSA_REASON_BUDGET;
            else if (end >= n) why = PSA_REASON_EXHAUSTED;
            else if (stop != PSA_STOP_NONE && all_hold) why = PSA_REASON_THRESHOLD;
            pos = end;
            ++it;
            PSA_LADD(7, 2);
#if PSA_LOOP_CLOCK
            if (rank == 0 && threadIdx.x == 0) lclk[9] += 1;
#endif
        }
#if PSA_OFFLOAD
        break;  // one iteration per launch
#endif
    }
    PSA_LMARK(8);
#if PSA_GRID_TAGS_ON
    // The warps' output terms of the last iteration, published by the group's one counter barrier of the launch (its
    // release orders them before the arrival; the finish reads them after the wait's acquire).
    group_arrive(xcount + 2 * gid);
#endif
    cp_async_wait_all();  // prefetches past the stop land before the ring is reused below (grid: before the CTA leaves)
#if PSA_GRID_TAGS_ON
    group_wait(xcount + 2 * gid, PSA_GRID);
#endif
    PSA_LMARK(12);
#if PSA_GRID
    // ---- the group's output from every warp's entry of the last iteration (written before its barrier) ----
    // Each CTA makes its share of the G x D output channels, FV at a time (a float4 where the share allows), FS
    // threads of one warp a share's piece: each loads its run of the NW entries (the max, mass and the piece's
    // output terms, all in flight at once), the FS threads make the head's max by halves, weight their entries and
    // add them in order, and the sums meet by halves. One round trip after the loop's barrier, no shared memory and
    // no barrier of the group or the CTA: every CTA saw the same decision. Until the thirty-second session each CTA
    // combined its warps in shared memory, wrote its terms and passed one more barrier of the group before this
    // (5.8 µs of one Gemma 3 request's 17.4 µs loop, NOTES.md s31e).
    {
        constexpr int HS = PSA_D + 4, STRIDE = PSA_G * HS;  // floats a head (D outputs, max, mass, 2 unused), an entry
        constexpr int per_cta = (PSA_G * PSA_D + PSA_GRID - 1) / PSA_GRID;  // output channels a CTA
        constexpr int FV = per_cta % 4 == 0 ? 4 : 1;                          // channels a thread
        constexpr int T = PSA_WARPS * 32, FS = grid_finish_threads(T, per_cta / FV), EPT = (NW + FS - 1) / FS;
        constexpr int ROUNDS = (per_cta / FV + T / FS - 1) / (T / FS);
        static_assert(EPT <= 64, "a thread's entries in registers");
        const float* part0 = xpart + gid * NW * STRIDE;
        const int out_lo = min(PSA_G * PSA_D, (int)rank * per_cta), out_hi = min(PSA_G * PSA_D, out_lo + per_cta);
        const int sub = threadIdx.x % FS;
        PSA_LMARK(13);
        for (int k = 0; k < ROUNDS; ++k) {  // the same count for every lane (the shuffles below)
            const int idx = out_lo + (k * (T / FS) + (int)threadIdx.x / FS) * FV;
            const bool live = idx < out_hi;  // (FV divides per_cta, so the piece is all in or all out)
            const int h = live ? idx / PSA_D : 0, d = live ? idx % PSA_D : 0;
            float m[EPT], l[EPT], o[EPT][FV];
#pragma unroll
            for (int i = 0; i < EPT; ++i) {
                const int e = sub * EPT + i;
                const float* p = part0 + e * STRIDE + h * HS;
                const bool in = live && e < NW;
                const float2 ml = in ? __ldcg(reinterpret_cast<const float2*>(p + PSA_D)) : make_float2(-PSA_INF, 0.f);
                m[i] = ml.x;
                l[i] = ml.y;
                if constexpr (FV == 4) {
                    const float4 v = in ? __ldcg(reinterpret_cast<const float4*>(p + d))
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
                    o[i][0] = v.x; o[i][1] = v.y; o[i][2] = v.z; o[i][3] = v.w;
                } else {
                    o[i][0] = in ? __ldcg(p + d) : 0.f;
                }
            }
            float M = -PSA_INF;
#pragma unroll
            for (int i = 0; i < EPT; ++i) M = fmaxf(M, m[i]);
#pragma unroll
            for (int sh = FS / 2; sh > 0; sh >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, sh));
            float L = 0.f, O[FV];
#pragma unroll
            for (int v = 0; v < FV; ++v) O[v] = 0.f;
#pragma unroll
            for (int i = 0; i < EPT; ++i) {
                if (m[i] == -PSA_INF) continue;  // a warp that attended nothing (or no entry)
                const float w = __expf(m[i] - M);
                L += l[i] * w;
#pragma unroll
                for (int v = 0; v < FV; ++v) O[v] += o[i][v] * w;
            }
#pragma unroll
            for (int sh = FS / 2; sh > 0; sh >>= 1) {
                L += __shfl_xor_sync(0xffffffffu, L, sh);
#pragma unroll
                for (int v = 0; v < FV; ++v) O[v] += __shfl_xor_sync(0xffffffffu, O[v], sh);
            }
            if (live && sub == 0) {
                float* dst = out + ((long)b * Hq + h0 + h) * PSA_D + d;
                if constexpr (FV == 4)
                    *reinterpret_cast<float4*>(dst) = make_float4(O[0] / L, O[1] / L, O[2] / L, O[3] / L);
                else
                    *dst = O[0] / L;
            }
        }
        PSA_LMARK(14);  // (the marks of the cluster builds' warps' combine and end barrier: none here)
        PSA_LMARK(15);
        if (threadIdx.x == 0 && rank == 0) {  // (the grid build's loop ends only with a reason)
            const long gi = (long)b * Gn + g;
            num_used[gi] = pos;
            iterations[gi] = it;
            reason[gi] = why;
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) mass_est[(long)b * Hq + h0 + h] = ver[h].frac;
        }
    }
#else

    // ---- merge the warps' outputs: warps of a CTA, then CTAs of the cluster ----
    __syncthreads();  // every warp is done with its ring
    float* f_o = reinterpret_cast<float*>(dyn_smem);  // [PSA_WARPS][PSA_G][PSA_D], reusing the rings
    __shared__ float f_m[PSA_WARPS][PSA_G], f_l[PSA_WARPS][PSA_G];
    __shared__ float c_m[PSA_G], c_l[PSA_G];
    __shared__ __align__(PSA_PUSH_FINISH_ON ? 16 : 4) float c_o[PSA_G][PSA_D];  // (pushed as float4)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = 2 * quad + e;
        if (h < PSA_G) {
#pragma unroll
            for (int ct = 0; ct < PSA_D / 16; ++ct) {
                f_o[(warp * PSA_G + h) * PSA_D + 16 * ct + hh] = oacc[ct][e];
                f_o[(warp * PSA_G + h) * PSA_D + 16 * ct + hh + 8] = oacc[ct][e + 2];
            }
            if (hh == 0) { f_m[warp][h] = wm[e]; f_l[warp][h] = wl[e]; }
        }
    }
    __syncthreads();
    combine_warps(f_m, f_l, f_o, c_m, c_l, c_o);
    PSA_LMARK(13);
#if PSA_SPLIT || PSA_SPEC
    // One CTA per split (per chunk): its heads' unnormalised output and log-sum-exp terms (max logit, mass
    // relative to it) for psa_merge_splits; the speculative build adds the chunk's lightest block's log-mass
    // and moving-average terms (relative to the same max: the max of the same block maxima) for
    // psa_spec_verify.
    constexpr int PW = PSA_D + (PSA_SPEC ? 4 : 2);
    __syncthreads();
    for (int idx = threadIdx.x; idx < PSA_G * PW; idx += blockDim.x) {
        const int h = idx / PW, d = idx % PW;
#if PSA_SPEC
        float* dst = partial + ((((long)b * Hq + h0 + h) * spec_chunks + chunk) * PSA_SPEC_PIECES + spec_piece) * PW;
#else
        float* dst = partial + (((long)b * Hq + h0 + h) * gridDim.x + blockIdx.x) * PW;
#endif
        dst[d] = d < PSA_D ? c_o[h][d] : d == PSA_D ? c_m[h] : d == PSA_D + 1 || !PSA_SPEC ? c_l[h]
               : d == PSA_D + 2 ? cta_stats[it & 1][h].z : cta_stats[it & 1][h].w;
    }
    return;
#endif
#if PSA_PUSH_FINISH_ON
    // every CTA's terms into rank 0's r_ml[rank], r_o[rank] (rank 0's own as well); rank 0 waits for all of them
    __shared__ __align__(16) float r_o[PSA_CLUSTER][PSA_G * PSA_D];
    __shared__ __align__(8) float2 r_ml[PSA_CLUSTER][PSA_G];
    __syncthreads();  // c_m, c_l, c_o complete
    for (int i = threadIdx.x; i < PSA_G * PSA_D / 4; i += blockDim.x)
        push4(&r_o[rank][4 * i], 0, reinterpret_cast<const float4*>(&c_o[0][0])[i], &push_bar[2]);
    if (threadIdx.x < PSA_G) push2(&r_ml[rank][threadIdx.x], 0, make_float2(c_m[threadIdx.x], c_l[threadIdx.x]),
                                   &push_bar[2]);
    if (rank == 0) mbar_wait(&push_bar[2], 0);
#else
    cluster_sync();
#endif
    PSA_LMARK(14);
    if (rank == 0) {
#if PSA_OFFLOAD
        // Fold this iteration's output into the running one kept in vstate (read every running
        // max and mass before any thread overwrites them).
        float new_m[PSA_G], new_l[PSA_G];
#endif
        for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x) {
            const int h = idx / PSA_D, d = idx % PSA_D;
#if PSA_PUSH_FINISH_ON
            float rm[PSA_CLUSTER], rl[PSA_CLUSTER], ro[PSA_CLUSTER];
#pragma unroll
            for (int r = 0; r < PSA_CLUSTER; ++r) {
                rm[r] = r_ml[r][h].x;
                rl[r] = r_ml[r][h].y;
                ro[r] = r_o[r][h * PSA_D + d];
            }
            const float3 mlo = cluster_terms(rm, rl, ro);
#else
            const float3 mlo = cluster_combine(&c_m[h], &c_l[h], &c_o[h][d]);
#endif
            float L = mlo.y, O = mlo.z;
#if PSA_STATEFUL
            const float M = mlo.x;
            float* vs = vstate + ((long)b * Hq + h0 + h) * PSA_VSTATE;
            const float pm = vs[5], pl = vs[6], nm = fmaxf(pm, M);
            const float ep = pm == -PSA_INF ? 0.f : __expf(pm - nm), ec = M == -PSA_INF ? 0.f : __expf(M - nm);
            O = vs[7 + d] * ep + O * ec;
            L = pl * ep + L * ec;
#if PSA_OFFLOAD
            if (d == 0) { new_m[h] = nm; new_l[h] = L; }
            if (why < 0) { vs[7 + d] = O; continue; }
#endif
#endif
            out[((long)b * Hq + h0 + h) * PSA_D + d] = O / L;
        }
        PSA_LMARK(15);
#if PSA_OFFLOAD
        __syncthreads();  // every thread has read vs[5], vs[6]
        for (int idx = threadIdx.x; idx < PSA_G * PSA_D; idx += blockDim.x)
            if (idx % PSA_D == 0) {
                const int h = idx / PSA_D;
                float* vs = vstate + ((long)b * Hq + h0 + h) * PSA_VSTATE;
                vs[0] = ver[h].M; vs[1] = ver[h].acc; vs[2] = ver[h].min; vs[3] = ver[h].ema; vs[4] = ver[h].frac;
                vs[5] = new_m[h]; vs[6] = new_l[h];
            }
        if (threadIdx.x == 0) {
            istate[gi * 4] = pos;
            istate[gi * 4 + 1] = it;
            istate[gi * 4 + 2] = why;
        }
#endif
        if (threadIdx.x == 0 && why >= 0) {
            const long gi = (long)b * Gn + g;
            num_used[gi] = pos;
            iterations[gi] = it;
            reason[gi] = why;
        }
        if (threadIdx.x == 0 && why >= 0)
#pragma unroll
            for (int h = 0; h < PSA_G; ++h) mass_est[(long)b * Hq + h0 + h] = ver[h].frac;
#if PSA_OFFLOAD
        if (threadIdx.x == 0 && why >= 0 && atomicSub(groups_left, 1) == 1) {  // the batch's last group to stop
            __threadfence_system();
            *done_host = *token;
        }
#endif
    }
#endif
#if PSA_GRID
    // The group's last CTA out resets the counters and the statistics to zero (every CTA has left the barriers), so
    // that each launch leaves them as the first found them: with PSA_GRID_TAGS a later launch's reader of either
    // parity must never take a word this launch left for a tag of its own (0 is no tag), and a build without tags (the
    // sketch rules') may share the buffers with one that has them. Every other CTA had read its last statistics before
    // it counted itself out (its leaving depends on their values), so the zeros reach no reader of this launch.
    __shared__ bool last_out;
    if (threadIdx.x == 0) {
        constexpr int OUT = 1;  // (the entry that counts the CTAs out; the arrivals' before it)
        unsigned int* counters = xcount + PSA_XCOUNT * gid;
        unsigned int before;
        asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counters + OUT) : "memory");
        last_out = before == PSA_GRID - 1;
        if (last_out)
#pragma unroll
            for (int i = OUT; i >= 0; --i) counters[i] = 0;
    }
    __syncthreads();
    if (last_out) {
        constexpr int ENTRIES = PSA_XSTATS * PSA_GRID * PSA_G;  // the group's (iteration parity, CTA, head) entries
        constexpr int PAIRS = ENTRIES * PSA_XSTAT_ELEMS * sizeof(xstat_t) / 16;  // 16-byte stores
        ulonglong2* words = reinterpret_cast<ulonglong2*>(xstats + gid * ENTRIES * PSA_XSTAT_ELEMS);
        for (int i = threadIdx.x; i < PAIRS; i += blockDim.x) words[i] = make_ulonglong2(0ull, 0ull);
    }
#endif
#if PSA_LOOP_CLOCK
    if (rank == 0 && threadIdx.x == 0) {
        const long long t_end = clock64();
        long long* ck = loop_clocks + ((long)b * Gn + g) * 18;
        ck[0] = t_end - lclk[0];
        ck[1] = lclk[1] - lclk[0];
        ck[2] = lclk[3];
        ck[3] = lclk[4];
        ck[4] = lclk[5];
        ck[5] = lclk[6];
        ck[6] = lclk[7];
        ck[7] = t_end - lclk[8];
        ck[8] = lclk[9];
        ck[9] = 1;
        ck[10] = lclk[10] - lclk[0];
        ck[11] = lclk[11] - lclk[0];
        for (int i = 12; i < 16; ++i) ck[i] = lclk[i] - lclk[8];  // the finish's marks, from its start
        ck[16] = lclk[16];
        ck[17] = globaltimer_ns();
    }
#endif
#if !PSA_PUSH_FINISH_ON
    cluster_sync();  // no CTA leaves while rank 0 may still read its shared memory
#endif
}

#if PSA_SPLIT
// Combine the splits of psa_decode's split build: per (request, query head), the output
// sum_s O_s e^(m_s - M) / sum_s l_s e^(m_s - M), M = max_s m_s; and per group the diagnostics the
// one-CTA build writes (every position attended, one iteration; `why` is exhausted or budget).
// Grid (Hq, B, PSA_D / PSA_MC): a CTA takes PSA_MC channels (32, or 16 where D is an odd multiple of 16) of one head;
// its blockDim.x / 32 warps take the splits round-robin, lane c channel c. A warp loads a batch of PSA_MERGE_BATCH
// splits at once (each split's max and mass, the same words for every lane, and its row segment) and folds them
// into a running max, mass and output (rescaled when the max grows), so one pass over the splits with a batch in
// flight; the warps' terms meet in shared memory, added in warp order.
//
// The launch fits the batch to a warp's share of the splits (_kernels.MERGE_BATCH_FIT): every slot is unrolled code,
// and a batch of 32 ran 1,290 instructions a warp for Llama's 2 (ncu, thirty-sixth session). Fitted: 2.2 us at 16
// splits (Llama-3.1-8B, one request at 32K), 2.8 at 132 (SmolLM2), profiler, H200, thirty-seventh session.
// Version 4: 3.3 us at 132 splits, 2.9 at 16 (H200). Version 3 (the same CTAs) made three dependent passes over the
// splits (the max, then the weights into shared memory, then the sums, four loads in flight a lane): 5.6-5.8 us at 132
// splits (SmolLM2 and Gemma 3 one request at 32K), 2.8 at 16 (Llama-3.1-8B). Version 2 gave a CTA the whole head (PSA_D
// threads, each walking every split): at B = 1 with one KV head that is 4 CTAs reading 132 splits each, 10.2 us of a
// 28.7 us dense step (Gemma 3, 32K, benchmarks/NOTES.md). Version 1 walked the splits with dependent loads (~0.3 us a
// split).
#define PSA_MC (PSA_D % 32 == 0 ? 32 : 16)  // PSA_D is a multiple of 16
#ifndef PSA_MERGE_BATCH
#define PSA_MERGE_BATCH 32  // splits a warp has in flight (_kernels.MERGE_BATCH)
#endif
extern "C" __global__ void __launch_bounds__(256)
psa_merge_splits(const float* __restrict__ partial, const int* __restrict__ seq_lens, float* __restrict__ out,
                 int* __restrict__ num_used, int* __restrict__ iterations, int* __restrict__ reason,
                 float* __restrict__ mass_est, int splits, int step, int why) {
    __shared__ float s_m[8], s_l[8], s_o[8][PSA_MC];
    const int h = blockIdx.x, b = blockIdx.y, Hq = gridDim.x, c0 = blockIdx.z * PSA_MC;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const bool mine = lane < PSA_MC;  // this lane has a channel
    constexpr int PW = PSA_D + 2;
    const float* row = partial + ((long)b * Hq + h) * splits * PW;
    float M = -PSA_INF, L = 0.f, O = 0.f;  // this warp's running max, mass and output relative to M
    for (int first = warp; first < splits; first += nw * PSA_MERGE_BATCH) {
        float m[PSA_MERGE_BATCH], l[PSA_MERGE_BATCH], o[PSA_MERGE_BATCH];
#pragma unroll
        for (int j = 0; j < PSA_MERGE_BATCH; ++j) {
            const int sp = first + j * nw;
            const float* r = row + (long)sp * PW;
            m[j] = sp < splits ? __ldg(r + PSA_D) : -PSA_INF;
            l[j] = sp < splits ? __ldg(r + PSA_D + 1) : 0.f;
            o[j] = sp < splits && mine ? __ldg(r + c0 + lane) : 0.f;
        }
        float bm = M;
#pragma unroll
        for (int j = 0; j < PSA_MERGE_BATCH; ++j) bm = fmaxf(bm, m[j]);
        if (bm == -PSA_INF) continue;  // nothing attended in any split so far
        const float keep = M == -PSA_INF ? 0.f : __expf(M - bm);
        L *= keep;
        O *= keep;
#pragma unroll
        for (int j = 0; j < PSA_MERGE_BATCH; ++j) {  // a split with nothing attended adds nothing
            const float w = m[j] == -PSA_INF ? 0.f : __expf(m[j] - bm);
            L = fmaf(w != 0.f ? l[j] : 0.f, w, L);
            O = fmaf(w != 0.f ? o[j] : 0.f, w, O);
        }
        M = bm;
    }
    if (lane == 0) { s_m[warp] = M; s_l[warp] = L; }
    if (mine) s_o[warp][lane] = O;
    __syncthreads();
    if (warp == 0 && mine) {
        float gm = -PSA_INF;
        for (int w = 0; w < nw; ++w) gm = fmaxf(gm, s_m[w]);
        float o = 0.f, l = 0.f;
        for (int w = 0; w < nw; ++w) {
            const float e = s_m[w] == -PSA_INF ? 0.f : __expf(s_m[w] - gm);
            o = fmaf(s_o[w][lane], e, o);
            l = fmaf(s_l[w], e, l);
        }
        out[((long)b * Hq + h) * PSA_D + c0 + lane] = o / l;
    }
    if (threadIdx.x == 0 && blockIdx.z == 0) {
        mass_est[(long)b * Hq + h] = 1.f;
        if (h % PSA_G == 0) {
            const long gi = (long)b * (Hq / PSA_G) + h / PSA_G;
            num_used[gi] = min((seq_lens[b] + PSA_S - 1) / PSA_S, step);
            iterations[gi] = 1;
            reason[gi] = why;
        }
    }
}
#endif
