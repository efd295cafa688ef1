// NCCL's communicators and collectives on the emulator, for ranks that are threads of one process
// (ncclCommInitAll, or one ncclCommInitRankConfig per thread) or processes of one machine (the
// launcher's ranks, each with its own emulated device). The ranks of a communicator meet in a
// shared-memory segment named by the unique id: a process-shared lock, a barrier and one staging
// slot per rank. A collective runs when it is called, as every emulated stream does: each rank
// copies a chunk of its input into its slot, waits at the barrier, computes its own output from
// every slot (reductions add in rank order, so every rank gets the same bits), and waits again
// before the slots are reused. Point-to-point messages go through a mailbox per ordered pair of
// ranks, a chunk at a time. So a call returns once every rank (or the peer) has made it; one that
// needs a rank which has freed its communicator fails at once, and one whose peer never comes
// (dead, or in another collective) fails after LOCKSTEP_CUDA_EMULATOR_NCCL_TIMEOUT seconds (300
// by default), with ncclRemoteError. Joining never blocks with `blocking = 0`:
// ncclCommGetAsyncError says ncclInProgress until every rank has joined.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <type_traits>

#include "kernel_dialect.h"
#include "prelude.cuh"

typedef int ncclResult_t;
typedef void* cudaStream_t;
struct ncclUniqueId {
    char internal[128];
};

namespace {

enum : ncclResult_t {
    SUCCESS = 0,
    INVALID_ARGUMENT = 4,
    INVALID_USAGE = 5,
    REMOTE_ERROR = 6,
    IN_PROGRESS = 7,
};
enum DataType { INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 };
enum RedOp { SUM, PROD, MAX, MIN, AVG };
enum Kind { ALL_REDUCE, REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER };

constexpr int MAX_RANKS = 8;
constexpr size_t SLOT_BYTES = 512 << 10;
constexpr size_t MAIL_BYTES = 128 << 10;
constexpr uint32_t READY = 0x4c4b4e43;

// What a rank asked for: every rank of one collective must ask for the same.
struct Call {
    int kind, dtype, op, root;
    size_t count;
    bool operator!=(const Call& o) const {
        return kind != o.kind || dtype != o.dtype || op != o.op || root != o.root || count != o.count;
    }
};

// One chunk of a message from one rank to another: `full` while the receiver has not taken it.
struct Mailbox {
    int full;
    size_t message_bytes;  // the whole message's, checked against the receiver's buffer
    size_t chunk_bytes;
    char data[MAIL_BYTES];
};

// The segment every rank maps.
struct Clique {
    std::atomic<uint32_t> ready;  // READY once the creator has set the rest up
    pthread_mutex_t lock;         // robust: a rank that dies holding it breaks the clique
    pthread_cond_t changed;
    int world;
    int joined;
    ncclResult_t broken;  // what every call fails with from now on (SUCCESS while fine)
    unsigned left;        // a bit per rank that has freed its handle: nothing more comes from it
    int arrived;
    uint64_t generation;
    Call calls[MAX_RANKS];
    alignas(64) char slots[MAX_RANKS][SLOT_BYTES];
    Mailbox mail[MAX_RANKS][MAX_RANKS];  // [from][to]
};

struct Comm {
    Clique* clique;
    char name[64];
    int rank;
    bool name_unlinked;
};

double timeout_seconds() {
    const char* text = getenv("LOCKSTEP_CUDA_EMULATOR_NCCL_TIMEOUT");
    return text ? atof(text) : 300.0;
}

timespec deadline_after(double seconds) {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    const double whole = (double)(long)seconds;
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((seconds - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec += 1;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

// Holds the clique's lock; a rank that died holding it leaves the clique broken.
struct Locked {
    Clique* c;
    explicit Locked(Clique* c) : c(c) {
        if (pthread_mutex_lock(&c->lock) == EOWNERDEAD) {
            pthread_mutex_consistent(&c->lock);
            c->broken = REMOTE_ERROR;
        }
    }
    ~Locked() { pthread_mutex_unlock(&c->lock); }
    // Waits for a change until `deadline`; false once it has passed.
    bool wait(const timespec& deadline) {
        int e = pthread_cond_timedwait(&c->changed, &c->lock, &deadline);
        if (e == EOWNERDEAD) {
            pthread_mutex_consistent(&c->lock);
            c->broken = REMOTE_ERROR;
        }
        return e != ETIMEDOUT;
    }
    void break_with(ncclResult_t why) {
        if (c->broken == SUCCESS) c->broken = why;
        pthread_cond_broadcast(&c->changed);
    }
};

void init_shared(Clique* c, int world) {
    pthread_mutexattr_t m;
    pthread_mutexattr_init(&m);
    pthread_mutexattr_setpshared(&m, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&m, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&c->lock, &m);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&c->changed, &a);
    c->world = world;
    c->ready.store(READY, std::memory_order_release);
}

// Maps the segment named `name`, creating and setting it up if this rank is the first.
Clique* attach(const char* name, int world) {
    bool created = true;
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 && errno == EEXIST) {
        created = false;
        fd = shm_open(name, O_RDWR, 0600);
    }
    if (fd < 0) return nullptr;
    if (created && ftruncate(fd, sizeof(Clique)) != 0) {
        close(fd);
        return nullptr;
    }
    // A joiner may arrive before the creator has sized the segment.
    for (struct stat st; !created && fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(Clique);) usleep(1000);
    void* p = mmap(nullptr, sizeof(Clique), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return nullptr;
    auto* c = static_cast<Clique*>(p);
    if (created) init_shared(c, world);
    while (c->ready.load(std::memory_order_acquire) != READY) usleep(1000);
    return c;
}

Comm* join(const ncclUniqueId& id, int world, int rank) {
    char name[64];
    memcpy(name, id.internal, sizeof name);
    name[sizeof name - 1] = 0;
    if (name[0] != '/' || world < 1 || world > MAX_RANKS || rank < 0 || rank >= world) return nullptr;
    Clique* c = attach(name, world);
    if (!c) return nullptr;
    auto* comm = new Comm{c, {}, rank, false};
    memcpy(comm->name, name, sizeof name);
    Locked locked(c);
    if (c->world != world) locked.break_with(INVALID_USAGE);
    if (++c->joined == world) {
        // Every rank has the segment mapped: the name is no longer needed.
        shm_unlink(name);
        comm->name_unlinked = true;
    }
    pthread_cond_broadcast(&c->changed);
    return comm;
}

// Waits until every rank has joined; the clique's failure if it breaks or time runs out.
ncclResult_t await_peers(Comm* comm, Locked& locked, const timespec& deadline) {
    Clique* c = comm->clique;
    while (c->broken == SUCCESS && c->joined < c->world) {
        if (!locked.wait(deadline)) {
            fprintf(stderr, "emulated NCCL: rank %d waited %.0f s for its peers to join\n", comm->rank,
                    timeout_seconds());
            locked.break_with(REMOTE_ERROR);
        }
    }
    return c->broken;
}

// Every rank waits here until all have come; the clique's failure if one never does.
ncclResult_t barrier(Comm* comm, const char* what) {
    Clique* c = comm->clique;
    const timespec deadline = deadline_after(timeout_seconds());
    Locked locked(c);
    if (ncclResult_t failed = await_peers(comm, locked, deadline)) return failed;
    if (c->left) return REMOTE_ERROR;  // a rank that has left never arrives
    const uint64_t generation = c->generation;
    if (++c->arrived == c->world) {
        c->arrived = 0;
        c->generation++;
        pthread_cond_broadcast(&c->changed);
        return SUCCESS;
    }
    while (c->generation == generation && c->broken == SUCCESS && !c->left) {
        if (!locked.wait(deadline)) {
            fprintf(stderr, "emulated NCCL: rank %d of %d waited %.0f s in %s for a peer that never came\n",
                    comm->rank, c->world, timeout_seconds(), what);
            locked.break_with(REMOTE_ERROR);
        }
    }
    return c->generation != generation ? SUCCESS : c->broken ? c->broken : REMOTE_ERROR;
}

size_t element_size(int dtype) {
    switch (dtype) {
    case INT8: case UINT8: return 1;
    case FLOAT16: case BFLOAT16: return 2;
    case INT32: case UINT32: case FLOAT32: return 4;
    default: return 8;
    }
}

// How a type's values are combined: in T itself, or for f16 and bf16 in f32 (the prelude's
// conversions), rounded back after each step as NCCL's reductions in those types are.
template <typename T> struct Arithmetic {
    using A = T;
    static A widen(T x) { return x; }
    static T narrow(A x) { return x; }
};
template <typename H> struct HalfArithmetic {
    using A = float;
    static float widen(H x) { return to_f32(x); }
    static H narrow(float x) { return from_f32<H>(x); }
};
template <> struct Arithmetic<f16> : HalfArithmetic<f16> {};
template <> struct Arithmetic<bf16> : HalfArithmetic<bf16> {};

// The result: the ranks' values combined in rank order, so every rank gets the same bits.
template <typename T>
void combine(const Clique* c, size_t n, int op, char* out) {
    using Ar = Arithmetic<T>;
    using A = typename Ar::A;
    const int world = c->world;
    for (size_t i = 0; i < n; ++i) {
        auto value = [&](int r) { return Ar::widen(reinterpret_cast<const T*>(c->slots[r])[i]); };
        T acc = reinterpret_cast<const T*>(c->slots[0])[i];
        for (int r = 1; r < world; ++r) {
            const A a = Ar::widen(acc), b = value(r);
            switch (op) {
            case PROD: acc = Ar::narrow(a * b); break;
            case MAX: acc = Ar::narrow(a < b ? b : a); break;
            case MIN: acc = Ar::narrow(b < a ? b : a); break;
            default: acc = Ar::narrow(a + b); break;
            }
        }
        if (op == AVG) acc = Ar::narrow(Ar::widen(acc) / (A)world);
        reinterpret_cast<T*>(out)[i] = acc;
    }
}

void reduce_slots(const Clique* c, int dtype, int op, size_t n, char* out) {
    switch (dtype) {
    case INT8: return combine<int8_t>(c, n, op, out);
    case UINT8: return combine<uint8_t>(c, n, op, out);
    case INT32: return combine<int32_t>(c, n, op, out);
    case UINT32: return combine<uint32_t>(c, n, op, out);
    case INT64: return combine<int64_t>(c, n, op, out);
    case UINT64: return combine<uint64_t>(c, n, op, out);
    case FLOAT16: return combine<f16>(c, n, op, out);
    case BFLOAT16: return combine<bf16>(c, n, op, out);
    case FLOAT32: return combine<float>(c, n, op, out);
    default: return combine<double>(c, n, op, out);
    }
}

// Runs `step(offset, n)` over `count` items `per_chunk` at a time (once, with n = 0, when there
// are none: every rank still meets); the first failure ends it.
template <typename Step>
ncclResult_t in_chunks(size_t count, size_t per_chunk, Step step) {
    size_t offset = 0;
    do {
        const size_t n = count - offset < per_chunk ? count - offset : per_chunk;
        if (ncclResult_t failed = step(offset, n)) return failed;
        offset += n;
    } while (offset < count);
    return SUCCESS;
}

ncclResult_t collective(Comm* comm, Call call, const void* send, void* recv) {
    if (!comm) return INVALID_ARGUMENT;
    if (call.dtype < INT8 || call.dtype > BFLOAT16 || call.op < SUM || call.op > AVG) return INVALID_ARGUMENT;
    Clique* c = comm->clique;
    const int rank = comm->rank, world = c->world;
    if (call.root < 0 || call.root >= world) return INVALID_ARGUMENT;
    const size_t es = element_size(call.dtype), per_slot = SLOT_BYTES / es;
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    {
        Locked locked(c);
        c->calls[rank] = call;
    }
    bool checked = false;
    // Stages `bytes` from `from` (when this rank sends), meets the others, checks once that
    // every rank asked for this collective, then lets `use` read the slots.
    auto exchange = [&](const char* from, size_t bytes, auto use) -> ncclResult_t {
        if (from) memcpy(c->slots[rank], from, bytes);
        if (ncclResult_t failed = barrier(comm, "a collective")) return failed;
        if (!checked) {
            checked = true;
            for (int r = 0; r < world; ++r) {
                if (c->calls[r] != call) {
                    fprintf(stderr, "emulated NCCL: rank %d's collective differs from rank %d's\n", rank, r);
                    Locked(c).break_with(INVALID_USAGE);
                    return INVALID_USAGE;
                }
            }
        }
        use();
        return barrier(comm, "a collective");
    };
    switch (call.kind) {
    case ALL_REDUCE:
    case REDUCE:
        return in_chunks(call.count, per_slot, [&](size_t offset, size_t n) {
            return exchange(in + offset * es, n * es, [&] {
                if (call.kind == ALL_REDUCE || rank == call.root) reduce_slots(c, call.dtype, call.op, n, out + offset * es);
            });
        });
    case BROADCAST:
        return in_chunks(call.count, per_slot, [&](size_t offset, size_t n) {
            return exchange(rank == call.root ? in + offset * es : nullptr, n * es,
                            [&] { memcpy(out + offset * es, c->slots[call.root], n * es); });
        });
    case ALL_GATHER:
        return in_chunks(call.count, per_slot, [&](size_t offset, size_t n) {
            return exchange(in + offset * es, n * es, [&] {
                for (int r = 0; r < world; ++r) memcpy(out + (r * call.count + offset) * es, c->slots[r], n * es);
            });
        });
    default:  // REDUCE_SCATTER: rank d's output is the reduction of every rank's part d
        for (int d = 0; d < world; ++d) {
            ncclResult_t failed = in_chunks(call.count, per_slot, [&](size_t offset, size_t n) {
                return exchange(in + (d * call.count + offset) * es, n * es, [&] {
                    if (rank == d) reduce_slots(c, call.dtype, call.op, n, out + offset * es);
                });
            });
            if (failed) return failed;
        }
        return SUCCESS;
    }
}

// Waits under `locked` until `ready()`; the clique's failure if it breaks or `what` outlasts the
// timeout.
template <typename Ready>
ncclResult_t wait_until(Comm* comm, Locked& locked, const char* what, int peer, Ready ready) {
    const timespec deadline = deadline_after(timeout_seconds());
    Clique* c = comm->clique;
    if (c->joined < c->world)
        if (ncclResult_t failed = await_peers(comm, locked, deadline)) return failed;
    // Ready first: a peer that sent its last chunk and left has broken the clique for later calls only.
    while (!ready()) {
        if (c->broken != SUCCESS) return c->broken;
        if (c->left & (1u << peer)) return REMOTE_ERROR;
        if (!locked.wait(deadline)) {
            fprintf(stderr, "emulated NCCL: rank %d waited %.0f s to %s rank %d\n", comm->rank, timeout_seconds(),
                    what, peer);
            locked.break_with(REMOTE_ERROR);
        }
    }
    return SUCCESS;
}

bool is_peer(const Comm* comm, int peer) {
    return comm && peer >= 0 && peer < comm->clique->world && peer != comm->rank;
}

ncclResult_t send_to(Comm* comm, const char* from, size_t bytes, int peer) {
    if (!is_peer(comm, peer)) return INVALID_ARGUMENT;
    Mailbox& box = comm->clique->mail[comm->rank][peer];
    return in_chunks(bytes, MAIL_BYTES, [&](size_t offset, size_t n) -> ncclResult_t {
        Locked locked(comm->clique);
        if (ncclResult_t failed = wait_until(comm, locked, "send to", peer, [&] { return !box.full; })) return failed;
        memcpy(box.data, from + offset, n);
        box.message_bytes = bytes;
        box.chunk_bytes = n;
        box.full = 1;
        pthread_cond_broadcast(&comm->clique->changed);
        return SUCCESS;
    });
}

ncclResult_t receive_from(Comm* comm, char* into, size_t bytes, int peer) {
    if (!is_peer(comm, peer)) return INVALID_ARGUMENT;
    Mailbox& box = comm->clique->mail[peer][comm->rank];
    return in_chunks(bytes, MAIL_BYTES, [&](size_t offset, size_t n) -> ncclResult_t {
        Locked locked(comm->clique);
        if (ncclResult_t failed = wait_until(comm, locked, "receive from", peer, [&] { return box.full != 0; }))
            return failed;
        if (box.message_bytes != bytes || box.chunk_bytes != n) {
            fprintf(stderr, "emulated NCCL: rank %d sent %zu bytes, rank %d receives %zu\n", peer, box.message_bytes,
                    comm->rank, bytes);
            locked.break_with(INVALID_USAGE);
            return INVALID_USAGE;
        }
        memcpy(into + offset, box.data, n);
        box.full = 0;
        pthread_cond_broadcast(&comm->clique->changed);
        return SUCCESS;
    });
}

// Frees this rank's handle; its peers' later calls that need it fail (as with a real peer, sooner).
void leave(Comm* comm) {
    {
        Locked locked(comm->clique);
        comm->clique->left |= 1u << comm->rank;
        pthread_cond_broadcast(&comm->clique->changed);
    }
    if (!comm->name_unlinked) shm_unlink(comm->name);
    munmap(comm->clique, sizeof(Clique));
    delete comm;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    *version = 23000;
    return SUCCESS;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    static std::atomic<unsigned long long> made{0};
    timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(id->internal, 0, sizeof id->internal);
    snprintf(id->internal, 64, "/lockstep-nccl-%d-%llu-%lx", (int)getpid(), made.fetch_add(1),
             (unsigned long)t.tv_nsec);
    return SUCCESS;
}

ncclResult_t ncclCommInitRankConfig(Comm** comm, int world, ncclUniqueId id, int rank, const void* config) {
    // ncclConfig_t: size_t size; unsigned magic, version; int blocking; ...
    struct Head {
        size_t size;
        unsigned magic, version;
        int blocking;
    };
    const auto* head = static_cast<const Head*>(config);
    const bool blocking = !head || head->blocking != 0;
    *comm = join(id, world, rank);
    if (!*comm) return INVALID_ARGUMENT;
    Locked locked((*comm)->clique);
    if (!blocking) return (*comm)->clique->joined < world ? IN_PROGRESS : SUCCESS;
    return await_peers(*comm, locked, deadline_after(timeout_seconds()));
}

ncclResult_t ncclCommInitRank(Comm** comm, int world, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, world, id, rank, nullptr);
}

// Rank i on devices[i]: the emulated collectives copy between host addresses, so the device
// only matters to the caller.
ncclResult_t ncclCommInitAll(Comm** comms, int count, const int*) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    for (int i = 0; i < count; ++i) {
        comms[i] = join(id, count, i);
        if (!comms[i]) return INVALID_ARGUMENT;
    }
    return SUCCESS;
}

ncclResult_t ncclCommGetAsyncError(Comm* comm, ncclResult_t* state) {
    Locked locked(comm->clique);
    *state = comm->clique->broken ? comm->clique->broken
             : comm->clique->joined < comm->clique->world ? IN_PROGRESS
                                                   : SUCCESS;
    return SUCCESS;
}

ncclResult_t ncclCommAbort(Comm* comm) {
    if (comm) leave(comm);
    return SUCCESS;
}
ncclResult_t ncclCommDestroy(Comm* comm) { return ncclCommAbort(comm); }
ncclResult_t ncclCommFinalize(Comm*) { return SUCCESS; }

ncclResult_t ncclCommCount(const Comm* comm, int* count) {
    *count = comm->clique->world;
    return SUCCESS;
}
ncclResult_t ncclCommUserRank(const Comm* comm, int* rank) {
    *rank = comm->rank;
    return SUCCESS;
}

const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case SUCCESS: return "no error";
    case REMOTE_ERROR: return "remote process exited or there was a network error";
    case IN_PROGRESS: return "NCCL operation in progress";
    default: return "emulated NCCL error";
    }
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, Comm* comm, cudaStream_t) {
    return collective(comm, Call{ALL_REDUCE, dtype, op, 0, count}, send, recv);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, int dtype, int op, int root, Comm* comm,
                        cudaStream_t) {
    return collective(comm, Call{REDUCE, dtype, op, root, count}, send, recv);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root, Comm* comm, cudaStream_t) {
    return collective(comm, Call{BROADCAST, dtype, SUM, root, count}, send, recv);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, int dtype, Comm* comm, cudaStream_t) {
    return collective(comm, Call{ALL_GATHER, dtype, SUM, 0, count}, send, recv);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, int dtype, int op, Comm* comm,
                               cudaStream_t) {
    return collective(comm, Call{REDUCE_SCATTER, dtype, op, 0, count}, send, recv);
}

ncclResult_t ncclSend(const void* send, size_t count, int dtype, int peer, Comm* comm, cudaStream_t) {
    if (dtype < INT8 || dtype > BFLOAT16) return INVALID_ARGUMENT;
    return send_to(comm, static_cast<const char*>(send), count * element_size(dtype), peer);
}
ncclResult_t ncclRecv(void* recv, size_t count, int dtype, int peer, Comm* comm, cudaStream_t) {
    if (dtype < INT8 || dtype > BFLOAT16) return INVALID_ARGUMENT;
    return receive_from(comm, static_cast<char*>(recv), count * element_size(dtype), peer);
}

}  // extern "C"
