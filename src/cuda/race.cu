// racelab CUDA kernels for soft RACE (compiled at run time with NVRTC).
//
// Layout: inputs [heads, n, d] (values [heads, n, dv]) row-major; planes W [L, P, d] f32.
// A bank row f (feature f = l*R + r) has width w = dv + 1: value sums and, last, the mass.
// Sequences are split into chunks of `chunk` tokens; one block owns one (chunk, head) and
// keeps its bank state in shared memory (m*w floats). Chunk totals are combined by
// race_scan in f64 (an exclusive scan for causal runs, the total for non-causal ones), so
// f32 only ever accumulates within one chunk. No float atomics: every sum has a fixed order,
// so results are bitwise reproducible run to run.
//
// Compiled twice: as is (f32 inputs) and with -DRACE_BF16 (bf16 inputs read as raw 16-bit
// words and widened exactly to f32). Outputs and gradients are always f32.

#ifdef RACE_BF16
typedef unsigned short in_t;
__device__ __forceinline__ float ld(const in_t* p, long long i) { return __uint_as_float(((unsigned int)p[i]) << 16); }
#else
typedef float in_t;
__device__ __forceinline__ float ld(const in_t* p, long long i) { return p[i]; }
#endif

__device__ __forceinline__ float sigm(float t) {
    if (t >= 0.f) return 1.f / (1.f + expf(-t));
    float e = expf(t);
    return e / (1.f + e);
}

// Soft features of one row x (length d) for all L tables, cooperatively by the block.
// Leaves s_u, s_on, s_off ([L*P]) and s_phi ([L*R]) in shared memory; ends synchronised.
__device__ void block_features(const in_t* x, const float* W, int d, int L, int P, float beta,
                               float* s_z, float* s_u, float* s_on, float* s_off, float* s_phi) {
    const int LP = L * P, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int lp = warp; lp < LP; lp += nwarps) {
        float acc = 0.f;
        for (int i = lane; i < d; i += 32) acc = fmaf(W[(long long)lp * d + i], ld(x, i), acc);
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) s_z[lp] = acc;
    }
    __syncthreads();
    for (int lp = threadIdx.x; lp < LP; lp += blockDim.x) {
        float u = tanhf(s_z[lp]);
        float t = 2.f * beta * u;
        s_u[lp] = u;
        s_on[lp] = sigm(t);
        s_off[lp] = sigm(-t);
    }
    __syncthreads();
    const int R = 1 << P, m = L * R;
    for (int f = threadIdx.x; f < m; f += blockDim.x) {
        int l = f / R, r = f % R;
        float v = 1.f;
        for (int p = 0; p < P; ++p) v *= ((r >> (P - 1 - p)) & 1) ? s_on[l * P + p] : s_off[l * P + p];
        s_phi[f] = v;
    }
    __syncthreads();
}

// ĝ = [g/den, -(g·o)/den] (zeros when den == 0) into s_g; ends synchronised.
__device__ void block_gext(const float* g, const float* o, float den, int dv, float* s_g) {
    if (threadIdx.x < 32) {
        float acc = 0.f;
        for (int c = threadIdx.x; c < dv; c += 32) acc = fmaf(g[c], o[c], acc);
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, s);
        if (threadIdx.x == 0) s_g[dv] = den == 0.f ? 0.f : -acc / den;
    }
    for (int c = threadIdx.x; c < dv; c += blockDim.x) s_g[c] = den == 0.f ? 0.f : g[c] / den;
    __syncthreads();
}

// Shared-memory layout shared by all kernels (floats):
// z, u, on, off [LP each] | phi [m] | y [w] | out [w] | gphi [m] | dz [2*LP] | state [m*w]
#define SH_LAYOUT                                                                  \
    extern __shared__ float sh[];                                                  \
    const int R = 1 << P, m = L * R, w = dv + 1, LP = L * P;                       \
    float* s_z = sh;                                                               \
    float* s_u = s_z + LP;                                                         \
    float* s_on = s_u + LP;                                                        \
    float* s_off = s_on + LP;                                                      \
    float* s_phi = s_off + LP;                                                     \
    float* s_y = s_phi + m;                                                        \
    float* s_out = s_y + w;                                                        \
    float* s_gphi = s_out + w;                                                     \
    float* s_dz = s_gphi + m;                                                      \
    float* s_state = s_dz + 2 * LP;                                                \
    const int h = blockIdx.y, c = blockIdx.x;                                      \
    const int t0 = c * chunk, t1 = min(n, t0 + chunk);                             \
    (void)R; (void)w;

// Chunk totals. mode 0: Σ φ(k_t)[v_t, 1]; mode 1: Σ φ(q_t) ĝ_t / L.
extern "C" __global__ void race_partial(const in_t* X, const in_t* V, const float* G, const float* O,
                                        const float* DEN, const float* W, float* out, int n, int d,
                                        int dv, int L, int P, float beta, int chunk, int mode) {
    SH_LAYOUT
    for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = 0.f;
    const float invL = 1.f / (float)L;
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        block_features(X + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
        if (mode == 0) {
            for (int i = threadIdx.x; i < dv; i += blockDim.x) s_y[i] = ld(V, row * dv + i);
            if (threadIdx.x == 0) s_y[dv] = 1.f;
            __syncthreads();
        } else {
            block_gext(G + row * dv, O + row * dv, DEN[row], dv, s_y);
        }
        const float sc = mode == 0 ? 1.f : invL;
        for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = fmaf(s_phi[e / w] * sc, s_y[e % w], s_state[e]);
        __syncthreads();
    }
    const long long base = ((long long)h * gridDim.x + c) * m * w;
    for (int e = threadIdx.x; e < m * w; e += blockDim.x) out[base + e] = s_state[e];
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
        for (int c = 0; c < nchunks; ++c) run += (double)partials[hb + (long long)c * mw + e];
        bases[(long long)h * mw + e] = (float)run;
    } else if (mode == 0) {
        for (int c = 0; c < nchunks; ++c) {
            bases[hb + (long long)c * mw + e] = (float)run;
            run += (double)partials[hb + (long long)c * mw + e];
        }
    } else {
        for (int c = nchunks - 1; c >= 0; --c) {
            bases[hb + (long long)c * mw + e] = (float)run;
            run += (double)partials[hb + (long long)c * mw + e];
        }
    }
}

// Forward: o_t = Σ_f φ_f(q_t) state_f / den, state = base (+ keys ≤ t of this chunk if causal).
extern "C" __global__ void race_fwd(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                    const float* bases, float* O, float* DEN, int n, int d, int dv,
                                    int L, int P, float beta, int chunk, int causal) {
    SH_LAYOUT
    const float* base = bases + (causal ? ((long long)h * gridDim.x + c) : (long long)h) * m * w;
    for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = base[e];
    __syncthreads();
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        if (causal) {
            block_features(K + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
            for (int i = threadIdx.x; i < dv; i += blockDim.x) s_y[i] = ld(V, row * dv + i);
            if (threadIdx.x == 0) s_y[dv] = 1.f;
            __syncthreads();
            for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = fmaf(s_phi[e / w], s_y[e % w], s_state[e]);
            __syncthreads();
        }
        block_features(Q + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
        for (int cc = threadIdx.x; cc < w; cc += blockDim.x) {
            float acc = 0.f;
            for (int f = 0; f < m; ++f) acc = fmaf(s_phi[f], s_state[f * w + cc], acc);
            s_out[cc] = acc;
        }
        __syncthreads();
        const float den = s_out[dv];
        for (int cc = threadIdx.x; cc < dv; cc += blockDim.x) O[row * dv + cc] = den == 0.f ? 0.f : s_out[cc] / den;
        if (threadIdx.x == 0) DEN[row] = den / (float)L;
        __syncthreads();
    }
}

// Through one row's softmaxes: from s_gphi ([m]) and the bit states, dz = ∂ℓ/∂z into s_dz;
// returns Σ_p u_p c_p (this row's ∂ℓ/∂beta) on thread 0. Ends synchronised.
__device__ float block_table_backward(int L, int P, float beta, const float* s_u, const float* s_phi,
                                      const float* s_gphi, float* s_dz) {
    const int R = 1 << P, LP = L * P;
    for (int lp = threadIdx.x; lp < LP; lp += blockDim.x) {
        const int l = lp / P, p = lp % P;
        const float* ph = s_phi + l * R;
        const float* gp = s_gphi + l * R;
        float gbar = 0.f;
        for (int r = 0; r < R; ++r) gbar = fmaf(ph[r], gp[r], gbar);
        float cc = 0.f;
        for (int r = 0; r < R; ++r) {
            float t = ph[r] * (gp[r] - gbar);
            cc += ((r >> (P - 1 - p)) & 1) ? t : -t;
        }
        const float u = s_u[lp];
        s_dz[lp] = beta * cc * (1.f - u * u);
        s_dz[LP + lp] = u * cc;  // scratch for the beta gradient
    }
    __syncthreads();
    float db = 0.f;
    if (threadIdx.x == 0)
        for (int lp = 0; lp < LP; ++lp) db += s_dz[LP + lp];
    return db;
}

// dx = Σ_lp dz_lp W_lp into out (length d).
__device__ void block_dx(const float* W, const float* s_dz, int LP, int d, float* out) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.f;
        for (int lp = 0; lp < LP; ++lp) acc = fmaf(s_dz[lp], W[(long long)lp * d + i], acc);
        out[i] = acc;
    }
}

// Queries' gradients: ∂ℓ/∂φ_f(q_t) = state_f · ĝ_t / L (state: prefix incl. t when causal).
extern "C" __global__ void race_bwd_q(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                      const float* bases, const float* O, const float* G, const float* DEN,
                                      float* DQ, float* DBQ, int n, int d, int dv, int L, int P,
                                      float beta, int chunk, int causal) {
    SH_LAYOUT
    const float* base = bases + (causal ? ((long long)h * gridDim.x + c) : (long long)h) * m * w;
    for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = base[e];
    __syncthreads();
    const float invL = 1.f / (float)L;
    for (int t = t0; t < t1; ++t) {
        const long long row = (long long)h * n + t;
        if (causal) {
            block_features(K + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
            for (int i = threadIdx.x; i < dv; i += blockDim.x) s_y[i] = ld(V, row * dv + i);
            if (threadIdx.x == 0) s_y[dv] = 1.f;
            __syncthreads();
            for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = fmaf(s_phi[e / w], s_y[e % w], s_state[e]);
            __syncthreads();
        }
        block_gext(G + row * dv, O + row * dv, DEN[row], dv, s_out);
        block_features(Q + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
        for (int f = threadIdx.x; f < m; f += blockDim.x) {
            float acc = 0.f;
            for (int cc = 0; cc < w; ++cc) acc = fmaf(s_state[f * w + cc], s_out[cc], acc);
            s_gphi[f] = acc * invL;
        }
        __syncthreads();
        float db = block_table_backward(L, P, beta, s_u, s_phi, s_gphi, s_dz);
        block_dx(W, s_dz, LP, d, DQ + row * d);
        if (threadIdx.x == 0) DBQ[row] = db;
        __syncthreads();
    }
}

// Keys' gradients, walking the chunk backwards: dstate = [dB | dA] over queries ≥ t (causal)
// or all queries; ∂ℓ/∂φ_f(k_t) = dstate_f · [v_t, 1]; ∂ℓ/∂v_t = Σ_f φ_f(k_t) dB_f.
extern "C" __global__ void race_bwd_k(const in_t* Q, const in_t* K, const in_t* V, const float* W,
                                      const float* dbases, const float* O, const float* G, const float* DEN,
                                      float* DK, float* DV, float* DBK, int n, int d, int dv, int L, int P,
                                      float beta, int chunk, int causal) {
    SH_LAYOUT
    const float* base = dbases + (causal ? ((long long)h * gridDim.x + c) : (long long)h) * m * w;
    for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = base[e];
    __syncthreads();
    const float invL = 1.f / (float)L;
    for (int t = t1 - 1; t >= t0; --t) {
        const long long row = (long long)h * n + t;
        if (causal) {
            block_gext(G + row * dv, O + row * dv, DEN[row], dv, s_out);
            block_features(Q + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
            for (int e = threadIdx.x; e < m * w; e += blockDim.x) s_state[e] = fmaf(s_phi[e / w] * invL, s_out[e % w], s_state[e]);
            __syncthreads();
        }
        block_features(K + row * d, W, d, L, P, beta, s_z, s_u, s_on, s_off, s_phi);
        for (int i = threadIdx.x; i < dv; i += blockDim.x) s_y[i] = ld(V, row * dv + i);
        if (threadIdx.x == 0) s_y[dv] = 1.f;
        __syncthreads();
        for (int f = threadIdx.x; f < m; f += blockDim.x) {
            float acc = 0.f;
            for (int cc = 0; cc < w; ++cc) acc = fmaf(s_state[f * w + cc], s_y[cc], acc);
            s_gphi[f] = acc;
        }
        for (int cc = threadIdx.x; cc < dv; cc += blockDim.x) {
            float acc = 0.f;
            for (int f = 0; f < m; ++f) acc = fmaf(s_phi[f], s_state[f * w + cc], acc);
            DV[row * dv + cc] = acc;
        }
        __syncthreads();
        float db = block_table_backward(L, P, beta, s_u, s_phi, s_gphi, s_dz);
        block_dx(W, s_dz, LP, d, DK + row * d);
        if (threadIdx.x == 0) DBK[row] = db;
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
