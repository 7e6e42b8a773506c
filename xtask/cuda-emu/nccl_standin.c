/* A stand-in libnccl.so.2 for the CUDA emulator (built by `cargo xtask cuda-emu` into
 * target/cuda-emu/nccl/): the six entry points andrea calls, with NCCL 2's C signatures,
 * so that the CUDA backend's NCCL path runs on a machine without a GPU. The emulator's
 * device memory is host memory and its streams run each call at once, so a reduction
 * here is a plain loop over the pointers it is given, done before the call returns.
 *
 * - A world of one: the all-reduce of one rank is the identity (a copy when not in place).
 * - W ranks (built with mpicc, -DSTANDIN_MPI): MPI_Allreduce on MPI_COMM_WORLD, which
 *   andrea has initialised (the communicator's ranks must be MPI's).
 *
 * Only ncclFloat32 with ncclSum is implemented (all andrea uses); anything else returns
 * ncclInvalidArgument. ANDREA_NCCL_STANDIN_FAULT=1 adds 1 to the first element of every
 * reduction: a planted fault that tests must catch. It reports version 2.99.0, which no
 * real NCCL has, so a log shows which library ran. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef STANDIN_MPI
#include <mpi.h>
#endif

enum { ok = 0, system_error = 2, internal_error = 3, invalid_argument = 4, invalid_usage = 5 };
enum { nccl_float32 = 7, nccl_sum = 0 };

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int nranks, rank; } standin_comm;

static const char MAGIC[] = "andrea-nccl-standin";

int ncclGetVersion(int* version) {
    if (!version) return invalid_argument;
    *version = 29900;
    return ok;
}

const char* ncclGetErrorString(int code) {
    switch (code) {
    case ok: return "no error";
    case system_error: return "system error (stand-in: MPI failed)";
    case internal_error: return "internal error";
    case invalid_argument: return "invalid argument (stand-in: only float32 sums)";
    case invalid_usage:
        return "invalid usage (stand-in: several ranks need MPI initialised with the same world)";
    default: return "unknown result code";
    }
}

int ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return invalid_argument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s %ld", MAGIC, (long)getpid());
    return ok;
}

int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return invalid_argument;
    if (strncmp(id.internal, MAGIC, sizeof MAGIC - 1) != 0) return invalid_argument;
    if (nranks > 1) {
#ifdef STANDIN_MPI
        int up = 0, size = 0, me = 0;
        MPI_Initialized(&up);
        if (!up) return invalid_usage;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if (size != nranks || me != rank) return invalid_usage;
#else
        fprintf(stderr, "nccl stand-in: built without MPI (no mpicc), one rank only\n");
        return invalid_usage;
#endif
    }
    standin_comm* c = malloc(sizeof *c);
    if (!c) return system_error;
    c->nranks = nranks;
    c->rank = rank;
    *comm = c;
    return ok;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op, void* comm,
                  void* stream) {
    (void)stream; /* the emulator's streams run each call at once */
    standin_comm* c = comm;
    if (!c || datatype != nccl_float32 || op != nccl_sum) return invalid_argument;
    if (count == 0) return ok;
    if (!send || !recv) return invalid_argument;
    if (c->nranks == 1) {
        if (send != recv) memmove(recv, send, count * sizeof(float));
    } else {
#ifdef STANDIN_MPI
        /* MPI counts are ints: reduce in pieces of at most 2^30 floats. */
        const size_t piece = (size_t)1 << 30;
        for (size_t at = 0; at < count; at += piece) {
            size_t n = count - at < piece ? count - at : piece;
            const float* s = (const float*)send + at;
            float* r = (float*)recv + at;
            int rc = MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, (int)n, MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD);
            if (rc != MPI_SUCCESS) return system_error;
        }
#else
        return invalid_usage;
#endif
    }
    const char* fault = getenv("ANDREA_NCCL_STANDIN_FAULT");
    if (fault && strcmp(fault, "1") == 0) ((float*)recv)[0] += 1.0f;
    return ok;
}

int ncclCommDestroy(void* comm) {
    free(comm);
    return ok;
}
