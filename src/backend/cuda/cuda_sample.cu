/* cuda_sample.cu - pick_rows: the next token of each logits row on the device
 * (greedy, temperature, top-k, top-p, repetition penalty), picking exactly the token
 * the host sampler (src/model/sampler.c) would pick from the same row and uniform draw.
 * Tested by tests/cuda/test_cuda_ops.c (test_pick_rows: against sampler_pick_u on
 * random rows, ties, NaNs and the limits of top-k / top-p) and by test_cuda_golden
 * (tokens picked on the device against the host sampler on the same step's logits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cooperative_groups.h>

#include "cuda_internal.cuh"

namespace cg = cooperative_groups;

/* ---- pick_rows: the next token of each row, a cluster of PICK_C blocks of 1024 per
 * row, each block on a slice of it: what sampler.c's sampler_pick_u makes of it.
 * Greedy (temperature <= 0): (value, index) pairs reduce so that the larger value wins
 * and equal ones go to the lower index; NaNs never win, and a NaN in column 0 stands
 * (sampler_argmax's rules).
 * Otherwise the weights are e = exp((x - max) / T), 0 more than SAMPLER_CUT below (a
 * NaN included), and the pick is the inverse CDF at u of the kept tokens' weights, ids
 * ascending (pick_draw).
 * The row is read several times, so every pass loads float4s with several in flight
 * per thread (with one float at a time a single block's pass was latency-bound, ~50 us
 * at V3's vocabulary), and a cluster spreads the passes over PICK_C SMs: the blocks
 * combine their argmaxes, sums and histograms through distributed shared memory.
 * With top-k or top-p the kept tokens are the first ones in the order probability
 * (p = e / total) descending, then id ascending, up to the first where their count
 * reaches k or their mass reaches top_p. That order is the key (p's float bits, then
 * V - 1 - id) descending, and a radix select finds the last kept key: each level
 * histograms the next digit of the keys that share the digits fixed so far (counts and
 * masses) and takes the largest digit at which the limit is met. The first level's
 * digit is the host's bucket (p's bits >> 19: its exponent field e and the top 4 of
 * its 23 fraction bits); when that bucket holds at most PICK_LIST tokens they move to
 * rank 0's shared memory for the later levels, else rank 0 reads the whole row again
 * for each. The draw then weighs the kept tokens by p.
 * Masses add exactly, in any order, with 32-bit shared atomics only (64-bit ones are
 * compare-and-swap loops, which contend): within a bucket every p is its 24-bit
 * significand times 2^(e - 150), so a set's mass there is its count times the bucket's
 * base significand plus the sum of the 19 low bits, kept as two sums (bits 10..18 and
 * 0..9) that cannot overflow. For comparing with top_p a mass becomes a fixed point
 * number, units of 2^-62 (exact where p >= 2^-39). */
#define PICK_MAXN 64
#define PICK_CUT (-40.0f)              /* SAMPLER_CUT */
#define PICK_BINS 2048                 /* the first level: p's float bits >> 19, p <= 1 */
#define PICK_LIST 2560                 /* a first-level bucket's tokens in shared memory */
#define PICK_FIX 4611686018427387904.0 /* 2^62: top_p in the masses' fixed point */
#define PICK_C 8                       /* blocks per row: a cluster, each on a slice */

struct pick_args {
    ds_pick p[PICK_MAXN];
    int hoff[PICK_MAXN];  /* row i's penalised tokens: hd[hoff[i]] .. (p[i].n_hist of them) */
    const int32_t *hd;
};

struct pick_smem {
    unsigned cnt[PICK_BINS], shi[PICK_BINS], slo[PICK_BINS]; /* count, sums of bits 10..18 and 0..9 */
    unsigned long long key[PICK_LIST];
    double sd[33];
    float sv[32];
    int si[32];
    int dig;
    unsigned cb;
    unsigned long long vb;
    /* exchanged across the cluster, each written once: this block's argmax, its sums;
     * and in rank 0 the results that every block reads */
    float xbv;
    int xbi;
    double xsum, xpart;
    int best, pick, last, n_list, listed;
    float mx;
    unsigned long long kmin;
};

/* Row r's weights and keys: for a logit v of token j, e = exp((v - mx) / T) with the
 * cut, p = e x inv. A block reads the groups of four tokens [g0, g1) (its slice of the
 * row, ids ascending across the cluster's ranks). */
struct pick_row {
    const float *r;
    float mx, inv_t, inv;
    int V, ib; /* ib: the bits of V - 1 */
    bool al;   /* r is 16-byte aligned: float4 loads */
    int g0, g1;
    __device__ float e(float v) const /* __expf: ~2e-6 relative at z = -40, far inside what a draw resolves */
    {
        float z = (v - mx) * inv_t;
        return z >= PICK_CUT ? __expf(z) : 0.0f;
    }
    __device__ float p(float v) const { return e(v) * inv; }
    __device__ unsigned long long key(float pj, int j) const
    {
        return (unsigned long long)__float_as_uint(pj) << ib | (unsigned)(V - 1 - j);
    }
    /* the logits j .. j + 3, NaN past the end (a NaN never wins and weighs nothing) */
    __device__ float4 load4(int j) const
    {
        if (al && j + 3 < V) return *(const float4 *)(r + j);
        float4 a;
        a.x = j < V ? r[j] : NAN;
        a.y = j + 1 < V ? r[j + 1] : NAN;
        a.z = j + 2 < V ? r[j + 2] : NAN;
        a.w = j + 3 < V ? r[j + 3] : NAN;
        return a;
    }
    /* f(j, v) for every token of the slice, in no particular order: each thread takes
     * every blockDim.x-th group, four groups' loads in flight at a time */
    template <typename F>
    __device__ void each(F f) const
    {
        int g = g0 + (int)threadIdx.x, nt = (int)blockDim.x;
        for (; g + 3 * nt < g1; g += 4 * nt) {
            float4 a[4];
            #pragma unroll
            for (int u = 0; u < 4; u++) a[u] = load4(4 * (g + u * nt));
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int j = 4 * (g + u * nt);
                f(j, a[u].x);
                f(j + 1, a[u].y);
                f(j + 2, a[u].z);
                f(j + 3, a[u].w);
            }
        }
        for (; g < g1; g += nt) {
            float4 a = load4(4 * g);
            f(4 * g, a.x);
            f(4 * g + 1, a.y);
            f(4 * g + 2, a.z);
            f(4 * g + 3, a.w);
        }
    }
};

__device__ __forceinline__ void argmax_pair(float &bv, int &bi, float ov, int oi)
{
    if (ov > bv || (ov == bv && oi < bi)) {
        bv = ov;
        bi = oi;
    }
}

/* The exclusive prefix of v over the block's threads in order; *total: the sum. */
__device__ double pick_scan(double v, pick_smem &s, double *total)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32;
    double incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(~0u, incl, o);
        if (l >= o) incl += t;
    }
    __syncthreads(); /* s.sd free */
    if (l == 31) s.sd[w] = incl;
    __syncthreads();
    if (!w) {
        double t = l < nw ? s.sd[l] : 0, ti = t;
        for (int o = 1; o < 32; o <<= 1) {
            double q = __shfl_up_sync(~0u, ti, o);
            if (l >= o) ti += q;
        }
        s.sd[l] = ti - t;
        if (l == 31) s.sd[32] = ti;
    }
    __syncthreads();
    *total = s.sd[32];
    return s.sd[w] + incl - v;
}

/* The mass of a set of tokens of bucket b whose significands sum to sig, in units of
 * 2^-62 (truncated where p < 2^-39). */
__device__ __forceinline__ unsigned long long pick_fixed(int b, unsigned long long sig)
{
    int sh = (b >> 4) - 88;
    return sh >= 0 ? sig << sh : sig >> min(-sh, 63);
}

/* A radix level's histogram into s: among the keys whose bits above sh + dw equal pre,
 * the digit (key >> sh) & (2^dw - 1), counted with the sums of bits 10..18 and 0..9
 * of p's significand. each(f) calls f(key) for every token of the source with p > 0.
 * Every thread of the block calls. */
template <typename Each>
__device__ void pick_hist(pick_smem &s, Each each, int ib, int sh, int dw, unsigned long long pre)
{
    int nb = 1 << dw;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        s.cnt[b] = 0;
        s.shi[b] = 0;
        s.slo[b] = 0;
    }
    __syncthreads();
    each([&](unsigned long long key) {
        if (key >> (sh + dw) != pre) return;
        int d = (int)(key >> sh) & (nb - 1);
        unsigned r = (unsigned)(key >> ib) & 0x7FFFF;
        atomicAdd(&s.cnt[d], 1u);
        atomicAdd(&s.shi[d], r >> 10);
        atomicAdd(&s.slo[d], r & 1023);
    });
    __syncthreads();
}

/* The largest digit of s's histogram (2^dw bins) whose tokens, with those of the
 * larger digits and those counted before (cb, and mb or sb), reach k or P. bucket < 0:
 * the first level, whose digits are buckets (mb: the fixed point mass before them);
 * else every token is of that bucket (mb: the mass of the buckets above it, sb: the
 * significands before this level in it). Returns it (cb and mb or sb advanced past
 * the larger digits), or -1 where none reaches a limit. Every thread of the block
 * calls. */
__device__ int pick_digit(pick_smem &s, int dw, int bucket, unsigned k, unsigned long long P, unsigned &cb,
                          unsigned long long &mb, unsigned long long &sb)
{
    int nb = 1 << dw;
    if (threadIdx.x < 32) { /* lane l: the l-th segment of bins from the top */
        bool first = bucket < 0;
        /* a bin's value: its mass (first level), else its significands' sum */
        auto val = [&](int b) {
            int bk = first ? b : bucket;
            unsigned long long sig = (unsigned long long)s.cnt[b] * ((16 + (bk & 15)) << 19) +
                                     ((unsigned long long)s.shi[b] << 10) + s.slo[b];
            return first ? pick_fixed(bk, sig) : sig;
        };
        int l = threadIdx.x, seg = nb >= 32 ? nb / 32 : 1, top = nb - 1 - l * seg, n = l < nb ? seg : 0;
        unsigned c = 0;
        unsigned long long v = 0;
        for (int i = 0; i < n; i++) {
            c += s.cnt[top - i];
            v += val(top - i);
        }
        unsigned ci = c;
        unsigned long long vi = v;
        for (int o = 1; o < 32; o <<= 1) {
            unsigned tc = __shfl_up_sync(~0u, ci, o);
            unsigned long long tv = __shfl_up_sync(~0u, vi, o);
            if (l >= o) {
                ci += tc;
                vi += tv;
            }
        }
        unsigned ca = cb + (ci - c);
        unsigned long long va = (first ? mb : sb) + (vi - v);
        int found = -1;
        for (int i = 0; i < n; i++) {
            int b = top - i;
            unsigned nc = ca + s.cnt[b];
            unsigned long long nv = va + val(b);
            if (s.cnt[b] && (nc >= k || (first ? nv : mb + pick_fixed(bucket, nv)) >= P)) {
                found = b;
                break;
            }
            ca = nc;
            va = nv;
        }
        unsigned hit = __ballot_sync(~0u, found >= 0);
        if (hit && l == __ffs(hit) - 1) {
            s.dig = found;
            s.cb = ca;
            s.vb = va;
        }
        if (!hit && !l) s.dig = -1;
    }
    __syncthreads();
    int d = s.dig;
    if (d >= 0) {
        cb = s.cb;
        (bucket < 0 ? mb : sb) = s.vb;
    }
    __syncthreads(); /* s.dig read before a later level writes it */
    return d;
}

/* The key of the last token kept (0: all of them, where neither limit is met), in
 * every block of the cluster. Level 1 histograms each block's slice; rank 0 merges
 * them and finds the bucket; the bucket's tokens move to rank 0's list when they fit,
 * and rank 0 runs the later levels on the list, or else on the whole row. Every
 * thread of the cluster calls. */
__device__ unsigned long long pick_select(pick_smem &s, cg::cluster_group &cl, const pick_row &R, int top_k,
                                          float top_p)
{
    int rank = (int)cl.block_rank();
    unsigned k = top_k > 0 ? (unsigned)top_k : UINT_MAX, cb = 0;
    unsigned long long P = top_p < 1 ? (unsigned long long)((double)top_p * PICK_FIX) : ULLONG_MAX, mb = 0, sb = 0;
    auto slice = [&](auto f) {
        R.each([&](int j, float v) {
            float p = R.p(v);
            if (p > 0) f(R.key(p, j));
        });
    };
    int rem = 19 + R.ib; /* the key's bits below the first level's digit */
    pick_hist(s, slice, R.ib, rem, 11, 0);
    cl.sync(); /* every slice's histogram done */
    if (rank == 0) {
        for (int b = threadIdx.x; b < PICK_BINS; b += blockDim.x) {
            unsigned c = 0, hi = 0, lo = 0;
            for (int q = 0; q < PICK_C; q++) {
                c += cl.map_shared_rank(s.cnt, q)[b];
                hi += cl.map_shared_rank(s.shi, q)[b];
                lo += cl.map_shared_rank(s.slo, q)[b];
            }
            s.cnt[b] = c;
            s.shi[b] = hi;
            s.slo[b] = lo;
        }
        __syncthreads();
        int d = pick_digit(s, 11, -1, k, P, cb, mb, sb);
        if (!threadIdx.x) {
            s.n_list = 0;
            s.kmin = 0; /* d < 0: all kept */
            for (int q = 0; q < PICK_C; q++) {
                *cl.map_shared_rank(&s.dig, q) = d;
                *cl.map_shared_rank(&s.listed, q) = d >= 0 && s.cnt[d] <= PICK_LIST;
            }
        }
    }
    cl.sync(); /* the bucket known everywhere; the other ranks' histograms read */
    int b = s.dig;
    bool listed = s.listed;
    unsigned long long pre = (unsigned long long)b;
    if (b >= 0 && listed) {
        int *nl = cl.map_shared_rank(&s.n_list, 0);
        unsigned long long *keys = cl.map_shared_rank(s.key, 0);
        slice([&](unsigned long long key) {
            if (key >> rem == pre) keys[atomicAdd(nl, 1)] = key;
        });
    }
    cl.sync(); /* rank 0's list complete */
    if (rank == 0 && b >= 0) {
        auto list = [&](auto f) {
            for (int i = threadIdx.x; i < s.n_list; i += blockDim.x) f(s.key[i]);
        };
        pick_row W = R; /* the whole row */
        W.g0 = 0;
        W.g1 = (R.V + 3) / 4;
        auto row = [&](auto f) {
            W.each([&](int j, float v) {
                float p = W.p(v);
                if (p > 0) f(W.key(p, j));
            });
        };
        while (rem > 0) {
            int dw = min(8, rem);
            rem -= dw;
            if (listed) pick_hist(s, list, R.ib, rem, dw, pre);
            else pick_hist(s, row, R.ib, rem, dw, pre);
            int d = pick_digit(s, dw, b, k, P, cb, mb, sb);
            /* d >= 0: the prefix's tokens met the limit, and their masses add exactly */
            pre = pre << dw | (unsigned long long)max(d, 0);
        }
        if (!threadIdx.x)
            for (int q = 0; q < PICK_C; q++) *cl.map_shared_rank(&s.kmin, q) = pre;
    }
    cl.sync(); /* the key known everywhere */
    return b >= 0 ? s.kmin : 0;
}

/* The inverse CDF at u of the weights w(j, logit), ids ascending (see above), in rank
 * 0's s.pick; best where the total is not a finite number >= floor. Each block sums
 * its slice, warp w a contiguous range of it, 128 tokens a step (four a lane,
 * coalesced); the cluster's block sums and a block scan of the warps' sums find the
 * block and warp where u x the total falls, and that warp walks its range the same
 * way: a step's lane sums, a warp scan, then the one lane's four tokens. Every thread
 * of the cluster calls. */
template <typename W>
__device__ void pick_draw(pick_smem &s, cg::cluster_group &cl, const pick_row &R, W w, double u, double floor,
                          int best)
{
    int wp = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32, V = R.V;
    int b0 = min(V, 4 * R.g0), b1 = min(V, 4 * R.g1);
    int per = (b1 - b0 + nw * 128 - 1) / (nw * 128) * 128, j0 = min(b1, b0 + wp * per), j1 = min(b1, j0 + per);
    double part = 0;
    int last = -1;
    for (int jb = j0; jb < j1; jb += 512) { /* four steps' loads in flight */
        float4 a[4];
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = jb + 128 * q + 4 * l;
            a[q] = jb + 128 * q < j1 && j < j1 ? R.load4(j) : make_float4(NAN, NAN, NAN, NAN);
        }
        #pragma unroll
        for (int q = 0; q < 4; q++) {
            int j = jb + 128 * q + 4 * l;
            float e[4] = {w(j, a[q].x), w(j + 1, a[q].y), w(j + 2, a[q].z), w(j + 3, a[q].w)};
            #pragma unroll
            for (int t = 0; t < 4; t++) {
                part += j + t < j1 ? e[t] : 0.0f;
                last = e[t] > 0 && j + t < j1 ? j + t : last;
            }
        }
    }
    for (int o = 16; o; o >>= 1) {
        part += __shfl_xor_sync(~0u, part, o);
        last = max(last, __shfl_xor_sync(~0u, last, o));
    }
    /* the warps' sums, one per warp, scanned in warp order; the block's */
    double btotal, pre = pick_scan(l == 0 ? part : 0.0, s, &btotal);
    pre = __shfl_sync(~0u, pre, 0);
    if (!l) atomicMax(cl.map_shared_rank(&s.last, 0), last);
    if (!threadIdx.x) s.xpart = btotal;
    cl.sync(); /* every block's sum */
    double total = 0, bpre = 0;
    for (int q = 0; q < PICK_C; q++) {
        double t = *cl.map_shared_rank(&s.xpart, q);
        bpre += q < (int)cl.block_rank() ? t : 0.0;
        total += t;
    }
    if (!(total >= floor && total < INFINITY)) { /* a NaN or an infinite logit */
        if (!cl.block_rank() && !threadIdx.x) s.pick = best;
        return;
    }
    double target = u * total;
    pre += bpre;
    if (target >= pre && target < pre + part) { /* this warp's range */
        double c = pre;
        for (int jb = j0; jb < j1; jb += 128) {
            int j = jb + 4 * l;
            float4 a = j < j1 ? R.load4(j) : make_float4(NAN, NAN, NAN, NAN);
            float e[4] = {w(j, a.x), w(j + 1, a.y), w(j + 2, a.z), w(j + 3, a.w)};
            for (int t = 0; t < 4; t++) e[t] = j + t < j1 ? e[t] : 0.0f;
            double ls = (double)e[0] + e[1] + e[2] + e[3], incl = ls;
            for (int o = 1; o < 32; o <<= 1) {
                double t = __shfl_up_sync(~0u, incl, o);
                if (l >= o) incl += t;
            }
            double step = __shfl_sync(~0u, incl, 31);
            if (target < c + step) { /* in this step: the first lane whose sum passes it */
                unsigned in = __ballot_sync(~0u, target < c + incl);
                if (l == __ffs(in) - 1) {
                    double cc = c + incl - ls;
                    int got = -1;
                    for (int t = 0; t < 4 && got < 0; t++) {
                        cc += e[t];
                        got = target < cc ? j + t : got;
                    }
                    for (int t = 3; t >= 0 && got < 0; t--) /* rounding: the lane's last weighted token */
                        got = e[t] > 0 ? j + t : got;
                    atomicMin(cl.map_shared_rank(&s.pick, 0), got);
                }
                break;
            }
            c += step;
        }
    }
}

__global__ void __launch_bounds__(1024) pick_rows_kernel(int32_t *out, float *x, int V, pick_args a)
{
    cu_pdl_wait();
    cu_pdl_launch();
    cg::cluster_group cl = cg::this_cluster();
    int rank = (int)cl.block_rank(), row = (int)blockIdx.x / PICK_C;
    float *r = x + (size_t)row * V; /* not __restrict__: the penalty writes it, the passes read it */
    __shared__ pick_smem s;
    const ds_pick pk = a.p[row];
    int ng = (V + 3) / 4, gs = (ng + PICK_C - 1) / PICK_C;
    pick_row R = {r, 0.0f, 1.0f / pk.temperature, 1.0f, V, V > 1 ? 32 - __clz(V - 1) : 1, ((uintptr_t)r & 15) == 0,
                  min(ng, rank * gs), min(ng, (rank + 1) * gs)};
    if (!threadIdx.x) {
        s.pick = INT_MAX;
        s.last = -1;
    }
    if (pk.n_hist > 0) { /* sampler_penalise on this block's slice: the tokens are distinct */
        const int32_t *h = a.hd + a.hoff[row];
        for (int i = threadIdx.x; i < pk.n_hist; i += blockDim.x) {
            int t = h[i];
            if (t < 4 * R.g0 || t >= 4 * R.g1 || t >= V) continue;
            float v = r[t];
            r[t] = v > 0 ? v / pk.penalty : v * pk.penalty;
        }
        __syncthreads();
    }
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = (int)blockDim.x / 32;
    float bv = -INFINITY;
    int bi = INT_MAX;
    R.each([&](int j, float v) { argmax_pair(bv, bi, v, j); });
    for (int o = 16; o; o >>= 1) argmax_pair(bv, bi, __shfl_down_sync(~0u, bv, o), __shfl_down_sync(~0u, bi, o));
    if (!l) {
        s.sv[w] = bv;
        s.si[w] = bi;
    }
    __syncthreads();
    if (!w) {
        bv = l < nw ? s.sv[l] : -INFINITY;
        bi = l < nw ? s.si[l] : INT_MAX;
        for (int o = 16; o; o >>= 1) argmax_pair(bv, bi, __shfl_down_sync(~0u, bv, o), __shfl_down_sync(~0u, bi, o));
        if (!l) {
            s.xbv = bv;
            s.xbi = bi;
        }
    }
    cl.sync(); /* every slice's argmax (and penalty) done */
    if (!threadIdx.x) { /* the row's: NaNs never win, a NaN in column 0 stands */
        float v = -INFINITY;
        int i = INT_MAX;
        for (int q = 0; q < PICK_C; q++) argmax_pair(v, i, *cl.map_shared_rank(&s.xbv, q), *cl.map_shared_rank(&s.xbi, q));
        bool nan0 = r[0] != r[0];
        s.best = nan0 || i == INT_MAX ? 0 : i;
        s.mx = nan0 || i == INT_MAX ? r[0] : v;
    }
    __syncthreads();
    int best = s.best;
    R.mx = s.mx;
    if (!(pk.temperature > 0)) {
        if (!rank && !threadIdx.x) s.pick = best;
    } else if (!(pk.top_k > 0 || pk.top_p < 1)) {
        pick_draw(s, cl, R, [&](int, float v) { return R.e(v); }, pk.u, 1.0, best);
    } else {
        double part = 0, tot;
        R.each([&](int, float v) { part += R.e(v); });
        pick_scan(part, s, &tot);
        if (!threadIdx.x) s.xsum = tot;
        cl.sync(); /* every slice's sum */
        double total = 0;
        for (int q = 0; q < PICK_C; q++) total += *cl.map_shared_rank(&s.xsum, q);
        if (total >= 1 && total < INFINITY) { /* the same in every block */
            R.inv = 1.0f / (float)total;
            unsigned long long kmin = pick_select(s, cl, R, pk.top_k, pk.top_p);
            pick_draw(
                s, cl, R,
                [&](int j, float v) {
                    float p = R.p(v);
                    return p > 0 && R.key(p, j) >= kmin ? p : 0.0f;
                },
                pk.u, 0.0, best);
        } else if (!rank && !threadIdx.x) {
            s.pick = best;
        }
    }
    cl.sync(); /* the picks in rank 0; no block reads another's memory after this */
    /* no step took it (u x total past the end by rounding): the last token with weight */
    if (!rank && !threadIdx.x) out[row] = s.pick != INT_MAX ? s.pick : s.last >= 0 ? s.last : best;
}

void cu_pick_rows(int32_t *host_out, float *x, int n, int V, const ds_pick *p)
{
    if (n <= 0 || V <= 0) return;
    size_t nh = 0;
    for (int i = 0; p && i < n; i++) nh += p[i].n_hist > 0 ? (size_t)p[i].n_hist : 0;
    int32_t *d = (int32_t *)cu_alloc(sizeof(int32_t) * ((size_t)n + nh)), *hs = nh ? (int32_t *)malloc(sizeof(int32_t) * nh) : NULL;
    if (!d || (nh && !hs)) { /* cu_alloc recorded its failure */
        if (d) cu_check(cudaErrorMemoryAllocation, "pick_rows: host memory for the penalised tokens");
        cu_free(d);
        return;
    }
    cu_zero(d, sizeof(int32_t) * (size_t)n);
    for (int i = 0, o = 0; i < n && nh; i++)
        if (p[i].n_hist > 0) {
            memcpy(hs + o, p[i].hist, sizeof(int32_t) * (size_t)p[i].n_hist);
            o += p[i].n_hist;
        }
    if (nh) cu_upload(d + n, hs, sizeof(int32_t) * nh);
    free(hs);
    int off = 0;
    for (int i0 = 0; i0 < n; i0 += PICK_MAXN) {
        int m = min(PICK_MAXN, n - i0);
        pick_args a = {};
        a.hd = d + n;
        for (int i = 0; i < m; i++) {
            a.p[i] = p ? p[i0 + i] : ds_pick{0.0f, 0, 1.0f, 0.0, 1.0f, 0, NULL};
            a.hoff[i] = off;
            off += a.p[i].n_hist > 0 ? a.p[i].n_hist : 0;
        }
        cu_launch_cluster(pick_rows_kernel, dim3((unsigned)m * PICK_C), dim3(1024), PICK_C, 0, d + i0, x + (size_t)i0 * V, V,
                          a);
    }
    cu_download(host_out, d, sizeof(int32_t) * (size_t)n);
    cu_free(d);
}

