// The host side of andrea's CUDA emulator: the driver calls andrea-cuda makes, with
// "device" memory in guarded host pages and kernels run block by block, each thread a
// fiber (see emu.h). Built with the kernels into target/cuda-emu/lib64/libcuda.so.1 by
// `cargo xtask cuda-emu`; x86-64 Linux only (the fiber switch is a few lines of asm).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
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

struct Fiber {
    void* sp;
    dim3 tid;
    int warp;
    State state;
};

const size_t STACK = 128 * 1024;
const int MAX_THREADS = 1024;

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
};
thread_local Scheduler S;

void fiber_main() {
    S.kernel->invoke(S.kernel->fn, S.params);
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
}

// Runs one block to completion; false on a barrier deadlock.
bool run_block() {
    int n = (int)(S.bdim.x * S.bdim.y * S.bdim.z);
    S.fibers.resize(n);
    for (int i = 0; i < n; ++i) init_fiber(S.fibers[i], i);
    int warps = (n + 31) / 32;
    for (;;) {
        for (auto& f : S.fibers)
            if (f.state == READY) {
                S.cur = &f;
                emu_switch(&S.sched_sp, f.sp);
            }
        bool released = false, all_done = true;
        for (int w = 0; w < warps; ++w) {
            int lo = w * 32, hi = std::min(n, lo + 32);
            bool any = false, all = true;
            for (int i = lo; i < hi; ++i) {
                State s = S.fibers[i].state;
                if (s == WAIT_WARP) any = true;
                else if (s != DONE) all = false;
            }
            if (any && all) {
                for (int i = lo; i < hi; ++i)
                    if (S.fibers[i].state == WAIT_WARP) S.fibers[i].state = READY;
                released = true;
            }
        }
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

// ---- the driver API -------------------------------------------------------------------

extern "C" {

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
int cuDeviceGetAttribute(int* v, int attr, int) {
    switch (attr) {
        case 75: *v = 8; break;   // compute capability major
        case 76: *v = 0; break;   // minor
        case 16: *v = 1; break;   // multiprocessors
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
int cuCtxSynchronize() { return OK; }
int cuStreamCreateWithPriority(void** s, unsigned, int) {
    *s = &dummy_stream;
    return OK;
}
int cuStreamDestroy_v2(void*) { return OK; }
int cuStreamSynchronize(void*) { return OK; }

int cuMemAlloc_v2(uint64_t* dptr, size_t size) {
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
int cuMemcpyHtoD_v2(uint64_t d, const void* s, size_t n) { return copy((void*)(uintptr_t)d, s, n); }
int cuMemcpyHtoDAsync_v2(uint64_t d, const void* s, size_t n, void*) { return copy((void*)(uintptr_t)d, s, n); }
int cuMemcpyDtoH_v2(void* d, uint64_t s, size_t n) { return copy(d, (const void*)(uintptr_t)s, n); }
int cuMemcpyDtoHAsync_v2(void* d, uint64_t s, size_t n, void*) { return copy(d, (const void*)(uintptr_t)s, n); }

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

int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void*, void** params, void**) {
    const EmuKernel* k = static_cast<const EmuKernel*>(f);
    unsigned threads = bx * by * bz;
    if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || gy > 65535 || gz > 65535 || gx > 0x7fffffffu ||
        bz > 64)
        return INVALID_VALUE;
    if (threads > (unsigned)MAX_THREADS) return INVALID_VALUE;
    if (smem > 48 * 1024) return INVALID_VALUE;  // no kernel here opts in to more
    if (!S.stacks) {
        void* m = mmap(nullptr, STACK * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) return OUT_OF_MEMORY;
        S.stacks = static_cast<char*>(m);
    }
    S.kernel = k;
    S.params = params;
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
                    return LAUNCH_FAILED;
                }
            }
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
        default: *s = "CUDA_ERROR_NOT_SUPPORTED (in andrea's emulator)";
    }
    return OK;
}
int cuGetErrorString(int code, const char** s) {
    cuGetErrorName(code, s);
    return OK;
}

}  // extern "C"
