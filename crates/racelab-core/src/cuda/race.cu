// racelab CUDA kernels for soft RACE (compiled at run time with NVRTC).
//
// Layout: inputs [heads, n, d] (values [heads, n, dv]) row-major; planes W [L, P, d] f32.
// A bank row f (feature f = l*R + r) has width w = dv + 1: value sums and, last, the mass.
//
// Every pass splits each head's sequence into chunks of `chunk` tokens. Chunk totals
// (race_partial*) are combined by race_scan in f64 (an exclusive scan for causal runs, the
// total for non-causal ones), so f32 only ever accumulates within one chunk. No float
// atomics: every sum has a fixed order, so results are bitwise reproducible run to run.
//
// Two kernel families, the host picking per problem (src/cuda/mod.rs, `Geometry`):
// - warp-per-chunk (race_partial, race_fwd, race_bwd_q, race_bwd_k): each *warp* owns one
//   chunk and walks it token by token with warp-level steps only (shuffles and __syncwarp);
//   a block is up to 8 such warps. Kernels that accumulate keep a private m·w state per warp
//   in shared memory; the non-causal passes share one read-only state per block. Any shape
//   whose state fits in shared memory.
// - tiled (race_*_tile, race_*_tile_causal; further below): each *block* of 8 warps owns one
//   chunk and walks it in tiles of 32 tokens, every step block-parallel. The default wherever
//   the tiles fit (m ≤ 64, dv + 1 ≤ 160).
//
// The per-token maths is the same in both: the soft features of a row (L·P projections on
// the planes, tanh, the bit sigmoids, the m = L·2^P corner products), bank-sized products
// against the state, and through the softmaxes back to dz and dx = dz W.

// Compiled twice: as is (f32 inputs) and with -DRACE_BF16 (bf16 inputs read as raw 16-bit
// words and widened exactly to f32). Outputs and gradients are always f32.

#ifdef RACE_BF16
typedef unsigned short in_t;
__device__ __forceinline__ float ld(const in_t* p, long long i) { return __uint_as_float(((unsigned int)p[i]) << 16); }
#else
typedef float in_t;
__device__ __forceinline__ float ld(const in_t* p, long long i) { return p[i]; }
#endif

#define FULL 0xffffffffu

// The dynamic shared memory of every kernel (its layout: `carve` and `blk_carve` below).
extern __shared__ float sh[];

// The warp-per-chunk kernels prefetch rows this many tokens ahead of the one a warp works on;
// the tiled ones prefetch the next tile. -DAHEAD=0 (RACELAB_CUDA_DEFINES) turns all software
// prefetch off, for comparison.
#ifndef AHEAD
#define AHEAD 4
#endif

// Ask L2 for a row a few tokens on (one 128-byte line per lane); never dereferenced.
__device__ __forceinline__ void prefetch_line(const void* p) {
#if defined(__CUDA_ARCH__) && AHEAD > 0
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

__device__ __forceinline__ void prefetch_row(const void* row, int bytes) {
    const int off = (threadIdx.x & 31) * 128;
    if (off < bytes) prefetch_line((const char*)row + off);
}

// Prefetch token `row`'s input row of x (d wide) and, where given, its v or g/o rows.
__device__ __forceinline__ void prefetch_token(const in_t* X, const in_t* V, const float* G, const float* O,
                                               long long row, int d, int dv) {
    prefetch_row(X + row * d, d * (int)sizeof(in_t));
    if (V) prefetch_row(V + row * dv, dv * (int)sizeof(in_t));
    if (G) prefetch_row(G + row * dv, dv * 4);
    if (O) prefetch_row(O + row * dv, dv * 4);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float sigm(float t) {
    if (t >= 0.f) return 1.f / (1.f + expf(-t));
    float e = expf(t);
    return e / (1.f + e);
}

// Per-warp scratch (floats): x [d] | z/u [LP] | on [LP] | off [LP] | dz [LP] | db [LP] |
// phi [m] | gphi [m] | y [w] | out [w]. After all warps' scratch, the state(s): one m·w per
// warp (private) or one for the block. `shared_floats` in src/cuda/mod.rs mirrors this.
struct Scratch {
    float *x, *u, *on, *off, *dz, *db, *phi, *gphi, *y, *out, *st;
};

__device__ __forceinline__ int scratch_floats(int d, int LP, int m, int w) { return d + 5 * LP + 2 * m + 2 * w; }

// Carve this warp's scratch and state. `private_state`: one m·w state per warp after all
// warps' scratch; otherwise one shared state there.
__device__ Scratch carve(float* sh, int d, int LP, int m, int w, int private_state) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float* p = sh + warp * scratch_floats(d, LP, m, w);
    Scratch s;
    s.x = p; p += d;
    s.u = p; p += LP;
    s.on = p; p += LP;
    s.off = p; p += LP;
    s.dz = p; p += LP;
    s.db = p; p += LP;
    s.phi = p; p += m;
    s.gphi = p; p += m;
    s.y = p; p += w;
    s.out = p;
    float* states = sh + nw * scratch_floats(d, LP, m, w);
    s.st = states + (private_state ? warp * m * w : 0);
    return s;
}

// From this beta on z = W x, u = tanh z and σ(±2βu) are computed in double (each rounded
// once to f32): the exponent 2β·u magnifies any absolute rounding of z or u by 2β (as
// `shared::PROJ_F64_BETA`; the host sends such problems to the warp kernels).
#ifndef PROJ_F64_BETA
#define PROJ_F64_BETA 16.f
#endif

__device__ __forceinline__ double sigm_d(double t) {
    if (t >= 0.0) return 1.0 / (1.0 + exp(-t));
    double e = exp(t);
    return e / (1.0 + e);
}

__device__ __forceinline__ float fma_t(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_t(double a, double b, double c) { return fma(a, b, c); }

// z = W x of the row in s.x into s.u, accumulated in T; four projections at a time:
// independent chains and shuffles overlap. With PROBS (T = double, large beta) the lane that
// holds z also forms u = tanh z and the bit probabilities σ(±2βu) in double, and writes u,
// on and off rounded once: an f32 u would carry a rounding that 2β magnifies.
template <typename T, bool PROBS>
__device__ void warp_project(const float* __restrict__ W, int d, int LP, float beta, const Scratch& s) {
    const int lane = threadIdx.x & 31;
    for (int lp0 = 0; lp0 < LP; lp0 += 4) {
        T a[4] = {0, 0, 0, 0};
        for (int i = lane; i < d; i += 32) {
            const T xi = s.x[i];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (lp0 + j < LP) a[j] = fma_t((T)W[(long long)(lp0 + j) * d + i], xi, a[j]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < 4; ++j) a[j] += __shfl_xor_sync(FULL, a[j], o);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (lp0 + j < LP && lane == ((lp0 + j) & 31)) {
                if (PROBS) {
                    const double u = tanh((double)a[j]), t = 2.0 * (double)beta * u;
                    s.u[lp0 + j] = (float)u;
                    s.on[lp0 + j] = (float)sigm_d(t);
                    s.off[lp0 + j] = (float)sigm_d(-t);
                } else {
                    s.u[lp0 + j] = (float)a[j];
                }
            }
    }
}

// Soft features of one row x (length d) for all L tables, by one warp: leaves u [LP] and
// phi [m] in the scratch; ends with __syncwarp.
__device__ void warp_features(const in_t* x, const float* __restrict__ W, int d, int L, int P, float beta,
                              const Scratch& s) {
    const int lane = threadIdx.x & 31, LP = L * P, R = 1 << P, m = L * R;
    for (int i = lane; i < d; i += 32) s.x[i] = ld(x, i);
    __syncwarp();
    if (beta >= PROJ_F64_BETA) {
        warp_project<double, true>(W, d, LP, beta, s);
    } else {
        warp_project<float, false>(W, d, LP, beta, s);
        __syncwarp();
        for (int lp = lane; lp < LP; lp += 32) {
            const float u = tanhf(s.u[lp]);
            const float t = 2.f * beta * u;
            s.u[lp] = u;
            s.on[lp] = sigm(t);
            s.off[lp] = sigm(-t);
        }
    }
    __syncwarp();
    for (int f = lane; f < m; f += 32) {
        const int l = f / R, r = f % R;
        float v = 1.f;
        for (int p = 0; p < P; ++p) v *= ((r >> (P - 1 - p)) & 1) ? s.on[l * P + p] : s.off[l * P + p];
        s.phi[f] = v;
    }
    __syncwarp();
}

// y = [v, 1] into dst; ends with __syncwarp.
__device__ void warp_y(const in_t* v, int dv, float* dst) {
    const int lane = threadIdx.x & 31;
    for (int c = lane; c < dv; c += 32) dst[c] = ld(v, c);
    if (lane == 0) dst[dv] = 1.f;
    __syncwarp();
}

// ĝ = [g/den, -(g·o)/den] (zeros when den == 0) into dst; ends with __syncwarp.
__device__ void warp_gext(const float* g, const float* o, float den, int dv, float* dst) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int c = lane; c < dv; c += 32) acc = fmaf(g[c], o[c], acc);
    acc = warp_sum(acc);
    for (int c = lane; c < dv; c += 32) dst[c] = den == 0.f ? 0.f : g[c] / den;
    if (lane == 0) dst[dv] = den == 0.f ? 0.f : -acc / den;
    __syncwarp();
}

// Column blocks per lane in the warp-level bank products: a lane keeps WC columns
// (c = c0 + lane + 32j) in registers, so WC independent chains overlap.
#define WC 5

// st[f][c] += phi[f] · (sc · vec[c]); ends with __syncwarp.
__device__ void warp_accumulate(float* __restrict__ st, const float* __restrict__ phi, const float* vec, float sc,
                                int m, int w) {
    const int lane = threadIdx.x & 31;
    for (int c0 = 0; c0 < w; c0 += 32 * WC) {
        float y[WC];
#pragma unroll
        for (int j = 0; j < WC; ++j) {
            const int c = c0 + lane + 32 * j;
            y[j] = c < w ? vec[c] * sc : 0.f;
        }
        for (int f = 0; f < m; ++f) {
            const float pf = phi[f];
            float* row = st + f * w;
#pragma unroll
            for (int j = 0; j < WC; ++j) {
                const int c = c0 + lane + 32 * j;
                if (c < w) row[c] = fmaf(pf, y[j], row[c]);
            }
        }
    }
    __syncwarp();
}

// out[c] = Σ_f phi[f] st[f][c] for c < cols; ends with __syncwarp.
__device__ void warp_read(const float* __restrict__ st, const float* __restrict__ phi, int m, int w, int cols,
                          float* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    for (int c0 = 0; c0 < cols; c0 += 32 * WC) {
        float acc[WC];
#pragma unroll
        for (int j = 0; j < WC; ++j) acc[j] = 0.f;
        for (int f = 0; f < m; ++f) {
            const float pf = phi[f];
#pragma unroll
            for (int j = 0; j < WC; ++j) {
                const int c = c0 + lane + 32 * j;
                if (c < cols) acc[j] = fmaf(pf, st[f * w + c], acc[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < WC; ++j) {
            const int c = c0 + lane + 32 * j;
            if (c < cols) out[c] = acc[j];
        }
    }
    __syncwarp();
}

// gphi[f] = sc · Σ_c st[f][c] vec[c]. Lanes split as (feature, column group): with m < 32
// features, G = the largest power of two ≤ 32/m groups each sum every G-th column (in four
// interleaved partial sums), and the groups are added by shuffles (a fixed order). Rows are
// w = dv+1 floats apart, odd when dv is even, so lanes on different features hit distinct
// banks. Ends with __syncwarp.
__device__ void warp_gphi(const float* __restrict__ st, const float* __restrict__ vec, float sc, int m, int w,
                          float* __restrict__ gphi) {
    const int lane = threadIdx.x & 31;
    int G = 1;
    while (2 * G * m <= 32) G *= 2;
    const int grp = lane / m, f0 = lane % m;
    for (int fb = 0; fb < m; fb += 32) {  // m < 32 runs this once; m ≥ 32 has G = 1
        const int f = G > 1 ? f0 : fb + lane;
        float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        if (grp < G && f < m) {
            const float* row = st + f * w;
            int c = grp;
            for (; c + 3 * G < w; c += 4 * G) {
                a0 = fmaf(row[c], vec[c], a0);
                a1 = fmaf(row[c + G], vec[c + G], a1);
                a2 = fmaf(row[c + 2 * G], vec[c + 2 * G], a2);
                a3 = fmaf(row[c + 3 * G], vec[c + 3 * G], a3);
            }
            for (; c < w; c += G) a0 = fmaf(row[c], vec[c], a0);
        }
        float acc = (a0 + a1) + (a2 + a3);
        for (int o = G / 2; o > 0; o /= 2) acc += __shfl_down_sync(FULL, acc, o * m);
        if (grp == 0 && f < m) gphi[f] = acc * sc;
    }
    __syncwarp();
}

// Through one row's softmaxes: from its features phi [m], their gradient gphi [m] and the
// tanh states u [LP] (and s.on, s.off of the same row, from warp_features), dz = ∂ℓ/∂z into
// s.dz; returns Σ_p u_p c_p (this row's ∂ℓ/∂beta) on every lane. Ends with __syncwarp.
__device__ float warp_table_backward(int L, int P, float beta, const float* u_row, const float* phi,
                                     const float* gphi, const Scratch& s) {
    const int lane = threadIdx.x & 31, R = 1 << P, LP = L * P;
    float db = 0.f;
    for (int lp = lane; lp < LP; lp += 32) {
        const int l = lp / P, p = lp % P;
        const float* ph = phi + l * R;
        const float* gp = gphi + l * R;
        float cc = 0.f;
        if (beta >= PROJ_F64_BETA) {
            // Large beta: c_p = 2 on_p off_p Σ_r ±(Π_{q≠p} f_q(r)) g_r, the same value without
            // the cancellation of g_r − ḡ in a saturated table (`cpu::features::bit_contrast`).
            const float* on = s.on + l * P;
            const float* off = s.off + l * P;
            for (int r = 0; r < R; ++r) {
                float t = gp[r];
                for (int q = 0; q < P; ++q)
                    if (q != p) t *= ((r >> (P - 1 - q)) & 1) ? on[q] : off[q];
                cc += ((r >> (P - 1 - p)) & 1) ? t : -t;
            }
            cc *= 2.f * on[p] * off[p];
        } else {
            float gbar = 0.f;
            for (int r = 0; r < R; ++r) gbar = fmaf(ph[r], gp[r], gbar);
            for (int r = 0; r < R; ++r) {
                float t = ph[r] * (gp[r] - gbar);
                cc += ((r >> (P - 1 - p)) & 1) ? t : -t;
            }
        }
        const float u = u_row[lp];
        s.dz[lp] = beta * cc * (1.f - u * u);
        s.db[lp] = u * cc;
    }
    __syncwarp();
    // A fixed-order sum over lp (the same on every lane), so dβ does not depend on LP % 32.
    for (int lp = 0; lp < LP; ++lp) db += s.db[lp];
    return db;
}

// dx = Σ_lp dz_lp W_lp into out (length d).
__device__ void warp_dx(const float* __restrict__ W, const float* dz, int LP, int d, float* out) {
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < d; i += 32) {
        float acc = 0.f;
        for (int lp = 0; lp < LP; ++lp) acc = fmaf(dz[lp], W[(long long)lp * d + i], acc);
        out[i] = acc;
    }
}

// The causal passes' key step: state += φ(k) [v, 1] for one key row.
__device__ void warp_add_key(const in_t* k, const in_t* v, const float* __restrict__ W, int d, int dv, int L, int P,
                             float beta, const Scratch& s) {
    warp_y(v, dv, s.y);
    warp_features(k, W, d, L, P, beta, s);
    warp_accumulate(s.st, s.phi, s.y, 1.f, L << P, dv + 1);
}

// Common preamble: shapes, this warp's chunk [t0, t1) of head h (empty past the end).
#define WARP_CHUNK(private_state)                                                  \
    const int R = 1 << P, m = L * R, w = dv + 1, LP = L * P;                       \
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;                       \
    const int h = blockIdx.y, nch = (n + chunk - 1) / chunk;                       \
    const int c = blockIdx.x * nw + (threadIdx.x >> 5);                            \
    const int t0 = min(n, c * chunk), t1 = min(n, t0 + chunk);                     \
    const Scratch s = carve(sh, d, LP, m, w, private_state);                       \
    (void)R; (void)lane; (void)nch;

// Load the state the pass starts from: this warp's chunk base (causal, private) or the
// head's total shared by the block (non-causal). The block barrier is reached by every thread
// (no warp has returned yet).
__device__ void load_state(const float* bases, int causal, int h, int c, int nch, int mw, const Scratch& s) {
    if (causal) {
        if (c < nch) {
            const float* b = bases + ((long long)h * nch + c) * mw;
            for (int e = threadIdx.x & 31; e < mw; e += 32) s.st[e] = b[e];
        }
        __syncwarp();
    } else {
        const float* b = bases + (long long)h * mw;
        for (int e = threadIdx.x; e < mw; e += blockDim.x) s.st[e] = b[e];
        __syncthreads();
    }
}

// Chunk totals. mode 0: Σ φ(k_t)[v_t, 1]; mode 1: Σ φ(q_t) ĝ_t / L. out [heads, nch, m*w].
extern "C" __global__ void race_partial(const in_t* X, const in_t* V, const float* G, const float* O,
                                        const float* DEN, const float* W, float* out, int n, int d,
                                        int dv, int L, int P, float beta, int chunk, int mode) {
    WARP_CHUNK(1)
    if (c >= nch) return;
    for (int e = lane; e < m * w; e += 32) s.st[e] = 0.f;
    __syncwarp();
    const float sc = mode == 0 ? 1.f : 1.f / (float)L;
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        if (t + AHEAD < t1) {
            if (mode == 0) prefetch_token(X, V, nullptr, nullptr, row + AHEAD, d, dv);
            else prefetch_token(X, nullptr, G, O, row + AHEAD, d, dv);
        }
        if (mode == 0) {
            warp_y(V + row * dv, dv, s.y);
        } else {
            warp_gext(G + row * dv, O + row * dv, DEN[row], dv, s.y);
        }
        warp_features(X + row * d, W, d, L, P, beta, s);
        warp_accumulate(s.st, s.phi, s.y, sc, m, w);
    }
    float* dst = out + ((long long)h * nch + c) * m * w;
    for (int e = lane; e < m * w; e += 32) dst[e] = s.st[e];
}

// Combine chunk totals in f64. mode 0: exclusive prefix; 1: exclusive suffix; 2: total
// (written once per head). partials [heads, nchunks, m*w] -> bases.
extern "C" __global__ void race_scan(const float* partials, float* bases, int nchunks, int mw, int mode) {
    const int h = blockIdx.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= mw) return;
    const long long hb = (long long)h * nchunks * mw;
    double run = 0.0;
    if (mode == 2) {
#pragma unroll 8
        for (int c = 0; c < nchunks; ++c) run += (double)partials[hb + (long long)c * mw + e];
        bases[(long long)h * mw + e] = (float)run;
    } else if (mode == 0) {
#pragma unroll 8
        for (int c = 0; c < nchunks; ++c) {
            const float p = partials[hb + (long long)c * mw + e];
            bases[hb + (long long)c * mw + e] = (float)run;
            run += (double)p;
        }
    } else {
#pragma unroll 8
        for (int c = nchunks - 1; c >= 0; --c) {
            const float p = partials[hb + (long long)c * mw + e];
            bases[hb + (long long)c * mw + e] = (float)run;
            run += (double)p;
        }
    }
}

// The smallest f32 denominator (Σ φ A, before the 1/L) a row keeps: m·n·2^-100 for m = L·2^P
// features and n keys (src/cpu/recompute.rs derives it). A row below it, or not finite, is
// flagged: O = 0 and DEN = 0 (so the backward gives it no share), and the host recomputes it
// exactly.
__device__ __forceinline__ float den_floor(int L, int P, int n) {
    return (float)(L << P) * (float)(n > 1 ? n : 1) * 7.88860905e-31f;
}
__device__ __forceinline__ bool den_kept(float den, float floor) {
    return den >= floor && den <= 3.40282347e38f;
}

// Forward: o_t = Σ_f φ_f(q_t) state_f / den, state = base (+ keys ≤ t of this chunk if causal).
extern "C" __global__ void race_fwd(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                    const float* bases, float* O, float* DEN, int n, int d, int dv,
                                    int L, int P, float beta, int chunk, int causal) {
    WARP_CHUNK(causal)
    load_state(bases, causal, h, c, nch, m * w, s);
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        if (t + AHEAD < t1) {
            prefetch_token(Q, nullptr, nullptr, nullptr, row + AHEAD, d, dv);
            if (causal) prefetch_token(K, V, nullptr, nullptr, row + AHEAD, d, dv);
        }
        if (causal) warp_add_key(K + row * d, V + row * dv, W, d, dv, L, P, beta, s);
        warp_features(Q + row * d, W, d, L, P, beta, s);
        warp_read(s.st, s.phi, m, w, w, s.out);
        const float den = s.out[dv];
        const bool kept = den_kept(den, den_floor(L, P, n));
        for (int cc = lane; cc < dv; cc += 32) O[row * dv + cc] = kept ? s.out[cc] / den : 0.f;
        if (lane == 0) DEN[row] = kept ? den / (float)L : 0.f;
        __syncwarp();
    }
}

// Queries' gradients: ∂ℓ/∂φ_f(q_t) = state_f · ĝ_t / L (state: prefix incl. t when causal).
extern "C" __global__ void race_bwd_q(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                      const float* bases, const float* O, const float* G, const float* DEN,
                                      float* DQ, float* DBQ, int n, int d, int dv, int L, int P,
                                      float beta, int chunk, int causal) {
    WARP_CHUNK(causal)
    load_state(bases, causal, h, c, nch, m * w, s);
    const float invL = 1.f / (float)L;
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        if (t + AHEAD < t1) {
            prefetch_token(Q, nullptr, G, O, row + AHEAD, d, dv);
            if (causal) prefetch_token(K, V, nullptr, nullptr, row + AHEAD, d, dv);
        }
        if (causal) warp_add_key(K + row * d, V + row * dv, W, d, dv, L, P, beta, s);
        warp_gext(G + row * dv, O + row * dv, DEN[row], dv, s.out);
        warp_features(Q + row * d, W, d, L, P, beta, s);
        warp_gphi(s.st, s.out, invL, m, w, s.gphi);
        const float db = warp_table_backward(L, P, beta, s.u, s.phi, s.gphi, s);
        warp_dx(W, s.dz, LP, d, DQ + row * d);
        if (lane == 0) DBQ[row] = db;
        __syncwarp();
    }
}

// Keys' gradients, walking the chunk backwards: dstate = [dB | dA] over queries ≥ t (causal)
// or all queries; ∂ℓ/∂φ_f(k_t) = dstate_f · [v_t, 1]; ∂ℓ/∂v_t = Σ_f φ_f(k_t) dB_f.
extern "C" __global__ void race_bwd_k(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                      const float* dbases, const float* O, const float* G, const float* DEN,
                                      float* DK, float* DV, float* DBK, int n, int d, int dv, int L, int P,
                                      float beta, int chunk, int causal) {
    WARP_CHUNK(causal)
    load_state(dbases, causal, h, c, nch, m * w, s);
    const float invL = 1.f / (float)L;
    for (int t = t1 - 1; t >= t0; --t) {
        const long long row = (long long)h * n + t;
        if (t - AHEAD >= t0) {
            prefetch_token(K, V, nullptr, nullptr, row - AHEAD, d, dv);
            if (causal) prefetch_token(Q, nullptr, G, O, row - AHEAD, d, dv);
        }
        if (causal) {
            warp_gext(G + row * dv, O + row * dv, DEN[row], dv, s.out);
            warp_features(Q + row * d, W, d, L, P, beta, s);
            warp_accumulate(s.st, s.phi, s.out, invL, m, w);
        }
        warp_y(V + row * dv, dv, s.y);
        warp_features(K + row * d, W, d, L, P, beta, s);
        warp_gphi(s.st, s.y, 1.f, m, w, s.gphi);
        warp_read(s.st, s.phi, m, w, dv, s.out);
        for (int cc = lane; cc < dv; cc += 32) DV[row * dv + cc] = s.out[cc];
        const float db = warp_table_backward(L, P, beta, s.u, s.phi, s.gphi, s);
        warp_dx(W, s.dz, LP, d, DK + row * d);
        if (lane == 0) DBK[row] = db;
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------
// Tiled kernels: one block of 8 warps owns one chunk and walks it in tiles of TILE tokens.
// Every step of a tile is block-parallel, with no per-token serial work: the tile's input
// rows are loaded coalesced (rows over warps, columns over lanes); the projections
// Z = X Wᵀ run split over the 8 warps (lane = token, warp = a slice of d, partial sums added
// in a fixed order); tanh, the bit sigmoids, the corner products and the softmax backward
// run one thread per element; the wide products (a tile's rows × w bank columns, dx = dz W,
// the chunk totals) are register-blocked tile products with columns over lanes (tile_mma);
// the narrow ones (rows × m features or × TILE tokens, summed over w terms: gφ, the causal
// ĝ·y products, the state updates) give each thread its own block of outputs (blk_prod).
//
// They serve the chunk totals and the non-causal passes (race_*_tile) and the causal passes
// (race_*_tile_causal: the chunked linear-attention form, a masked TILE × TILE product
// within the tile and the chunk's running state carried across tiles, starting from
// race_scan's exclusive prefix, or suffix for the keys' pass, which walks its tiles last to
// first). Limits: m ≤ 8·TM features and w = dv + 1 ≤ 32·TC bank columns (else the host uses
// the warp-per-chunk kernels above).
#define TILE 32
#define TM 8
#define TC 5
// Register blocks are RM rows × TC column groups per thread: TM rows for products over the
// bank's m ≤ 8·TM features (the chunk totals, the state update), TT = TILE/8 for products
// over a tile's tokens.
#define TT (TILE / 8)

// The k loop of tile_mma for NA row blocks and NB column blocks, both known at compile time,
// so the loop body is straight loads and FMAs: no per-step branches, and offsets into sh
// rather than generic pointers, so no address-space conversions inside the loop (a generic
// loop issues about 140 instructions per step for 20 FMAs).
template <int RM, int NA, int NB>
__device__ __forceinline__ void tile_mma_k(float (&acc)[RM][TC], int ao, int ars, int aks, int b0, int bcs, int nc,
                                           int bks, int nk) {
    const int lane = threadIdx.x & 31;
    int bo[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) bo[j] = b0 + min(lane + 32 * j, nc - 1) * bcs;
    int ar[NA];
#pragma unroll
    for (int i = 0; i < NA; ++i) ar[i] = ao + 8 * i * ars;
#pragma unroll 1
    for (int k = 0; k < nk; ++k) {
        float b[NB];
#pragma unroll
        for (int j = 0; j < NB; ++j) b[j] = sh[bo[j] + k * bks];
#pragma unroll
        for (int i = 0; i < NA; ++i) {
            const float a = sh[ar[i] + k * aks];
#pragma unroll
            for (int j = 0; j < NB; ++j) acc[i][j] = fmaf(a, b[j], acc[i][j]);
        }
    }
}

// tile_mma_k with NA picked from the warp's row count na (1 ≤ na ≤ RM).
template <int RM, int NB>
__device__ __forceinline__ void tile_mma_na(float (&acc)[RM][TC], int na, int ao, int ars, int aks, int b0, int bcs,
                                            int nc, int bks, int nk) {
#define TILE_NA_CASE(K)                                                                        \
    case K:                                                                                    \
        if (K <= RM) tile_mma_k<RM, (K <= RM ? K : RM), NB>(acc, ao, ars, aks, b0, bcs, nc, bks, nk); \
        break;
    switch (na) {
        TILE_NA_CASE(1)
        TILE_NA_CASE(2)
        TILE_NA_CASE(3)
        TILE_NA_CASE(4)
        TILE_NA_CASE(5)
        TILE_NA_CASE(6)
        TILE_NA_CASE(7)
        TILE_NA_CASE(8)
    }
#undef TILE_NA_CASE
}

// acc[i][j] (+)= Σ_k A(r, k) B(k, c) for rows r = warp + 8i < nr (i < RM) and columns
// c = lane + 32j < nc, where A(r, k) = A[r*ars + k*aks] and B(k, c) = B[k*bks + c*bcs]; A and
// B must lie in shared memory (read as offsets into sh). Rows are uniform across a warp (A
// reads broadcast); columns run along lanes. Lanes past nc work on a copy of the last
// column, so entries of acc outside nr × nc hold no meaning: tile_store skips them. Column
// blocks run 1, 4 or 5 wide (nc ≤ 32, ≤ 128, ≤ 160), so the TILE-wide and the dv-wide
// products skip the blocks no lane needs.
template <int RM>
__device__ __forceinline__ void tile_mma(float (&acc)[RM][TC], const float* A, int ars, int aks, const float* B,
                                         int bks, int bcs, int nr, int nc, int nk) {
    const int warp = threadIdx.x >> 5;
    const int na = min(RM, (nr - warp + 7) / 8);
    if (na <= 0) return;
    const int ao = (int)(A - sh) + warp * ars, b0 = (int)(B - sh);
    const int nb = (nc + 31) / 32;
    if (nb <= 1) tile_mma_na<RM, 1>(acc, na, ao, ars, aks, b0, bcs, nc, bks, nk);
    else if (nb <= 4) tile_mma_na<RM, 4>(acc, na, ao, ars, aks, b0, bcs, nc, bks, nk);
    else tile_mma_na<RM, 5>(acc, na, ao, ars, aks, b0, bcs, nc, bks, nk);
}

template <int RM>
__device__ __forceinline__ void tile_zero(float (&acc)[RM][TC]) {
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < TC; ++j) acc[i][j] = 0.f;
}

// Store acc rows r = warp + 8i < nr, columns c = lane + 32j < nc, times sc, to dst[r*rs + c].
// With `tri` the entries off a causal triangle are stored as 0: TRI_LOWER keeps c ≤ r
// (earlier keys of a query), TRI_UPPER keeps c ≥ r (later queries of a key).
#define TRI_NONE 0
#define TRI_LOWER 1
#define TRI_UPPER 2
template <int RM>
__device__ __forceinline__ void tile_store(const float (&acc)[RM][TC], float sc, float* dst, long long rs, int nr,
                                           int nc, int tri = TRI_NONE) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int r = warp + 8 * i;
        if (r < nr)
#pragma unroll
            for (int j = 0; j < TC; ++j) {
                const int c = lane + 32 * j;
                const bool off = (tri == TRI_LOWER && c > r) || (tri == TRI_UPPER && c < r);
                if (c < nc) dst[r * rs + c] = off ? 0.f : acc[i][j] * sc;
            }
    }
}

// The narrow products, whose outputs are a tile's rows × m features or × TILE tokens and whose
// sums run over w = dv + 1 terms (gφ = ĝ Sᵀ, the causal ĝ·y products): in tile_mma's layout
// (columns over lanes) only m of 32 lanes would be busy, and each of the w steps would pay
// for 20 FMAs to do m. Here every thread owns an RI × CJ block of outputs, rows rb + nrb·i and
// columns cb + ncb·j, and walks k alone: RI + CJ loads per RI·CJ FMAs, every lane busy.
//   dst[r*ds + c] = (add ? dst[r*ds + c] : 0) + Σ_{k<nk} A[r*ars + k*aks] B[c*bcs + k*bks]
// for r < nr, c < nc, stored as 0 off the `tri` triangle (as tile_store). A and B must lie in
// shared memory (they are read as offsets into sh); dst may be anywhere. No barrier inside:
// each output is read and written by one thread, the same one in every call with the same
// nr and nc, so a second call with add = 1 can follow the first directly.
template <int RI, int CJ>
__device__ __forceinline__ void blk_prod_rc(const float* __restrict__ A, int ars, int aks, const float* __restrict__ B,
                                            int bcs, int bks, int nr, int nc, int nk, float* dst, int ds, int add,
                                            int tri) {
    const int nrb = (nr + RI - 1) / RI, ncb = (nc + CJ - 1) / CJ;
    const int a0 = (int)(A - sh), b0 = (int)(B - sh);  // A and B as offsets into sh
    for (int e = threadIdx.x; e < nrb * ncb; e += blockDim.x) {
        const int rb = e / ncb, cb = e - rb * ncb;
        int ap[RI], bp[CJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) ap[i] = a0 + min(rb + nrb * i, nr - 1) * ars;
#pragma unroll
        for (int j = 0; j < CJ; ++j) bp[j] = b0 + min(cb + ncb * j, nc - 1) * bcs;
        float acc[RI][CJ];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < CJ; ++j) acc[i][j] = 0.f;
#pragma unroll 2
        for (int k = 0; k < nk; ++k) {
            float a[RI], bv[CJ];
#pragma unroll
            for (int i = 0; i < RI; ++i) a[i] = sh[ap[i] + k * aks];
#pragma unroll
            for (int j = 0; j < CJ; ++j) bv[j] = sh[bp[j] + k * bks];
#pragma unroll
            for (int i = 0; i < RI; ++i)
#pragma unroll
                for (int j = 0; j < CJ; ++j) acc[i][j] = fmaf(a[i], bv[j], acc[i][j]);
        }
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < CJ; ++j) {
                const int r = rb + nrb * i, c = cb + ncb * j;
                if (r < nr && c < nc) {
                    const bool off = (tri == TRI_LOWER && c > r) || (tri == TRI_UPPER && c < r);
                    float* o = dst + r * ds + c;
                    *o = off ? 0.f : (add ? *o : 0.f) + acc[i][j];
                }
            }
    }
}

// blk_prod_rc with the block size picked from nr·nc, so that about PROD_SPREAD threads cover
// the outputs: 1 × 1 blocks up to PROD_SPREAD outputs, then 1 × 2, 2 × 2 and 2 × 4. Fewer
// threads with bigger blocks issue fewer instructions in all (RI + CJ loads per RI·CJ FMAs)
// but leave more of the block waiting at the next barrier; the other resident blocks fill
// in. -DPROD_SPREAD=64 (RACELAB_CUDA_DEFINES) is the experiment.
#ifndef PROD_SPREAD
#define PROD_SPREAD 256
#endif
__device__ __forceinline__ void blk_prod(const float* A, int ars, int aks, const float* B, int bcs, int bks, int nr,
                                         int nc, int nk, float* dst, int ds, int add, int tri = TRI_NONE) {
    const int outs = nr * nc;
    if (outs <= PROD_SPREAD) blk_prod_rc<1, 1>(A, ars, aks, B, bcs, bks, nr, nc, nk, dst, ds, add, tri);
    else if (outs <= 2 * PROD_SPREAD) blk_prod_rc<1, 2>(A, ars, aks, B, bcs, bks, nr, nc, nk, dst, ds, add, tri);
    else if (outs <= 4 * PROD_SPREAD) blk_prod_rc<2, 2>(A, ars, aks, B, bcs, bks, nr, nc, nk, dst, ds, add, tri);
    else blk_prod_rc<2, 4>(A, ars, aks, B, bcs, bks, nr, nc, nk, dst, ds, add, tri);
}

// st[f][c] += Σ_s A(s, f) B(s, c) over the tile's nt tokens (A(s, f) = A[s*ars + f],
// B(s, c) = B[s*bks + c]): blk_prod over the m × w state, each thread owning its entries.
__device__ __forceinline__ void state_update(float* st, const float* A, int ars, const float* B, int bks, int m,
                                             int w, int nt) {
    blk_prod(A, 1, ars, B, 1, bks, m, w, nt, st, w, 1);
}

// A block's buffers (floats; `shared_floats_tiled` in src/cuda/mod.rs mirrors this):
// W [LP*d] | xr [TILE*max(d+1, m, w)] (input rows, then results) | red [8*TILE*LP] |
// uq [TILE*LP] | uk (causal) | on, off, dz, db [TILE*LP each] | phq [TILE*(m+1)] |
// phk (causal) | y [TILE*w] | g (causal; else y's buffer) | a, a2 (causal) [TILE*(TILE+1)] |
// dot [TILE] | state [m*w] (kernels that keep one) | dacc [m*w] (the query passes, which also
// total Σ φ(q) ĝ / L over their chunk for the keys' pass).
struct Blk {
    float *W, *xr, *red, *uq, *uk, *on, *off, *dz, *db, *phq, *phk, *y, *g, *a, *a2, *dot, *st, *dacc;
    int xs, mp, tp;  // row strides of xr (as input), phq/phk, a/a2
};

__device__ Blk blk_carve(float* sh, int d, int LP, int m, int w, int causal) {
    // The state and dacc come last; kernels without them simply do not touch that memory.
    Blk b;
    b.xs = d + 1;
    b.mp = m + 1;
    b.tp = TILE + 1;
    int xr = d + 1;
    if (m > xr) xr = m;
    if (w > xr) xr = w;
    float* p = sh;
    b.W = p; p += LP * d;
    b.xr = p; p += TILE * xr;
    b.red = p; p += 8 * TILE * LP;
    b.uq = p; p += TILE * LP;
    b.uk = b.uq;
    if (causal) { b.uk = p; p += TILE * LP; }
    b.on = p; p += TILE * LP;
    b.off = p; p += TILE * LP;
    b.dz = p; p += TILE * LP;
    b.db = p; p += TILE * LP;
    b.phq = p; p += TILE * b.mp;
    b.phk = b.phq;
    if (causal) { b.phk = p; p += TILE * b.mp; }
    b.y = p; p += TILE * w;
    b.g = b.y;
    if (causal) { b.g = p; p += TILE * w; }
    b.a = p;
    b.a2 = p;
    if (causal) { b.a2 = p + TILE * b.tp; p += 2 * TILE * b.tp; }
    b.dot = p; p += TILE;
    b.st = p;
    b.dacc = p + m * w;
    return b;
}

// Rows row0..row0+nt of a [*, cols] input into dst (row stride ds): rows over warps,
// columns over lanes, so each warp reads whole rows coalesced. When cols is a multiple of 4
// (every row then starts 16-byte aligned for f32, 8-byte for bf16), each thread loads 4
// consecutive elements at once, for 2 rows before it stores either (4 rows spilled registers
// in the kernels that keep a bank-sized register block).
__device__ __forceinline__ float4 ld4(const float* __restrict__ p, long long i) {
    return *reinterpret_cast<const float4*>(p + i);
}
#ifdef RACE_BF16
__device__ __forceinline__ float4 ld4(const in_t* __restrict__ p, long long i) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
#endif

template <class T>
__device__ void blk_rows(const T* __restrict__ src, long long row0, int nt, int cols, float* __restrict__ dst,
                         int ds) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (cols % 4 == 0) {
        const int n4 = cols / 4;
        for (int t0 = warp; t0 < nt; t0 += 16)
            for (int c4 = lane; c4 < n4; c4 += 32) {
                float4 v[2];
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    if (t0 + 8 * i < nt) v[i] = ld4(src, (row0 + t0 + 8 * i) * cols + 4 * c4);
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    if (t0 + 8 * i < nt) {
                        float* o = dst + (t0 + 8 * i) * ds + 4 * c4;
                        o[0] = v[i].x;
                        o[1] = v[i].y;
                        o[2] = v[i].z;
                        o[3] = v[i].w;
                    }
            }
    } else {
        for (int t = warp; t < nt; t += 8)
            for (int c = lane; c < cols; c += 32) dst[t * ds + c] = ld(src, (row0 + t) * cols + c);
    }
}

// Ask L2 for rows row0..row0+nt of a [*, cols] input of `esize`-byte elements (one 128-byte
// line per thread), so the next tile's loads find them on chip.
__device__ __forceinline__ void blk_prefetch(const void* src, long long row0, int nt, int cols, int esize) {
    const long long bytes = (long long)nt * cols * esize;
    const char* base = (const char*)src + row0 * cols * esize;
    for (long long off = (long long)threadIdx.x * 128; off < bytes; off += (long long)blockDim.x * 128)
        prefetch_line(base + off);
}

// Prefetch the next tile's rows of up to four inputs (null ones skipped).
__device__ __forceinline__ void blk_prefetch_tile(long long row0, int nt, const in_t* X, int d, const in_t* V,
                                                  const float* G, const float* O, int dv) {
    if (nt <= 0) return;
    if (X) blk_prefetch(X, row0, nt, d, (int)sizeof(in_t));
    if (V) blk_prefetch(V, row0, nt, dv, (int)sizeof(in_t));
    if (G) blk_prefetch(G, row0, nt, dv, 4);
    if (O) blk_prefetch(O, row0, nt, dv, 4);
}

// y = [v, 1] rows into dst (stride ds); the caller synchronises.
__device__ void blk_y(const in_t* V, long long row0, int nt, int dv, float* dst, int ds) {
    blk_rows(V, row0, nt, dv, dst, ds);
    for (int t = threadIdx.x; t < nt; t += blockDim.x) dst[t * ds + dv] = 1.f;
}

// sc · ĝ = sc · [g/den, -(g·o)/den] rows (zeros where den == 0) into dst (stride ds); uses
// xr for the o rows. Ends synchronised.
__device__ void blk_gext(const float* G, const float* O, const float* DEN, long long row0, int nt, int dv, float sc,
                         const Blk& b, float* dst, int ds) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    blk_rows(G, row0, nt, dv, dst, ds);
    blk_rows(O, row0, nt, dv, b.xr, ds);
    __syncthreads();
    for (int t = warp; t < nt; t += 8) {
        float acc = 0.f;
        for (int c = lane; c < dv; c += 32) acc = fmaf(dst[t * ds + c], b.xr[t * ds + c], acc);
        acc = warp_sum(acc);
        if (lane == 0) b.dot[t] = acc;
    }
    __syncthreads();
    for (int t = warp; t < nt; t += 8) {
        const float den = DEN[row0 + t], s = den == 0.f ? 0.f : sc / den;  // one division per row
        for (int c = lane; c < dv; c += 32) dst[t * ds + c] *= s;
        if (lane == 0) dst[t * ds + dv] = -b.dot[t] * s;
    }
    __syncthreads();
}

// Soft features of the nt rows in xr (stride xs): u into U [TILE*LP], φ into PH (stride mp).
// Ends synchronised.
__device__ void blk_features(const Blk& b, int d, int L, int P, float beta, int nt, float* U, float* PH) {
    const int warp = threadIdx.x >> 5, t = threadIdx.x & 31, LP = L * P, R = 1 << P, m = L * R;
    const int seg = (d + 7) / 8, i0 = min(d, warp * seg), i1 = min(d, i0 + seg);
    if (t < nt) {
        const float* x = b.xr + t * b.xs;
        for (int lp0 = 0; lp0 < LP; lp0 += 4) {
            const int nl = min(4, LP - lp0);
            float a[4] = {0.f, 0.f, 0.f, 0.f};
            for (int i = i0; i < i1; ++i) {
                const float xi = x[i];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (j < nl) a[j] = fmaf(b.W[(lp0 + j) * d + i], xi, a[j]);
            }
            float* r = b.red + (warp * TILE + t) * LP + lp0;
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j < nl) r[j] = a[j];
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nt * LP; e += blockDim.x) {
        const int tt = e / LP, lp = e % LP;
        float z = 0.f;
        for (int s = 0; s < 8; ++s) z += b.red[(s * TILE + tt) * LP + lp];
        const float u = tanhf(z), tb = 2.f * beta * u;
        // σ(±tb) from one exponential: σ(|tb|) = 1/(1+e), σ(-|tb|) = e/(1+e), e = exp(-|tb|).
        const float ex = expf(-fabsf(tb)), hi = 1.f / (1.f + ex), lo = ex * hi;
        U[e] = u;
        b.on[e] = tb >= 0.f ? hi : lo;
        b.off[e] = tb >= 0.f ? lo : hi;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nt * m; e += blockDim.x) {
        const int tt = e / m, f = e % m, l = f >> P, r = f & (R - 1);
        const float* on = b.on + tt * LP + l * P;
        const float* off = b.off + tt * LP + l * P;
        float v = 1.f;
        for (int p = 0; p < P; ++p) v *= ((r >> (P - 1 - p)) & 1) ? on[p] : off[p];
        PH[tt * b.mp + f] = v;
    }
    __syncthreads();
}

// Load the nt input rows of X at row0 into xr and featurise them.
__device__ void blk_featurise(const in_t* X, long long row0, int nt, const Blk& b, int d, int L, int P, float beta,
                              float* U, float* PH) {
    blk_rows(X, row0, nt, d, b.xr, b.xs);
    __syncthreads();
    blk_features(b, d, L, P, beta, nt, U, PH);
}

// Through each row's softmaxes: from φ (PH, stride mp), its gradient (GPH, stride gs) and
// u (U), dz = ∂ℓ/∂z into dz, and each row's ∂ℓ/∂β into dot. Ends synchronised.
__device__ void blk_table_backward(const Blk& b, int L, int P, float beta, int nt, const float* U, const float* PH,
                                   const float* GPH, int gs) {
    const int LP = L * P, R = 1 << P;
    for (int e = threadIdx.x; e < nt * LP; e += blockDim.x) {
        const int tt = e / LP, lp = e % LP, l = lp / P, p = lp % P;
        const float* ph = PH + tt * b.mp + l * R;
        const float* gp = GPH + tt * gs + l * R;
        float gbar = 0.f;
        for (int r = 0; r < R; ++r) gbar = fmaf(ph[r], gp[r], gbar);
        float cc = 0.f;
        for (int r = 0; r < R; ++r) {
            const float t = ph[r] * (gp[r] - gbar);
            cc += ((r >> (P - 1 - p)) & 1) ? t : -t;
        }
        const float u = U[e];
        b.dz[e] = beta * cc * (1.f - u * u);
        b.db[e] = u * cc;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < nt; t += blockDim.x) {
        float s = 0.f;
        for (int lp = 0; lp < LP; ++lp) s += b.db[t * LP + lp];
        b.dot[t] = s;
    }
    __syncthreads();
}

// dx = dz W for the tile's rows, straight to global memory (dst row stride d); and each
// row's ∂ℓ/∂β from dot into DB.
__device__ void blk_dx(const Blk& b, int LP, int d, int nt, float* dst, float* DB) {
    for (int c0 = 0; c0 < d; c0 += 32 * TC) {
        const int nc = min(32 * TC, d - c0);
        float acc[TT][TC];
        tile_zero(acc);
        tile_mma(acc, b.dz, LP, 1, b.W + c0, d, 1, nt, nc, LP);
        tile_store(acc, 1.f, dst + c0, d, nt, nc);
    }
    for (int t = threadIdx.x; t < nt; t += blockDim.x) DB[t] = b.dot[t];
}

// The input gradients of the tile's rows from ∂ℓ/∂φ in xr (stride m): the softmax backward,
// then dx = dz W into dst (row stride d) and each row's ∂ℓ/∂β into DB.
__device__ void blk_input_grads(const Blk& b, int L, int P, float beta, int nt, const float* U, const float* PH, int d,
                                float* dst, float* DB) {
    blk_table_backward(b, L, P, beta, nt, U, PH, b.xr, L << P);
    blk_dx(b, L * P, d, nt, dst, DB);
}

// The chunk's Σ φ(q) ĝ / L from dacc to dst (after the last tile's barrier).
__device__ void blk_store_dacc(const Blk& b, float* dst, int mw) {
    for (int e = threadIdx.x; e < mw; e += blockDim.x) dst[e] = b.dacc[e];
}

// Common preamble: shapes, this block's chunk [t0, t1) of head h, the buffers, the planes in
// shared memory, (`state` ≥ 0) the starting state: 1 the head's total (non-causal), 2 this
// chunk's base (causal), and (`with_dacc`) a zeroed accumulator for the chunk's Σ φ(q) ĝ / L.
#define BLK_CHUNK(causal, state, bases, with_dacc)                                             \
    const int R = 1 << P, m = L * R, w = dv + 1, LP = L * P;                                   \
    const int h = blockIdx.y, c = blockIdx.x, nch = gridDim.x;                                 \
    const int t0 = c * chunk, t1 = min(n, t0 + chunk);                                         \
    const Blk b = blk_carve(sh, d, LP, m, w, causal);                                          \
    for (int e = threadIdx.x; e < LP * d; e += blockDim.x) b.W[e] = W[e];                      \
    if (state) {                                                                               \
        const float* src = bases + (state == 2 ? (long long)h * nch + c : (long long)h) * m * w; \
        for (int e = threadIdx.x; e < m * w; e += blockDim.x) b.st[e] = src[e];                \
    }                                                                                          \
    if (with_dacc)                                                                             \
        for (int e = threadIdx.x; e < m * w; e += blockDim.x) b.dacc[e] = 0.f;                 \
    __syncthreads();                                                                           \
    (void)R;

// Chunk totals. mode 0: Σ φ(k_t)[v_t, 1]; mode 1: Σ φ(q_t) ĝ_t / L. Same output as
// race_partial: out [heads, nch, m*w]. The totals stay in registers, RM rows of features per
// thread: race_partial_tile (RM = TM, m ≤ 64) and race_partial_tile_m16 (RM = 2, m ≤ 16,
// fewer registers and more resident blocks for the small banks).
#define PARTIAL_TILE_ARGS                                                                                   \
    const in_t *X, const in_t *V, const float *G, const float *O, const float *DEN, const float *W, float *out, \
        int n, int d, int dv, int L, int P, float beta, int chunk, int mode
template <int RM>
__device__ void partial_tile(PARTIAL_TILE_ARGS) {
    const float* bases = nullptr;
    BLK_CHUNK(0, 0, bases, 0)
    float acc[RM][TC];
    tile_zero(acc);
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        const int nn = min(TILE, t1 - b0 - TILE);
        if (mode == 0) blk_prefetch_tile(row0 + TILE, nn, X, d, V, nullptr, nullptr, dv);
        else blk_prefetch_tile(row0 + TILE, nn, X, d, nullptr, G, O, dv);
        if (mode == 0) blk_y(V, row0, nt, dv, b.y, w);
        else blk_gext(G, O, DEN, row0, nt, dv, 1.f / (float)L, b, b.y, w);
        blk_featurise(X, row0, nt, b, d, L, P, beta, b.uq, b.phq);
        tile_mma(acc, b.phq, 1, b.mp, b.y, w, 1, m, w, nt);  // acc[f][c] += Σ_t φ[t][f] y[t][c]
        __syncthreads();
    }
    tile_store(acc, 1.f, out + ((long long)h * nch + c) * m * w, w, m, w);
}

extern "C" __global__ void __launch_bounds__(256, 2) race_partial_tile(PARTIAL_TILE_ARGS) {
    partial_tile<TM>(X, V, G, O, DEN, W, out, n, d, dv, L, P, beta, chunk, mode);
}

extern "C" __global__ void __launch_bounds__(256, 4) race_partial_tile_m16(PARTIAL_TILE_ARGS) {
    partial_tile<2>(X, V, G, O, DEN, W, out, n, d, dv, L, P, beta, chunk, mode);
}

// o rows = res[t][:dv] / res[t][dv] from xr (stride w); DEN = res[t][dv] / L; rows below
// `floor` flagged (den_floor).
__device__ void blk_normalise(const Blk& b, long long row0, int nt, int dv, int L, float floor, float* O, float* DEN) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = dv + 1;
    for (int t = warp; t < nt; t += 8) {
        const float* r = b.xr + t * w;
        const float den = r[dv];
        const bool kept = den_kept(den, floor);
        const float inv = kept ? 1.f / den : 0.f;  // one division per row
        for (int cc = lane; cc < dv; cc += 32) O[(row0 + t) * dv + cc] = kept ? r[cc] * inv : 0.f;
        if (lane == 0) DEN[row0 + t] = kept ? den / (float)L : 0.f;
    }
}

// Non-causal forward: o_t = Σ_f φ_f(q_t) S_f / den with S the head's total.
extern "C" __global__ void __launch_bounds__(256, 4) race_fwd_tile(const in_t* Q, const float* W, const float* bases, float* O, float* DEN,
                                         int n, int d, int dv, int L, int P, float beta, int chunk) {
    BLK_CHUNK(0, 1, bases, 0)
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        blk_prefetch_tile(row0 + TILE, min(TILE, t1 - b0 - TILE), Q, d, nullptr, nullptr, nullptr, dv);
        blk_featurise(Q, row0, nt, b, d, L, P, beta, b.uq, b.phq);
        float acc[TT][TC];
        tile_zero(acc);
        tile_mma(acc, b.phq, b.mp, 1, b.st, w, 1, nt, w, m);  // res[t][c] = Σ_f φ[t][f] S[f][c]
        tile_store(acc, 1.f, b.xr, w, nt, w);
        __syncthreads();
        blk_normalise(b, row0, nt, dv, L, den_floor(L, P, n), O, DEN);
        __syncthreads();
    }
}

// Non-causal query gradients: ∂ℓ/∂φ(q_t) = S ĝ_t / L; and the chunk's Σ φ(q_t) ĝ_t / L into
// DPART [heads, nch, m*w] (what race_partial's mode 1 computes, without reading q, g, o again).
extern "C" __global__ void __launch_bounds__(256, 4) race_bwd_q_tile(const in_t* Q, const float* W, const float* bases, const float* O,
                                           const float* G, const float* DEN, float* DQ, float* DBQ, float* DPART,
                                           int n, int d, int dv, int L, int P, float beta, int chunk) {
    BLK_CHUNK(0, 1, bases, 1)
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        blk_prefetch_tile(row0 + TILE, min(TILE, t1 - b0 - TILE), Q, d, nullptr, G, O, dv);
        blk_gext(G, O, DEN, row0, nt, dv, 1.f / (float)L, b, b.y, w);
        blk_featurise(Q, row0, nt, b, d, L, P, beta, b.uq, b.phq);
        blk_prod(b.y, w, 1, b.st, w, 1, nt, m, w, b.xr, m, 0);  // gφ[t][f] = Σ_c ĝ[t][c] S[f][c] / L
        __syncthreads();
        state_update(b.dacc, b.phq, b.mp, b.y, w, m, w, nt);
        blk_input_grads(b, L, P, beta, nt, b.uq, b.phq, d, DQ + row0 * d, DBQ + row0);
        __syncthreads();
    }
    blk_store_dacc(b, DPART + ((long long)h * nch + c) * m * w, m * w);
}

// Non-causal key gradients: with D the head's Σ_t φ(q_t) ĝ_t / L,
// ∂ℓ/∂φ(k_t) = D [v_t, 1] and ∂ℓ/∂v_t = Σ_f φ_f(k_t) D_f[:dv].
extern "C" __global__ void __launch_bounds__(256, 4) race_bwd_k_tile(const in_t* K, const in_t* V, const float* W, const float* dbases,
                                           float* DK, float* DV, float* DBK, int n, int d, int dv, int L, int P,
                                           float beta, int chunk) {
    BLK_CHUNK(0, 1, dbases, 0)
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        blk_prefetch_tile(row0 + TILE, min(TILE, t1 - b0 - TILE), K, d, V, nullptr, nullptr, dv);
        blk_y(V, row0, nt, dv, b.y, w);
        blk_featurise(K, row0, nt, b, d, L, P, beta, b.uq, b.phq);
        float acc[TT][TC];
        tile_zero(acc);
        tile_mma(acc, b.phq, b.mp, 1, b.st, w, 1, nt, dv, m);  // dv[t][c] = Σ_f φ[t][f] D[f][c]
        tile_store(acc, 1.f, DV + row0 * dv, dv, nt, dv);
        blk_prod(b.y, w, 1, b.st, w, 1, nt, m, w, b.xr, m, 0);  // gφ[t][f] = Σ_c y[t][c] D[f][c]
        __syncthreads();
        blk_input_grads(b, L, P, beta, nt, b.uq, b.phq, d, DK + row0 * d, DBK + row0);
        __syncthreads();
    }
}

// One causal tile's inputs: y = [v, 1], (with G) ĝ/L, the keys' and the queries' features;
// and an L2 prefetch of the nn rows at next0 that the next tile reads.
__device__ void blk_causal_tile(const Blk& b, const in_t* Q, const in_t* K, const in_t* V, const float* G,
                                const float* O, const float* DEN, long long row0, int nt, long long next0, int nn,
                                int d, int dv, int L, int P, float beta) {
    blk_prefetch_tile(next0, nn, K, d, V, nullptr, nullptr, dv);
    blk_prefetch_tile(next0, nn, Q, d, nullptr, G, O, dv);
    blk_y(V, row0, nt, dv, b.y, dv + 1);
    if (G) blk_gext(G, O, DEN, row0, nt, dv, 1.f / (float)L, b, b.g, dv + 1);
    blk_featurise(K, row0, nt, b, d, L, P, beta, b.uk, b.phk);
    blk_featurise(Q, row0, nt, b, d, L, P, beta, b.uq, b.phq);
}

// Causal forward: o_t = (φq_t S_base + Σ_{s ≤ t in tile} (φq_t·φk_s) [v_s, 1]) / den.
extern "C" __global__ void __launch_bounds__(256, 3) race_fwd_tile_causal(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                                const float* bases, float* O, float* DEN, int n, int d, int dv, int L,
                                                int P, float beta, int chunk) {
    BLK_CHUNK(1, 2, bases, 0)
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        blk_causal_tile(b, Q, K, V, nullptr, nullptr, nullptr, row0, nt, row0 + TILE, min(TILE, t1 - b0 - TILE), d,
                        dv, L, P, beta);
        float acc[TT][TC];
        tile_zero(acc);
        tile_mma(acc, b.phq, b.mp, 1, b.phk, 1, b.mp, nt, nt, m);  // a[t][s] = φq_t·φk_s, s ≤ t
        tile_store(acc, 1.f, b.a, b.tp, nt, nt, TRI_LOWER);
        __syncthreads();
        tile_zero(acc);
        tile_mma(acc, b.phq, b.mp, 1, b.st, w, 1, nt, w, m);  // res = φq S + a y
        tile_mma(acc, b.a, b.tp, 1, b.y, w, 1, nt, w, nt);
        tile_store(acc, 1.f, b.xr, w, nt, w);
        __syncthreads();
        state_update(b.st, b.phk, b.mp, b.y, w, m, w, nt);
        blk_normalise(b, row0, nt, dv, L, den_floor(L, P, n), O, DEN);
        __syncthreads();
    }
}

// Causal query gradients: ∂ℓ/∂φ(q_t) = (S_base ĝ_t + Σ_{s ≤ t in tile} φk_s (y_s·ĝ_t)) / L;
// and the chunk's Σ φ(q_t) ĝ_t / L into DPART, as race_bwd_q_tile.
extern "C" __global__ void __launch_bounds__(256, 3) race_bwd_q_tile_causal(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                                  const float* bases, const float* O, const float* G,
                                                  const float* DEN, float* DQ, float* DBQ, float* DPART, int n, int d,
                                                  int dv, int L, int P, float beta, int chunk) {
    BLK_CHUNK(1, 2, bases, 1)
    for (int b0 = t0; b0 < t1; b0 += TILE) {
        const int nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        blk_causal_tile(b, Q, K, V, G, O, DEN, row0, nt, row0 + TILE, min(TILE, t1 - b0 - TILE), d, dv, L, P, beta);
        blk_prod(b.g, w, 1, b.y, w, 1, nt, nt, w, b.a, b.tp, 0, TRI_LOWER);  // a[t][s] = ĝ_t·y_s / L, s ≤ t
        __syncthreads();
        blk_prod(b.g, w, 1, b.st, w, 1, nt, m, w, b.xr, m, 0);  // gφ = ĝ Sᵀ + a φk
        blk_prod(b.a, b.tp, 1, b.phk, 1, b.mp, nt, m, nt, b.xr, m, 1);
        __syncthreads();
        state_update(b.st, b.phk, b.mp, b.y, w, m, w, nt);
        state_update(b.dacc, b.phq, b.mp, b.g, w, m, w, nt);
        blk_input_grads(b, L, P, beta, nt, b.uq, b.phq, d, DQ + row0 * d, DBQ + row0);
        __syncthreads();
    }
    blk_store_dacc(b, DPART + ((long long)h * nch + c) * m * w, m * w);
}

// Causal key gradients, tiles last to first; D = the suffix state Σ_{t later} φq_t ĝ_tᵀ/L:
// ∂ℓ/∂φ(k_s) = D_base [v_s, 1] + Σ_{t ≥ s in tile} φq_t (ĝ_t·[v_s, 1]) / L,
// ∂ℓ/∂v_s = D_base[:, :dv]ᵀ φk_s + Σ_{t ≥ s in tile} (φk_s·φq_t) ĝ_t[:dv] / L.
extern "C" __global__ void __launch_bounds__(256, 3) race_bwd_k_tile_causal(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                                  const float* dbases, const float* O, const float* G,
                                                  const float* DEN, float* DK, float* DV, float* DBK, int n, int d,
                                                  int dv, int L, int P, float beta, int chunk) {
    BLK_CHUNK(1, 2, dbases, 0)
    const int ntiles = (t1 - t0 + TILE - 1) / TILE;
    for (int ti = ntiles - 1; ti >= 0; --ti) {
        const int b0 = t0 + ti * TILE, nt = min(TILE, t1 - b0);
        const long long row0 = (long long)h * n + b0;
        // The next tile walked is the previous one, always full.
        blk_causal_tile(b, Q, K, V, G, O, DEN, row0, nt, row0 - TILE, ti > 0 ? TILE : 0, d, dv, L, P, beta);
        blk_prod(b.y, w, 1, b.g, w, 1, nt, nt, w, b.a, b.tp, 0, TRI_UPPER);  // a[s][t] = y_s·ĝ_t / L, t ≥ s
        float acc[TT][TC];
        tile_zero(acc);
        tile_mma(acc, b.phk, b.mp, 1, b.phq, 1, b.mp, nt, nt, m);  // a2[s][t] = φk_s·φq_t, t ≥ s
        tile_store(acc, 1.f, b.a2, b.tp, nt, nt, TRI_UPPER);
        __syncthreads();
        blk_prod(b.y, w, 1, b.st, w, 1, nt, m, w, b.xr, m, 0);  // gφ = y Dᵀ + a φq
        blk_prod(b.a, b.tp, 1, b.phq, 1, b.mp, nt, m, nt, b.xr, m, 1);
        tile_zero(acc);
        tile_mma(acc, b.phk, b.mp, 1, b.st, w, 1, nt, dv, m);  // dv = φk D + a2 ĝ
        tile_mma(acc, b.a2, b.tp, 1, b.g, w, 1, nt, dv, nt);
        tile_store(acc, 1.f, DV + row0 * dv, dv, nt, dv);
        __syncthreads();
        state_update(b.st, b.phq, b.mp, b.g, w, m, w, nt);
        blk_input_grads(b, L, P, beta, nt, b.uk, b.phk, d, DK + row0 * d, DBK + row0);
        __syncthreads();
    }
}

// FP32 FMA ceiling probe: 8 independent chains per thread, `iters` rounds, 2 flops per FMA.
// The result is stored so the compiler cannot drop the chains.
extern "C" __global__ void race_fma_peak(float* out, int iters) {
    float x = 1.f + 1e-7f * threadIdx.x, y = 1e-7f;
    float a0 = 0.1f, a1 = 0.2f, a2 = 0.3f, a3 = 0.4f, a4 = 0.5f, a5 = 0.6f, a6 = 0.7f, a7 = 0.8f;
    for (int i = 0; i < iters; ++i) {
        a0 = fmaf(a0, x, y); a1 = fmaf(a1, x, y); a2 = fmaf(a2, x, y); a3 = fmaf(a3, x, y);
        a4 = fmaf(a4, x, y); a5 = fmaf(a5, x, y); a6 = fmaf(a6, x, y); a7 = fmaf(a7, x, y);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
