// A CPU emulation of the parts of the CUDA execution model that race.cu uses, so its kernels
// run (slowly) on machines without a GPU: every CUDA thread is a fiber (ucontext) of one OS
// thread, run in index order or (EMU_REVERSE=1) in reverse; __syncthreads and __syncwarp are
// barriers that switch to the next runnable fiber;
// __shfl_xor_sync and __shfl_down_sync go through a per-warp exchange buffer between two warp barriers.
// Shared memory is a per-block buffer poisoned with NaN, so a read of scratch nothing wrote
// shows up in the results. Blocks run one after another, in grid order.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ucontext.h>
#include <vector>

struct uint3_ { unsigned x, y, z; };
static uint3_ threadIdx, blockIdx, blockDim, gridDim;
static float* g_shared;

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
using std::min;

namespace emu {
struct Barrier { int arrived = 0, expected = 0; long gen = 0; };
struct Fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    bool done = false;
    Barrier* waiting = nullptr;
    long wait_gen = 0;
};
static std::vector<Fiber> fibers;
static ucontext_t sched;
static int current = -1;
static Barrier block_bar;
static std::vector<Barrier> warp_bars;
static float xchg[64][32];
static double xchgd[64][32];
// Threads run one after another up to their next barrier, in index order, or in reverse
// order with EMU_REVERSE=1. A read of shared data that some other thread writes without a
// barrier in between sees NaN or a stale value in one of the two orders, so running both
// finds missing barriers whichever thread writes first.
static const bool reverse_order = std::getenv("EMU_REVERSE") != nullptr;
static void (*body_fn)(void*);
static void* body_arg;

inline void arrive(Barrier& b) {
    Fiber& f = fibers[current];
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.gen;
        return;  // the last to arrive goes on; the others become runnable
    }
    f.waiting = &b;
    f.wait_gen = b.gen;
    swapcontext(&f.ctx, &sched);
}

static void trampoline() {
    body_fn(body_arg);
    fibers[current].done = true;
    // returning switches to uc_link (the scheduler)
}

// Run `body(arg)` as `threads` CUDA threads of block (bx, by).
inline void run_block(unsigned bx, unsigned by, unsigned threads, void (*body)(void*), void* arg) {
    blockIdx = {bx, by, 0};
    body_fn = body;
    body_arg = arg;
    fibers.assign(threads, Fiber());
    block_bar = Barrier{0, (int)threads, 0};
    warp_bars.assign((threads + 31) / 32, Barrier{0, 32, 0});
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.stack.resize(256 * 1024);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = &sched;
        makecontext(&f.ctx, trampoline, 0);
    }
    for (;;) {
        bool any = false, progressed = false;
        for (unsigned i = 0; i < threads; ++i) {
            const unsigned t = reverse_order ? threads - 1 - i : i;
            Fiber& f = fibers[t];
            if (f.done) continue;
            any = true;
            if (f.waiting && f.waiting->gen == f.wait_gen) continue;  // still blocked
            f.waiting = nullptr;
            current = (int)t;
            threadIdx = {t, 0, 0};
            swapcontext(&sched, &f.ctx);
            progressed = true;
        }
        if (!any) break;
        if (!progressed) {
            std::fprintf(stderr, "emulator: deadlock (threads wait on a barrier others never reach)\n");
            std::exit(3);
        }
    }
}
}  // namespace emu

inline void __syncthreads() { emu::arrive(emu::block_bar); }
inline void __syncwarp() { emu::arrive(emu::warp_bars[threadIdx.x >> 5]); }
inline double __shfl_xor_sync(unsigned, double v, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu::xchgd[w][l] = v;
    __syncwarp();
    const double r = emu::xchgd[w][l ^ o];
    __syncwarp();
    return r;
}
// float through double: the round trip is exact.
inline float __shfl_xor_sync(unsigned m, float v, int o) { return (float)__shfl_xor_sync(m, (double)v, o); }
inline float __shfl_down_sync(unsigned, float v, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu::xchg[w][l] = v;
    __syncwarp();
    const float r = l + o < 32 ? emu::xchg[w][l + o] : v;
    __syncwarp();
    return r;
}
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Guard zones: GUARD floats with the bit pattern GUARD_BITS after every emulated buffer (shared
// memory here, the driver's device buffers there). A kernel that writes past the end of a
// buffer, or a host-side size formula that is too small, changes them and fails the run.
constexpr size_t GUARD = 256;
constexpr uint32_t GUARD_BITS = 0x7fa5a5a5u;  // a NaN no arithmetic produces

inline void guard_fill(float* p) {
    for (size_t i = 0; i < GUARD; ++i) std::memcpy(p + i, &GUARD_BITS, 4);
}

inline void guard_check(const float* p, const char* what) {
    for (size_t i = 0; i < GUARD; ++i) {
        uint32_t b;
        std::memcpy(&b, p + i, 4);
        if (b != GUARD_BITS) {
            std::fprintf(stderr, "emulator: write past the end of %s (guard element %zu)\n", what, i);
            std::exit(5);
        }
    }
}

// Launch `kernel(args...)` over grid (gx, gy) with `threads` threads and `shared` bytes of
// dynamic shared memory (NaN-poisoned before every block, guarded after its end).
template <class F>
void launch(unsigned gx, unsigned gy, unsigned threads, size_t shared, F kernel) {
    gridDim = {gx, gy, 1};
    blockDim = {threads, 1, 1};
    const size_t nsh = (shared + 3) / 4;
    std::vector<float> sh(nsh + GUARD);
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            std::fill(sh.begin(), sh.begin() + nsh, std::numeric_limits<float>::quiet_NaN());
            guard_fill(sh.data() + nsh);
            g_shared = sh.data();
            emu::run_block(bx, by, threads, [](void* k) { (*static_cast<F*>(k))(); }, &kernel);
            guard_check(sh.data() + nsh, "dynamic shared memory (the host's size formula?)");
        }
}
