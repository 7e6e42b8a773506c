// The host side of andrea's CUDA emulator: the driver calls andrea-cuda makes, with
// "device" memory in guarded host pages and kernels run block by block, each thread a
// fiber (see emu.h). Built with the kernels into target/cuda-emu/lib64/libcuda.so.1 by
// `cargo xtask cuda-emu`; x86-64 Linux only (the fiber switch is a few lines of asm).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <mutex>
#include <vector>

#include "emu.h"
#include "emu_kernels.h"

namespace {

enum : int {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_FOUND = 500,
    ILLEGAL_ADDRESS = 700,
    LAUNCH_OUT_OF_RESOURCES = 701,
    MISALIGNED_ADDRESS = 716,
    LAUNCH_FAILED = 719,
};

// ---- fibers ---------------------------------------------------------------------------

extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");

enum State { READY, WAIT_WARP, WAIT_BLOCK, DONE };

// One cp.async copy, its source read when issued, written to shared memory only when
// the issuing thread's cp_async_wait retires its group.
struct AsyncCopy {
    unsigned char* dst;
    unsigned char data[16];
    int bytes;
};

struct Fiber {
    void* sp;
    dim3 tid;
    int warp;
    State state;
    // Warp collectives (mma, ldmatrix): what this lane deposited for the current one,
    // which one it is, and how many this lane has entered (all 32 lanes must agree).
    uint32_t words[10];
    const void* addr;
    int op;
    uint64_t seq;
    // cp.async: copies issued since the last commit, and the committed groups in flight.
    std::vector<AsyncCopy> uncommitted;
    std::deque<std::vector<AsyncCopy>> groups;
    bool committed;
};

const size_t STACK = 128 * 1024;
const int MAX_THREADS = 1024;
// Dynamic shared memory a block may opt in to: an sm_80 block's 163 KiB.
const int MAX_SMEM_OPTIN = 163 * 1024;

struct Scheduler {
    std::vector<Fiber> fibers;
    char* stacks = nullptr;
    void* sched_sp = nullptr;
    Fiber* cur = nullptr;
    dim3 block{0, 0, 0}, bdim{1, 1, 1}, gdim{1, 1, 1};
    std::vector<uint64_t> slots;
    std::vector<float> dyn;
    const EmuKernel* kernel = nullptr;
    void** params = nullptr;
    // The first error an instruction model found in this launch (0: none).
    int err = 0;
    std::string err_msg;
    // The order warps run in between block barriers (andrea_emu_set_warp_order; -1:
    // ANDREA_EMU_WARP_ORDER=lockstep|serial, default lockstep).
    int warp_serial = -1;
};
thread_local Scheduler S;

// Records the launch's first error (the launch then fails with `code` and the message,
// prefixed with the block and thread, naming the kernel); later ones are dropped.
void emu_fail(int code, const char* fmt, ...) {
    if (S.err) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char where[96] = "";
    if (S.cur)
        std::snprintf(where, sizeof where, "block (%u, %u, %u) thread (%u, %u, %u): ", S.block.x, S.block.y,
                      S.block.z, S.cur->tid.x, S.cur->tid.y, S.cur->tid.z);
    S.err = code;
    S.err_msg = std::string(where) + msg;
}

void fiber_main() {
    S.kernel->invoke(S.kernel->fn, S.params);
    if (!S.cur->uncommitted.empty())
        emu_fail(LAUNCH_FAILED, "exits with %zu cp.async copies never committed (cp_async_commit missing)",
                 S.cur->uncommitted.size());
    for (auto& g : S.cur->groups)
        if (!g.empty()) {
            emu_fail(LAUNCH_FAILED,
                     "exits with cp.async copies in flight (no cp_async_wait retired their group)");
            break;
        }
    S.cur->state = DONE;
    emu_switch(&S.cur->sp, S.sched_sp);
    std::abort();  // a finished fiber is never resumed
}

void yield(State st) {
    S.cur->state = st;
    emu_switch(&S.cur->sp, S.sched_sp);
}

void init_fiber(Fiber& f, int i) {
    char* top = S.stacks + (size_t)(i + 1) * STACK;
    void** sp = reinterpret_cast<void**>(top);
    *--sp = nullptr;                                      // fake return address of fiber_main
    *--sp = reinterpret_cast<void*>(&fiber_main);         // emu_switch's `ret` lands here
    for (int r = 0; r < 6; ++r) *--sp = nullptr;          // rbp rbx r12 r13 r14 r15
    f.sp = sp;
    unsigned bx = S.bdim.x, by = S.bdim.y;
    f.tid = dim3{i % bx, (i / bx) % by, i / (bx * by)};
    f.warp = i / 32;
    f.state = READY;
    f.op = 0;
    f.seq = 0;
    f.addr = nullptr;
    f.uncommitted.clear();
    f.groups.clear();
    f.committed = false;
}

// Runs one block to completion; false on a barrier deadlock.
//
// Warp order (ANDREA_EMU_WARP_ORDER=lockstep|serial for the process, or
// andrea_emu_set_warp_order per thread). Lockstep (the default): each round runs every ready fiber to its next
// yield (a barrier, a shuffle, a warp collective), so all warps advance together and a
// missing __syncthreads between one warp's shared-memory writes and another's reads
// mostly goes unseen, as on a GPU where warps happen to stay in step. Serial
// (andrea_emu_set_warp_order(1)): each warp runs alone, through its warp-level
// synchronisation, until all its lanes wait at a block barrier or have exited, before
// the next warp starts; a legal GPU schedule, and the one that exposes such a missing
// barrier (warp 0 overwrites what warp 1 has yet to read, or reads what warp 1 has yet
// to write).
bool run_block() {
    int n = (int)(S.bdim.x * S.bdim.y * S.bdim.z);
    S.fibers.resize(n);
    for (int i = 0; i < n; ++i) init_fiber(S.fibers[i], i);
    int warps = (n + 31) / 32;
    auto run = [](Fiber& f) {
        if (f.state == READY) {
            S.cur = &f;
            emu_switch(&S.sched_sp, f.sp);
        }
    };
    // Releases warp w when every lane waits at a warp barrier or has exited.
    auto release_warp = [n](int w) {
        int lo = w * 32, hi = std::min(n, lo + 32);
        bool any = false, all = true;
        for (int i = lo; i < hi; ++i) {
            State s = S.fibers[i].state;
            if (s == WAIT_WARP) any = true;
            else if (s != DONE) all = false;
        }
        if (!(any && all)) return false;
        for (int i = lo; i < hi; ++i)
            if (S.fibers[i].state == WAIT_WARP) S.fibers[i].state = READY;
        return true;
    };
    static const bool env_serial = [] {
        const char* v = std::getenv("ANDREA_EMU_WARP_ORDER");
        return v && std::strcmp(v, "serial") == 0;
    }();
    bool serial = S.warp_serial >= 0 ? S.warp_serial == 1 : env_serial;
    for (;;) {
        if (serial) {
            for (int w = 0; w < warps; ++w) do {
                    for (int i = w * 32; i < std::min(n, w * 32 + 32); ++i) run(S.fibers[i]);
                } while (release_warp(w));
        } else {
            for (auto& f : S.fibers) run(f);
        }
        bool released = false, all_done = true;
        for (int w = 0; w < warps; ++w) released = release_warp(w) || released;
        bool any_block = false, all_block = true;
        for (auto& f : S.fibers) {
            if (f.state != DONE) all_done = false;
            if (f.state == WAIT_BLOCK) any_block = true;
            else if (f.state != DONE) all_block = false;
        }
        if (any_block && all_block) {
            for (auto& f : S.fibers)
                if (f.state == WAIT_BLOCK) f.state = READY;
            released = true;
        }
        if (all_done) return true;
        bool ready = released;
        for (auto& f : S.fibers) ready = ready || f.state == READY;
        if (!ready) return false;
    }
}

// ---- memory ---------------------------------------------------------------------------

struct Alloc {
    char* base;
    size_t map_len, size, padded;
};
std::mutex mem_lock;
std::map<uintptr_t, Alloc> allocs;
const unsigned char CANARY = 0xA5;

size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }

// Bytes after the end of each allocation up to its 256-byte padding hold a canary;
// the page after the padding is unmapped, so reads past it fault.
bool canaries_intact(const char** which) {
    std::lock_guard<std::mutex> g(mem_lock);
    for (auto& kv : allocs) {
        const Alloc& a = kv.second;
        const unsigned char* p = reinterpret_cast<const unsigned char*>(kv.first);
        for (size_t i = a.size; i < a.padded; ++i)
            if (p[i] != CANARY) {
                *which = "a buffer's end";
                return false;
            }
    }
    return true;
}

int copy(void* dst, const void* src, size_t n) {
    if (n) std::memcpy(dst, src, n);
    return OK;
}

}  // namespace

// ---- what the kernels call ------------------------------------------------------------

const dim3& emu_thread_idx() { return S.cur->tid; }
const dim3& emu_block_idx() { return S.block; }
const dim3& emu_block_dim() { return S.bdim; }
const dim3& emu_grid_dim() { return S.gdim; }
void emu_sync_block() { yield(WAIT_BLOCK); }
void emu_sync_warp() { yield(WAIT_WARP); }
uint64_t emu_exchange(uint64_t v, int src) {
    int lane = (int)(S.cur - S.fibers.data()) % 32;
    int w = S.cur->warp;
    S.slots[w * 32 + lane] = v;
    yield(WAIT_WARP);
    uint64_t r = S.slots[w * 32 + src];
    yield(WAIT_WARP);
    return r;
}
float* emu_dynamic_smem() { return S.dyn.data(); }
float emu_tanh_approx(float x) {
    // tanhf rounded to 11 significant bits: an error of the instruction's size (2^-11).
    float t = tanhf(x);
    uint32_t u;
    std::memcpy(&u, &t, 4);
    u = (u + 0x1000u) & ~0x1fffu;
    std::memcpy(&t, &u, 4);
    return t;
}

// ---- tensor-core and asynchronous-copy instructions -----------------------------------
//
// Each is modelled as the PTX ISA states it, per lane. mma and ldmatrix are warp
// collectives: every lane deposits its registers (or its row address) in its fiber, a
// warp barrier, each lane computes its own outputs from all 32 lanes' deposits, and a
// second warp barrier before anyone deposits again. All 32 lanes of the warp must enter
// the same instruction (`.sync.aligned`); a lane that has exited or is elsewhere fails
// the launch.

namespace {

enum Op { OP_MMA_BF16 = 1, OP_MMA_TF32, OP_LDMATRIX };

const char* op_name(int op) {
    switch (op) {
        case OP_MMA_BF16: return "mma_bf16_m16n8k16";
        case OP_MMA_TF32: return "mma_tf32_m16n8k8";
        case OP_LDMATRIX: return "ldmatrix";
        default: return "another instruction";
    }
}

// Enters collective `op` with this lane's deposit already in S.cur; returns the warp's
// 32 fibers once all have deposited, or nullptr (launch failed) when they do not agree.
Fiber* warp_enter(int op) {
    Fiber* me = S.cur;
    me->op = op;
    me->seq++;
    yield(WAIT_WARP);
    int idx = (int)(me - S.fibers.data());
    int base = idx - idx % 32;
    if (base + 32 > (int)S.fibers.size()) {
        emu_fail(LAUNCH_FAILED, "%s in a warp of fewer than 32 threads", op_name(op));
        return nullptr;
    }
    Fiber* w = &S.fibers[base];
    for (int l = 0; l < 32; ++l)
        if (w[l].state == DONE || w[l].op != op || w[l].seq != me->seq) {
            emu_fail(LAUNCH_FAILED, "%s not reached by all 32 lanes together (lane %d %s)", op_name(op), l,
                     w[l].state == DONE ? "has exited" : "is at a different warp instruction");
            return nullptr;
        }
    return w;
}

// The second barrier: nobody deposits again before every lane has read.
void warp_leave() { yield(WAIT_WARP); }

bool in_stack(const void* p) {
    const char* c = static_cast<const char*>(p);
    return S.stacks && c >= S.stacks && c < S.stacks + STACK * MAX_THREADS;
}

// The allocation holding [p, p + n), if any (`partial`: p is inside one but p + n is not).
const Alloc* global_at(const void* p, size_t n, bool* partial) {
    std::lock_guard<std::mutex> g(mem_lock);
    *partial = false;
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return nullptr;
    --it;
    if (a >= it->first && a < it->first + it->second.padded) {
        if (a + n > it->first + it->second.size) {
            *partial = true;
            return nullptr;
        }
        return &it->second;
    }
    return nullptr;
}

// Whether [p, p + n) can be shared memory: not device (global) memory, not a thread's
// stack (local memory), and inside the dynamic shared memory when it starts there. The
// emulator cannot tell a static `__shared__` array from other host memory, so that is
// what it cannot check.
bool check_shared(const char* what, const void* p, size_t n) {
    bool partial;
    if (global_at(p, n, &partial) || partial) {
        emu_fail(ILLEGAL_ADDRESS, "%s: address %p is in global (device) memory, not shared memory", what, p);
        return false;
    }
    if (in_stack(p)) {
        emu_fail(ILLEGAL_ADDRESS, "%s: address %p is in a thread's local memory, not shared memory", what, p);
        return false;
    }
    const char* c = static_cast<const char*>(p);
    const char* d0 = reinterpret_cast<const char*>(S.dyn.data());
    const char* d1 = d0 + (S.dyn.size() - 1) * sizeof(float);  // the last float is padding
    if (c >= d0 && c < d0 + S.dyn.size() * sizeof(float) && c + n > d1) {
        emu_fail(ILLEGAL_ADDRESS, "%s: [%p, +%zu) runs past the end of the dynamic shared memory", what, p, n);
        return false;
    }
    return true;
}

float bf16_value(uint32_t word, int half) {
    uint32_t u = (half ? word >> 16 : word & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// A b32 mma.tf32 operand as the tensor core reads it: sign, exponent and the upper 10
// mantissa bits; the low 13 bits are ignored (truncated toward zero), so an operand not
// converted with cvt.rna acts as FP32 truncated to TF32. (The PTX ISA leaves the tf32
// layout implementation-defined; truncation is what Ampere and Hopper are documented by
// NVIDIA's libraries to do — CUTLASS's round_toward_zero tf32 conversion is a plain
// reinterpretation for that reason.) NaN stays NaN.
float tf32_value(uint32_t word) {
    uint32_t u = word;
    bool nan = (u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu);
    u &= ~0x1fffu;
    if (nan) u |= 0x00400000u;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint32_t float_word(float f) {
    uint32_t w;
    std::memcpy(&w, &f, 4);
    return w;
}

// D = A·B + C for one lane: d[j] = C[row][col] + Σ_k A[row][k]·B[k][col], summed in FP32
// in ascending k starting from C, each product exact (BF16·BF16 and TF32·TF32 products
// fit in FP32's 24 bits) and each addition rounded to nearest even — one valid order;
// the hardware's is unspecified (tests compare against it with a bound).
template <class A, class B>
void mma_lane(float* d, const float* c, int K, A a_at, B b_at) {
    int l = emu_lane(), g = l / 4, t = l % 4;
    for (int j = 0; j < 4; ++j) {
        int row = g + (j >= 2 ? 8 : 0), col = 2 * t + (j & 1);
        float s = c[j];
        for (int k = 0; k < K; ++k) s = fmaf(a_at(row, k), b_at(k, col), s);
        d[j] = s;
    }
}

}  // namespace

void emu_mma_bf16_m16n8k16(float* d, const unsigned* a, const unsigned* b, const float* c) {
    Fiber* me = S.cur;
    for (int i = 0; i < 4; ++i) me->words[i] = a[i];
    for (int i = 0; i < 2; ++i) me->words[4 + i] = b[i];
    float cin[4] = {c[0], c[1], c[2], c[3]};
    Fiber* w = warp_enter(OP_MMA_BF16);
    float out[4] = {0, 0, 0, 0};
    if (w) {
        // A[r][k]: lane 4(r % 8) + (k % 8) / 2, register (r >= 8) + 2(k >= 8), half k % 2.
        auto a_at = [&](int r, int k) {
            return bf16_value(w[4 * (r % 8) + (k % 8) / 2].words[(r >= 8) + 2 * (k >= 8)], k & 1);
        };
        // B[k][n]: lane 4n + (k % 8) / 2, register (k >= 8), half k % 2.
        auto b_at = [&](int k, int n) { return bf16_value(w[4 * n + (k % 8) / 2].words[4 + (k >= 8)], k & 1); };
        mma_lane(out, cin, 16, a_at, b_at);
    }
    warp_leave();
    std::memcpy(d, out, sizeof out);
}

void emu_mma_tf32_m16n8k8(float* d, const unsigned* a, const unsigned* b, const float* c) {
    Fiber* me = S.cur;
    for (int i = 0; i < 4; ++i) me->words[i] = a[i];
    for (int i = 0; i < 2; ++i) me->words[4 + i] = b[i];
    float cin[4] = {c[0], c[1], c[2], c[3]};
    Fiber* w = warp_enter(OP_MMA_TF32);
    float out[4] = {0, 0, 0, 0};
    if (w) {
        // A[r][k]: lane 4(r % 8) + k % 4, register (r >= 8) + 2(k >= 4).
        auto a_at = [&](int r, int k) { return tf32_value(w[4 * (r % 8) + k % 4].words[(r >= 8) + 2 * (k >= 4)]); };
        // B[k][n]: lane 4n + k % 4, register (k >= 4).
        auto b_at = [&](int k, int n) { return tf32_value(w[4 * n + k % 4].words[4 + (k >= 4)]); };
        mma_lane(out, cin, 8, a_at, b_at);
    }
    warp_leave();
    std::memcpy(d, out, sizeof out);
}

// ldmatrix.m8n8.x{1,2,4}[.trans].b16: matrix i's row r comes from lane 8i + r's address
// (16 bytes, 16-byte aligned, shared memory); lanes 8·count.. are ignored. Lane l gets
// in r[i] row l / 4, columns 2(l % 4), 2(l % 4) + 1 (lower column in the lower half); with
// .trans the same positions of the transpose: M[2(l % 4)][l / 4], M[2(l % 4) + 1][l / 4].
void emu_ldmatrix(unsigned* r, int count, bool trans, const void* row_addr) {
    S.cur->addr = row_addr;
    Fiber* w = warp_enter(OP_LDMATRIX);
    unsigned out[4] = {0, 0, 0, 0};
    if (w) {
        int l = emu_lane();
        bool ok = true;
        for (int i = 0; i < count && ok; ++i) {
            uint16_t e[2];
            for (int h = 0; h < 2 && ok; ++h) {
                int row = trans ? 2 * (l % 4) + h : l / 4;
                int col = trans ? l / 4 : 2 * (l % 4) + h;
                const void* p = w[8 * i + row].addr;
                if ((uintptr_t)p % 16) {
                    emu_fail(MISALIGNED_ADDRESS, "ldmatrix: lane %d's row address %p is not 16-byte aligned",
                             8 * i + row, p);
                    ok = false;
                } else if (!check_shared("ldmatrix", p, 16)) {
                    ok = false;
                } else {
                    std::memcpy(&e[h], static_cast<const char*>(p) + 2 * col, 2);
                }
            }
            if (ok) out[i] = (unsigned)e[0] | ((unsigned)e[1] << 16);
        }
        if (!ok) std::memset(out, 0, sizeof out);
    }
    warp_leave();
    for (int i = 0; i < count; ++i) r[i] = out[i];
}

// cp.async: the source (`src_bytes` of it; the rest of `bytes` is zero) is read when the
// copy is issued and written to shared memory when this thread's cp_async_wait retires
// its group, so shared memory read before that still holds what it held before.
void emu_cp_async(void* smem, const void* gmem, int bytes, int src_bytes) {
    if (src_bytes < 0 || src_bytes > bytes) {
        emu_fail(LAUNCH_FAILED, "cp_async_%d: src_bytes %d is outside 0..=%d", bytes, src_bytes, bytes);
        return;
    }
    if ((uintptr_t)smem % bytes || (src_bytes > 0 && (uintptr_t)gmem % bytes)) {
        emu_fail(MISALIGNED_ADDRESS, "cp_async_%d: shared %p or global %p not %d-byte aligned", bytes, smem, gmem,
                 bytes);
        return;
    }
    if (!check_shared("cp_async (destination)", smem, (size_t)bytes)) return;
    AsyncCopy c{static_cast<unsigned char*>(smem), {0}, bytes};
    if (src_bytes > 0) {
        bool partial;
        if (!global_at(gmem, (size_t)src_bytes, &partial)) {
            emu_fail(ILLEGAL_ADDRESS, "cp_async_%d: source [%p, +%d) is %s", bytes, gmem, src_bytes,
                     partial ? "past the end of its device buffer" : "not in device (global) memory");
            return;
        }
        std::memcpy(c.data, gmem, (size_t)src_bytes);
    }
    S.cur->uncommitted.push_back(c);
}

void emu_cp_async_commit() {
    Fiber* me = S.cur;
    me->groups.push_back(std::move(me->uncommitted));
    me->uncommitted.clear();
    me->committed = true;
}

void emu_cp_async_wait(int pending) {
    Fiber* me = S.cur;
    if (!me->uncommitted.empty()) {
        emu_fail(LAUNCH_FAILED, "cp_async_wait<%d> with %zu copies issued but not committed (no group waits for them)",
                 pending, me->uncommitted.size());
        return;
    }
    if (!me->committed) {
        emu_fail(LAUNCH_FAILED, "cp_async_wait<%d> with no cp_async_commit before it", pending);
        return;
    }
    while ((int)me->groups.size() > pending) {
        for (const AsyncCopy& c : me->groups.front()) std::memcpy(c.dst, c.data, (size_t)c.bytes);
        me->groups.pop_front();
    }
}

// cvt.rna.tf32.f32: nearest, ties away from zero; the result's low 13 bits are zero.
unsigned emu_f32_to_tf32(float x) { return float_word(nvcuda::wmma::__float_to_tf32(x)); }

// cvt.rn.bf16x2.f32 d, hi, lo: nearest, ties to even; NaN becomes the canonical 0x7fff.
unsigned emu_pack_bf16x2(float lo, float hi) {
    auto one = [](float f) -> unsigned { return std::isnan(f) ? 0x7fffu : __float2bfloat16(f).bits; };
    return one(lo) | (one(hi) << 16);
}

// ---- the driver API -------------------------------------------------------------------

// What the calling thread asked of the driver, for tests that count the host's waits on
// the device inside a training step (crates/andrea-cuda/tests/model_vs_cpu.rs): stream and
// context synchronisations, copies each way, allocations, frees (cuMemFree waits for the
// device on a real GPU) and launches; the launch count at the last two
// synchronisations, so a test can tell where in a step the host waited; and how many of
// the host-to-device copies were asynchronous ones from page-locked memory
// (cuMemAllocHost), the only kind a real driver does not wait on. Per thread, so tests
// running in parallel in one binary each see their own.
enum {
    C_SYNC, C_DTOH, C_HTOD, C_ALLOC, C_FREE, C_LAUNCH, C_LAUNCH_AT_PREV_SYNC, C_LAUNCH_AT_SYNC,
    C_HTOD_ASYNC_PINNED, C_COUNT
};
static thread_local unsigned long long driver_counts[C_COUNT];

static void count_sync() {
    ++driver_counts[C_SYNC];
    driver_counts[C_LAUNCH_AT_PREV_SYNC] = driver_counts[C_LAUNCH_AT_SYNC];
    driver_counts[C_LAUNCH_AT_SYNC] = driver_counts[C_LAUNCH];
}

extern "C" {

// Copies the calling thread's counts, in the enum's order, into out[0..n) (n <= 9);
// returns how many there are. Not a CUDA entry point: the real driver has no such symbol,
// so a test looks it up with dlsym and counts only on the emulator.
int andrea_emu_driver_counts(unsigned long long* out, int n) {
    for (int i = 0; i < n && i < C_COUNT; ++i) out[i] = driver_counts[i];
    return C_COUNT;
}

// The calling thread's warp order for its later launches (see run_block): 0 lockstep,
// 1 serial, -1 as ANDREA_EMU_WARP_ORDER says (lockstep unless `serial`). Not a CUDA
// entry point; tests look it up with dlsym.
void andrea_emu_set_warp_order(int serial) { S.warp_serial = serial; }

int cuInit(unsigned) { return OK; }
int cuDriverGetVersion(int* v) {
    *v = 13000;
    return OK;
}
int cuDeviceGetCount(int* n) {
    *n = 1;
    return OK;
}
int cuDeviceGet(int* d, int ordinal) {
    if (ordinal != 0) return 101;
    *d = 0;
    return OK;
}
int cuDeviceGetName(char* name, int len, int) {
    std::snprintf(name, (size_t)len, "andrea CUDA emulator (CPU)");
    return OK;
}
// An sm_80 device (an A100's SM limits) with one multiprocessor. 0 for what andrea does
// not ask.
int cuDeviceGetAttribute(int* v, int attr, int) {
    switch (attr) {
        case 1: *v = 1024; break;     // max threads per block
        case 8: *v = 48 * 1024; break;  // shared memory per block without opting in
        case 10: *v = 32; break;      // warp size
        case 12: *v = 65536; break;   // registers per block
        case 16: *v = 1; break;       // multiprocessors
        case 39: *v = 2048; break;    // threads per multiprocessor
        case 75: *v = 8; break;       // compute capability major
        case 76: *v = 0; break;       // minor
        case 81: *v = 164 * 1024; break;  // shared memory per multiprocessor
        case 82: *v = 65536; break;   // registers per multiprocessor
        case 97: *v = MAX_SMEM_OPTIN; break;  // shared memory per block, opted in
        case 106: *v = 32; break;     // blocks per multiprocessor
        case 111: *v = 1024; break;   // shared memory the driver reserves per block
        default: *v = 0;
    }
    return OK;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
    *bytes = (size_t)16 << 30;
    return OK;
}
int cuMemGetInfo_v2(size_t* free_b, size_t* total) {
    *free_b = *total = (size_t)16 << 30;
    return OK;
}
static int dummy_ctx, dummy_stream, dummy_module;
int cuDevicePrimaryCtxRetain(void** ctx, int) {
    *ctx = &dummy_ctx;
    return OK;
}
int cuDevicePrimaryCtxRelease_v2(int) { return OK; }
int cuCtxSetCurrent(void*) { return OK; }
int cuCtxGetCurrent(void** ctx) {
    *ctx = &dummy_ctx;
    return OK;
}
int cuCtxSynchronize() {
    count_sync();
    return OK;
}
int cuStreamCreateWithPriority(void** s, unsigned, int) {
    *s = &dummy_stream;
    return OK;
}
int cuStreamDestroy_v2(void*) { return OK; }
int cuStreamSynchronize(void*) {
    count_sync();
    return OK;
}

int cuMemAlloc_v2(uint64_t* dptr, size_t size) {
    ++driver_counts[C_ALLOC];
    if (size == 0) return INVALID_VALUE;
    size_t padded = (size + 255) / 256 * 256;
    size_t body = (padded + page() - 1) / page() * page();
    size_t map_len = body + page();
    void* m = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    char* base = static_cast<char*>(m);
    mprotect(base + body, page(), PROT_NONE);
    char* p = base + body - padded;
    std::memset(p, 0x7f, size);  // garbage, like fresh device memory
    std::memset(p + size, CANARY, padded - size);
    std::lock_guard<std::mutex> g(mem_lock);
    allocs[(uintptr_t)p] = Alloc{base, map_len, size, padded};
    *dptr = (uint64_t)(uintptr_t)p;
    return OK;
}
int cuMemFree_v2(uint64_t dptr) {
    ++driver_counts[C_FREE];
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = allocs.find((uintptr_t)dptr);
    if (it == allocs.end()) return INVALID_VALUE;
    munmap(it->second.base, it->second.map_len);
    allocs.erase(it);
    return OK;
}
int cuMemsetD8_v2(uint64_t d, unsigned char v, size_t n) {
    if (n) std::memset((void*)(uintptr_t)d, v, n);
    return OK;
}
int cuMemsetD32_v2(uint64_t d, unsigned v, size_t n) {
    uint32_t* p = (uint32_t*)(uintptr_t)d;
    for (size_t i = 0; i < n; ++i) p[i] = v;
    return OK;
}
int cuMemsetD32Async(uint64_t d, unsigned v, size_t n, void*) { return cuMemsetD32_v2(d, v, n); }
int cuMemcpyHtoD_v2(uint64_t d, const void* s, size_t n) {
    ++driver_counts[C_HTOD];
    return copy((void*)(uintptr_t)d, s, n);
}
// Page-locked host allocations: start -> size.
static std::mutex pinned_lock;
static std::map<uintptr_t, size_t> pinned;
int cuMemAllocHost_v2(void** p, size_t size) {
    if (size == 0) return INVALID_VALUE;
    *p = std::malloc(size);
    if (!*p) return OUT_OF_MEMORY;
    std::lock_guard<std::mutex> g(pinned_lock);
    pinned[(uintptr_t)*p] = size;
    return OK;
}
int cuMemFreeHost(void* p) {
    std::lock_guard<std::mutex> g(pinned_lock);
    auto it = pinned.find((uintptr_t)p);
    if (it == pinned.end()) return INVALID_VALUE;
    pinned.erase(it);
    std::free(p);
    return OK;
}
static bool is_pinned(const void* s, size_t n) {
    std::lock_guard<std::mutex> g(pinned_lock);
    auto it = pinned.upper_bound((uintptr_t)s);
    if (it == pinned.begin()) return false;
    --it;
    return (uintptr_t)s + n <= it->first + it->second;
}
int cuMemcpyHtoDAsync_v2(uint64_t d, const void* s, size_t n, void*) {
    ++driver_counts[C_HTOD];
    if (is_pinned(s, n)) ++driver_counts[C_HTOD_ASYNC_PINNED];
    return copy((void*)(uintptr_t)d, s, n);
}
int cuMemcpyDtoH_v2(void* d, uint64_t s, size_t n) {
    ++driver_counts[C_DTOH];
    return copy(d, (const void*)(uintptr_t)s, n);
}
int cuMemcpyDtoHAsync_v2(void* d, uint64_t s, size_t n, void*) {
    ++driver_counts[C_DTOH];
    return copy(d, (const void*)(uintptr_t)s, n);
}

// The kernels are compiled in; the image is only checked to be one the driver takes:
// a fatbin (its magic number) or PTX text (NUL-terminated, with a `.version`).
int cuModuleLoadDataEx(void** m, const void* image, unsigned, void*, void*) {
    if (!image) return INVALID_VALUE;
    uint32_t magic = 0;
    std::memcpy(&magic, image, sizeof magic);
    if (magic != 0xBA55ED50u && !std::strstr(static_cast<const char*>(image), ".version")) return 218;
    *m = &dummy_module;
    return OK;
}
int cuModuleUnload(void*) { return OK; }
int cuModuleGetFunction(void** f, void*, const char* name) {
    int n = 0;
    const EmuKernel* table = emu_kernel_table(&n);
    for (int i = 0; i < n; ++i)
        if (std::strcmp(table[i].name, name) == 0) {
            *f = (void*)&table[i];
            return OK;
        }
    return NOT_FOUND;
}

// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (8): the opt-in past 48 KiB, up to
// an sm_80 block's 163 KiB (cuDeviceGetAttribute 97).
static std::map<const void*, int> max_dynamic_smem;
int cuFuncSetAttribute(void* f, int attrib, int value) {
    if (attrib != 8) return 801;  // CUDA_ERROR_NOT_SUPPORTED
    if (value < 0 || value > MAX_SMEM_OPTIN) return INVALID_VALUE;
    max_dynamic_smem[f] = value;
    return OK;
}
// What ptxas compiled the kernel to for sm_80 (the kernel table carries it): 4
// registers per thread, 1 static shared memory, 0 the largest block, 8 the opt-in.
int cuFuncGetAttribute(int* v, int attrib, void* f) {
    const EmuKernel* k = static_cast<const EmuKernel*>(f);
    if (!v || !k) return INVALID_VALUE;
    switch (attrib) {
        case 0: *v = MAX_THREADS; break;
        case 1: *v = k->static_smem; break;
        case 4: *v = k->registers; break;
        case 8: {
            auto opt = max_dynamic_smem.find(f);
            *v = opt == max_dynamic_smem.end() ? 48 * 1024 - k->static_smem : opt->second;
            break;
        }
        default: return 801;  // CUDA_ERROR_NOT_SUPPORTED
    }
    return OK;
}

int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void*, void** params, void**) {
    ++driver_counts[C_LAUNCH];
    const EmuKernel* k = static_cast<const EmuKernel*>(f);
    unsigned threads = bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || gy > 65535 || gz > 65535 || gx > 0x7fffffffu ||
        bz > 64)
        return INVALID_VALUE;
    if (threads > (unsigned)MAX_THREADS) return INVALID_VALUE;
    auto opt = max_dynamic_smem.find(f);
    unsigned limit = opt == max_dynamic_smem.end() ? 48 * 1024 : (unsigned)std::max(opt->second, 48 * 1024);
    if (smem > limit) {
        std::fprintf(stderr, "cuda-emu: kernel %s: %u B of dynamic shared memory, over its limit of %u\n", k->name,
                     smem, limit);
        return INVALID_VALUE;
    }
    if (!S.stacks) {
        void* m = mmap(nullptr, STACK * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) return OUT_OF_MEMORY;
        S.stacks = static_cast<char*>(m);
    }
    S.kernel = k;
    S.params = params;
    S.err = 0;
    S.bdim = dim3{bx, by, bz};
    S.gdim = dim3{gx, gy, gz};
    S.slots.assign(((threads + 31) / 32) * 32, 0);
    S.dyn.assign(smem / 4 + 1, 0.0f);  // poisoned with NaN before every block
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                S.block = dim3{x, y, z};
                std::fill(S.dyn.begin(), S.dyn.end(), std::nanf(""));  // fresh per block, as on a GPU
                if (!run_block()) {
                    std::fprintf(stderr, "cuda-emu: kernel %s deadlocked at a barrier in block (%u, %u, %u)\n",
                                 k->name, x, y, z);
                    S.err = 0;
                    return LAUNCH_FAILED;
                }
                if (S.err) {
                    std::fprintf(stderr, "cuda-emu: kernel %s: %s\n", k->name, S.err_msg.c_str());
                    int code = S.err;
                    S.err = 0;
                    S.cur = nullptr;
                    return code;
                }
            }
    S.cur = nullptr;
    const char* which = nullptr;
    if (!canaries_intact(&which)) {
        std::fprintf(stderr, "cuda-emu: kernel %s wrote past %s\n", k->name, which);
        return ILLEGAL_ADDRESS;
    }
    return OK;
}

int cuGetErrorName(int code, const char** s) {
    switch (code) {
        case OK: *s = "CUDA_SUCCESS"; break;
        case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
        case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
        case ILLEGAL_ADDRESS: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
        case LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case MISALIGNED_ADDRESS: *s = "CUDA_ERROR_MISALIGNED_ADDRESS"; break;
        default: *s = "CUDA_ERROR_NOT_SUPPORTED (in andrea's emulator)";
    }
    return OK;
}
int cuGetErrorString(int code, const char** s) {
    cuGetErrorName(code, s);
    return OK;
}

}  // extern "C"
