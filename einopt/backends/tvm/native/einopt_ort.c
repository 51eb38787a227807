/*
 * einopt's ONNX Runtime custom-op library: TVM-compiled kernels run on ONNX Runtime's own buffers.
 *
 * One operator, ai.einopt::TvmKernel:
 *
 *   inputs        float32 tensors, the kernel's inputs in parameter order
 *   outputs       float32 tensors, the kernel's outputs in parameter order
 *   attributes    kernel_sha256 (string): the SHA-256 of the kernel's description (the node's kernel
 *                 attribute, which this library never reads): the kernel library built from it must
 *                 have been handed to einopt_ort_add_kernels before the session is made
 *                 symbol (string): the kernel's name (its entry point is __tvm_ffi_<symbol>)
 *                 output_ranks (ints), output_shapes (ints, the outputs' dimensions one after another)
 *                 input_ranks, input_shapes (ints, optional): the inputs' shapes the kernel was compiled
 *                 for; with them an input is checked by its size alone (without a shape-info object
 *                 from ONNX Runtime 1.23 on), so it may come in any shape of that size: the emitter
 *                 feeds a kernel the input of a Reshape rather than the Reshape's output
 *
 * A model file carries no native code: einopt (Python) builds each kernel library on this machine from
 * the description in the node, checks it, and hands its bytes to einopt_ort_add_kernels, which loads it
 * once per process (from memory, through a memfd) under the description's SHA-256. A node whose
 * kernel was not handed over fails when the session is made; nothing in the model is ever loaded.
 * Libraries stay loaded for the process (RTLD_NODELETE), and so does this library once registered:
 * sessions opened and closed one after another load nothing again. The kernel is called with
 * DLTensors that point at ORT's input and output buffers: no copies and no Python on the call path.
 * Parallel loops in a kernel run on the session's intra-op threads (KernelContext_ParallelFor).
 *
 * ONNX Runtime's wheel ships no C headers, so this file declares only what it uses, from the
 * documented ABI: OrtApi is a table of function pointers that only grows (a function's slot never
 * moves), requested at the version below; OrtCustomOp is laid out as of its version 16.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ ONNX Runtime's C ABI (used part) */

typedef struct OrtStatus OrtStatus;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;

typedef struct {
    const void *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

/* The API version asked for: 17 is the first with KernelContext_ParallelFor (ONNX Runtime 1.17). */
#define API_VERSION 17
/* From version 23 on (ONNX Runtime 1.23), GetTensorSizeInBytes (slot 318) is there too: with it, an input
 * whose shape the node declares is checked by its size alone, without building a shape-info object
 * (an allocation and a free per input per call). */
#define SIZE_API_VERSION 23
#define SLOT_GetTensorSizeInBytes 318

/* Slots of the OrtApi table used here (0-based; each slot is one function pointer). */
enum {
    SLOT_CreateStatus = 0,
    SLOT_CreateCustomOpDomain = 26,
    SLOT_CustomOpDomain_Add = 27,
    SLOT_AddCustomOpDomain = 28,
    SLOT_GetTensorMutableData = 51,
    SLOT_GetTensorElementType = 60,
    SLOT_GetDimensionsCount = 61,
    SLOT_GetDimensions = 62,
    SLOT_GetTensorShapeElementCount = 64,
    SLOT_GetTensorTypeAndShape = 65,
    SLOT_KernelInfoGetAttribute_string = 87,
    SLOT_KernelContext_GetInputCount = 88,
    SLOT_KernelContext_GetOutputCount = 89,
    SLOT_KernelContext_GetInput = 90,
    SLOT_KernelContext_GetOutput = 91,
    SLOT_ReleaseStatus = 93,
    SLOT_ReleaseTensorTypeAndShapeInfo = 99,
    SLOT_KernelInfoGetAttributeArray_int64 = 163,
    SLOT_KernelContext_ParallelFor = 274,
};

enum { ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2, ORT_RUNTIME_EXCEPTION = 6, ORT_INVALID_GRAPH = 10 };
enum { ELEMENT_FLOAT = 1 };
enum { IO_VARIADIC = 2 };
enum { MEM_DEFAULT = 0 };

static const void *const *ort; /* the OrtApi table, as slots */

#define ORT(slot, type) ((type)ort[SLOT_##slot])

typedef OrtStatus *(*CreateStatusFn)(int code, const char *msg);
typedef void (*ReleaseStatusFn)(OrtStatus *status);
typedef OrtStatus *(*CreateCustomOpDomainFn)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*CustomOpDomainAddFn)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*AddCustomOpDomainFn)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
typedef OrtStatus *(*GetTensorMutableDataFn)(OrtValue *value, void **out);
typedef OrtStatus *(*GetTensorElementTypeFn)(const OrtShapeInfo *info, int *out);
typedef OrtStatus *(*GetDimensionsCountFn)(const OrtShapeInfo *info, size_t *out);
typedef OrtStatus *(*GetDimensionsFn)(const OrtShapeInfo *info, int64_t *dims, size_t count);
typedef OrtStatus *(*GetTensorShapeElementCountFn)(const OrtShapeInfo *info, size_t *out);
typedef OrtStatus *(*GetTensorTypeAndShapeFn)(const OrtValue *value, OrtShapeInfo **out);
typedef OrtStatus *(*GetTensorSizeInBytesFn)(const OrtValue *value, size_t *out);
typedef void (*ReleaseShapeInfoFn)(OrtShapeInfo *info);
typedef OrtStatus *(*GetAttributeStringFn)(const OrtKernelInfo *info, const char *name, char *out, size_t *size);
typedef OrtStatus *(*GetAttributeInt64sFn)(const OrtKernelInfo *info, const char *name, int64_t *out, size_t *size);
typedef OrtStatus *(*GetCountFn)(const OrtKernelContext *context, size_t *out);
typedef OrtStatus *(*GetInputFn)(const OrtKernelContext *context, size_t index, const OrtValue **out);
typedef OrtStatus *(*GetOutputFn)(OrtKernelContext *context, size_t index, const int64_t *dims, size_t count,
                                  OrtValue **out);
typedef OrtStatus *(*ParallelForFn)(const OrtKernelContext *context, void (*fn)(void *data, size_t i),
                                    size_t total, size_t batches, void *data);

/* OrtCustomOp at its version 16: the members ORT reads at that version, then the later ones (unused). */
typedef struct OrtCustomOp OrtCustomOp;
struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const OrtCustomOp *op, const void *api, const OrtKernelInfo *info);
    const char *(*GetName)(const OrtCustomOp *op);
    const char *(*GetExecutionProviderType)(const OrtCustomOp *op);
    int (*GetInputType)(const OrtCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const OrtCustomOp *op);
    int (*GetOutputType)(const OrtCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const OrtCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const OrtCustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const OrtCustomOp *op, size_t index);
    int (*GetInputMemoryType)(const OrtCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const OrtCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const OrtCustomOp *op);
    int (*GetVariadicOutputMinArity)(const OrtCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const OrtCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const OrtCustomOp *op, const void *api, const OrtKernelInfo *info, void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *context);
    void *later[7]; /* shape inference, opset range, in-place and alias maps: read from version 17 on */
};
_Static_assert(sizeof(OrtCustomOp) == 8 + 25 * sizeof(void *), "OrtCustomOp layout");

static OrtStatus *error(int code, const char *format, ...) __attribute__((format(printf, 2, 3)));

static OrtStatus *error(int code, const char *format, ...) {
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    return ORT(CreateStatus, CreateStatusFn)(code, message);
}

/* ------------------------------------------------------------------ DLPack and TVM's calling convention */

typedef struct {
    int32_t device_type, device_id;
} DLDevice;
typedef struct {
    uint8_t code, bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

/* tvm-ffi's value cell (16 bytes); a DLTensor is passed by pointer with type index 7. */
typedef struct {
    int32_t type_index;
    uint32_t zero_padding;
    union {
        int64_t v_int64;
        double v_float64;
        void *v_ptr;
    } v;
} TVMFFIAny;

enum { TVMFFI_NONE = 0, TVMFFI_DLTENSOR_PTR = 7 };
enum { DL_CPU = 1, DL_FLOAT = 2 };

typedef int (*KernelFn)(void *self, const TVMFFIAny *args, int32_t count, TVMFFIAny *result);

typedef struct {
    void *sync_handle;
    int32_t num_task;
} ParallelGroup;
typedef int (*ParallelLambda)(int task, ParallelGroup *group, void *data);

/* TVM's generated code assumes its buffers start on this boundary (its kAllocAlignment), unless its
 * library says otherwise (einopt_buffer_alignment, from tvm_shim.c). */
#define ALIGNMENT 64
#define MAX_ARGS 64
#define MAX_RANK 8

/* ------------------------------------------------------------------ the hooks a kernel library calls */

/* The kernel context of the call running on this thread: parallel loops go to its intra-op threads. */
static _Thread_local const OrtKernelContext *running;
static int cores = 1;

typedef struct {
    ParallelLambda lambda;
    void *data;
    ParallelGroup group;
    atomic_int failed;
} ParallelJob;

static void run_task(void *job_, size_t task) {
    ParallelJob *job = job_;
    if (job->lambda((int)task, &job->group, job->data) != 0)
        atomic_store(&job->failed, 1);
}

static int parallel_launch(ParallelLambda lambda, void *data, int tasks) {
    ParallelJob job = {lambda, data, {NULL, tasks > 0 ? tasks : cores}, 0};
    const OrtKernelContext *context = running;
    if (context == NULL || job.group.num_task == 1) {
        for (int i = 0; i < job.group.num_task; i++)
            run_task(&job, (size_t)i);
    } else {
        OrtStatus *status = ORT(KernelContext_ParallelFor, ParallelForFn)(context, run_task,
                                                                          (size_t)job.group.num_task, 0, &job);
        if (status != NULL) {
            ORT(ReleaseStatus, ReleaseStatusFn)(status);
            return -1;
        }
    }
    return atomic_load(&job.failed) ? -1 : 0;
}

/* Tasks may run one after another on ORT's pool: a barrier between them could never be passed. */
static int parallel_barrier(int task, ParallelGroup *group) {
    (void)task, (void)group;
    return -1;
}

static void *alloc_workspace(int device_type, int device_id, uint64_t bytes, int code_hint, int bits_hint) {
    (void)device_type, (void)device_id, (void)code_hint, (void)bits_hint;
    void *p = NULL;
    return posix_memalign(&p, ALIGNMENT, bytes ? (size_t)bytes : 1) == 0 ? p : NULL;
}

static int free_workspace(int device_type, int device_id, void *p) {
    (void)device_type, (void)device_id;
    free(p);
    return 0;
}

/* einopt's kernels never call other packed functions or modules: a call that does fails cleanly. */
static int not_supported(void) { return -1; }

/* ------------------------------------------------------------------ kernel libraries, loaded once */

#define ID_SIZE 65 /* a SHA-256 in hex, and its terminating zero */

typedef struct Library {
    char id[ID_SIZE]; /* the SHA-256 of the kernel's description */
    void *handle;
    const char *(*last_error)(void);
    uintptr_t alignment; /* what its kernels assume of their buffers' addresses (a power of two) */
    struct Library *next;
} Library;

static pthread_mutex_t libraries_lock = PTHREAD_MUTEX_INITIALIZER;
static Library *libraries; /* never unloaded: sessions in the process may still run their kernels */

/* Point every hook the library defines at its implementation (TVM's own loader does the same). */
static void fill_hooks(void *handle, void (*set_raised)(void)) {
    static const struct {
        const char *name;
        void *fn;
    } hooks[] = {
        {"__TVMBackendParallelLaunch", (void *)parallel_launch},
        {"__TVMBackendParallelBarrier", (void *)parallel_barrier},
        {"__TVMBackendAllocWorkspace", (void *)alloc_workspace},
        {"__TVMBackendFreeWorkspace", (void *)free_workspace},
        {"__TVMFFIFunctionCall", (void *)not_supported},
        {"__TVMFFIHandleInitOnce", (void *)not_supported},
        {"__TVMFFIEnvModLookupFromImports", (void *)not_supported},
    };
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++) {
        void **slot = dlsym(handle, hooks[i].name);
        if (slot != NULL)
            *slot = hooks[i].fn;
    }
    void **slot = dlsym(handle, "__TVMFFIErrorSetRaisedFromCStr");
    if (slot != NULL)
        *slot = (void *)set_raised;
}

/*
 * The dynamic loader knows a loaded object by the name it was opened under: a second dlopen of a
 * name already loaded returns the first object. A memfd's "/proc/self/fd/N" names a different file
 * once N is closed and reused, so each library is opened under a name of its own: a symbolic link
 * "<private directory>/<count>.so" to the memfd (the loader maps the memfd, so a noexec /tmp does
 * not matter), removed once loaded. Without a private directory the memfd stays open, so that its
 * number is never reused. Called with libraries_lock held.
 */
static char link_dir[256];
static unsigned long opened;

static void remove_link_dir(void) {
    if (link_dir[0])
        rmdir(link_dir);
}

static const char *unique_name(const char *target, char *name, size_t size) {
    if (!link_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(link_dir, sizeof link_dir, "%.200s/einopt-kernels-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (mkdtemp(link_dir) == NULL) {
            link_dir[0] = '\0';
            return NULL;
        }
        atexit(remove_link_dir);
    }
    snprintf(name, size, "%s/%lu.so", link_dir, opened++);
    return symlink(target, name) == 0 ? name : NULL;
}

static int write_all(int fd, const uint8_t *bytes, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, bytes + done, size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

static void *open_from_memory(const uint8_t *bytes, size_t size, char *why, size_t why_size) {
    char path[320], name[320];
    int fd = memfd_create("einopt-kernels", MFD_CLOEXEC);
    int is_temp_file = 0;
    if (fd < 0) {
        const char *dir = getenv("TMPDIR");
        snprintf(path, sizeof path, "%.200s/einopt-XXXXXX", dir && *dir ? dir : "/tmp");
        fd = mkstemp(path);
        is_temp_file = 1;
    } else {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (fd < 0) {
        snprintf(why, why_size, "cannot make a file for the kernel library: %s", strerror(errno));
        return NULL;
    }
    if (write_all(fd, bytes, size) != 0) {
        snprintf(why, why_size, "cannot write the kernel library: %s", strerror(errno));
        close(fd);
        if (is_temp_file)
            unlink(path);
        return NULL;
    }
    /* A temporary file's name is unique while it exists (it is removed after loading). */
    const char *link = is_temp_file ? NULL : unique_name(path, name, sizeof name);
    void *handle = dlopen(link ? link : path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle == NULL)
        snprintf(why, why_size, "cannot load the kernel library: %s", dlerror());
    if (link)
        unlink(link);
    if (is_temp_file)
        unlink(path);
    if (link || is_temp_file || handle == NULL)
        close(fd); /* else the memfd stays open: its number, the library's name, is never reused */
    return handle;
}

static Library *find_library(const char *id) {
    pthread_mutex_lock(&libraries_lock);
    Library *lib = libraries;
    while (lib != NULL && strcmp(lib->id, id) != 0)
        lib = lib->next;
    pthread_mutex_unlock(&libraries_lock);
    return lib;
}

static int valid_id(const char *id) {
    size_t n = 0;
    for (; id[n] != '\0'; n++)
        if (n >= ID_SIZE - 1 || !((id[n] >= '0' && id[n] <= '9') || (id[n] >= 'a' && id[n] <= 'f')))
            return 0;
    return n == ID_SIZE - 1;
}

static Library *load_library(const char *id, const uint8_t *bytes, size_t size, char *why, size_t why_size) {
    pthread_mutex_lock(&libraries_lock);
    Library *lib = libraries;
    while (lib != NULL && strcmp(lib->id, id) != 0)
        lib = lib->next;
    if (lib == NULL) {
        void *handle = open_from_memory(bytes, size, why, why_size);
        void (*set_raised)(void) = handle ? (void (*)(void))dlsym(handle, "einopt_tvm_set_raised") : NULL;
        const char *(*last_error)(void) = handle ? (const char *(*)(void))dlsym(handle, "einopt_tvm_last_error") : NULL;
        if (handle != NULL && (set_raised == NULL || last_error == NULL)) {
            snprintf(why, why_size, "the kernel library was not linked with einopt's shim (no einopt_tvm_last_error)");
            dlclose(handle);
            handle = NULL;
        }
        if (handle != NULL && (lib = calloc(1, sizeof *lib)) != NULL) {
            fill_hooks(handle, set_raised);
            const int32_t *declared = dlsym(handle, "einopt_buffer_alignment");
            int32_t a = declared != NULL ? *declared : ALIGNMENT; /* libraries linked before it: 64 */
            uintptr_t alignment = a > 0 && (a & (a - 1)) == 0 ? (uintptr_t)a : ALIGNMENT;
            *lib = (Library){"", handle, last_error, alignment, libraries};
            memcpy(lib->id, id, ID_SIZE);
            libraries = lib;
        } else if (handle != NULL) {
            snprintf(why, why_size, "out of memory");
            dlclose(handle);
        }
    }
    pthread_mutex_unlock(&libraries_lock);
    return lib;
}

/*
 * Called by einopt (Python, through ctypes) with a kernel library it built on this machine from a
 * description whose SHA-256 is id, and checked: loads it once per process. Returns 0, or -1 with the
 * reason in why.
 */
EXPORT int einopt_ort_add_kernels(const char *id, const uint8_t *bytes, size_t size, char *why, size_t why_size) {
    if (id == NULL || !valid_id(id)) {
        snprintf(why, why_size, "a kernel library is known by a SHA-256 in lowercase hex");
        return -1;
    }
    return load_library(id, bytes, size, why, why_size) != NULL ? 0 : -1;
}

/* ------------------------------------------------------------------ the operator */

typedef struct {
    char symbol[256];
    char id[ID_SIZE];
    KernelFn fn;
    Library *library;
    size_t outputs;
    int64_t ranks[MAX_ARGS];
    int64_t shapes[MAX_ARGS][MAX_RANK];
    size_t inputs; /* 0: the node declares no input shapes, each input's is read from ORT */
    int64_t input_ranks[MAX_ARGS];
    int64_t input_shapes[MAX_ARGS][MAX_RANK];
    size_t input_bytes[MAX_ARGS];
} Kernel;

static GetTensorSizeInBytesFn size_in_bytes; /* NULL before ONNX Runtime 1.23 */

static OrtStatus *read_ints(const OrtKernelInfo *info, const char *name, int64_t *out, size_t capacity,
                            size_t *count) {
    size_t size = 0;
    OrtStatus *status = ORT(KernelInfoGetAttributeArray_int64, GetAttributeInt64sFn)(info, name, NULL, &size);
    if (status != NULL) {
        ORT(ReleaseStatus, ReleaseStatusFn)(status);
        return error(ORT_INVALID_GRAPH, "einopt TvmKernel: missing attribute %s", name);
    }
    if (size > capacity)
        return error(ORT_INVALID_GRAPH, "einopt TvmKernel: attribute %s has %zu values (at most %zu)", name, size,
                     capacity);
    *count = size;
    return size ? ORT(KernelInfoGetAttributeArray_int64, GetAttributeInt64sFn)(info, name, out, &size) : NULL;
}

/* The optional input_ranks / input_shapes: the shapes the kernel was compiled for, one input after another. */
static OrtStatus *read_input_shapes(Kernel *k, const OrtKernelInfo *info) {
    size_t size = 0;
    OrtStatus *status = ORT(KernelInfoGetAttributeArray_int64, GetAttributeInt64sFn)(info, "input_ranks", NULL, &size);
    if (status != NULL) { /* absent: every call reads the inputs' shapes from ORT */
        ORT(ReleaseStatus, ReleaseStatusFn)(status);
        return NULL;
    }
    int64_t dims[MAX_ARGS * MAX_RANK];
    size_t n_dims = 0, inputs = 0;
    if ((status = read_ints(info, "input_ranks", k->input_ranks, MAX_ARGS, &inputs)) != NULL)
        return status;
    if ((status = read_ints(info, "input_shapes", dims, MAX_ARGS * MAX_RANK, &n_dims)) != NULL)
        return status;
    size_t at = 0;
    for (size_t i = 0; i < inputs; i++) {
        if (k->input_ranks[i] < 0 || k->input_ranks[i] > MAX_RANK || at + (size_t)k->input_ranks[i] > n_dims)
            return error(ORT_INVALID_GRAPH, "einopt TvmKernel %s: input_ranks and input_shapes disagree", k->symbol);
        k->input_bytes[i] = sizeof(float);
        for (int64_t d = 0; d < k->input_ranks[i]; d++) {
            k->input_shapes[i][d] = dims[at++];
            k->input_bytes[i] *= (size_t)k->input_shapes[i][d];
        }
    }
    if (at != n_dims)
        return error(ORT_INVALID_GRAPH, "einopt TvmKernel %s: input_ranks and input_shapes disagree", k->symbol);
    k->inputs = inputs;
    return NULL;
}

static OrtStatus *read_attributes(Kernel *k, const OrtKernelInfo *info) {
    size_t size = sizeof k->symbol;
    OrtStatus *status = ORT(KernelInfoGetAttribute_string, GetAttributeStringFn)(info, "symbol", k->symbol, &size);
    if (status != NULL) {
        ORT(ReleaseStatus, ReleaseStatusFn)(status);
        return error(ORT_INVALID_GRAPH, "einopt TvmKernel: the attribute symbol is missing or too long");
    }
    size = sizeof k->id;
    status = ORT(KernelInfoGetAttribute_string, GetAttributeStringFn)(info, "kernel_sha256", k->id, &size);
    if (status != NULL || !valid_id(k->id)) {
        if (status != NULL)
            ORT(ReleaseStatus, ReleaseStatusFn)(status);
        return error(ORT_INVALID_GRAPH,
                     "einopt TvmKernel %s: no kernel_sha256 attribute (a SHA-256 in hex): the node was not written "
                     "by this einopt (earlier versions put native code in the model, which einopt no longer loads); "
                     "optimize the original model again",
                     k->symbol);
    }
    int64_t dims[MAX_ARGS * MAX_RANK];
    size_t n_dims = 0;
    if ((status = read_ints(info, "output_ranks", k->ranks, MAX_ARGS, &k->outputs)) != NULL)
        return status;
    if ((status = read_ints(info, "output_shapes", dims, MAX_ARGS * MAX_RANK, &n_dims)) != NULL)
        return status;
    size_t at = 0;
    for (size_t j = 0; j < k->outputs; j++) {
        if (k->ranks[j] < 0 || k->ranks[j] > MAX_RANK || at + (size_t)k->ranks[j] > n_dims)
            return error(ORT_INVALID_GRAPH, "einopt TvmKernel %s: output_ranks and output_shapes disagree", k->symbol);
        for (int64_t d = 0; d < k->ranks[j]; d++)
            k->shapes[j][d] = dims[at++];
    }
    if (at != n_dims)
        return error(ORT_INVALID_GRAPH, "einopt TvmKernel %s: output_ranks and output_shapes disagree", k->symbol);
    return read_input_shapes(k, info);
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const void *api, const OrtKernelInfo *info, void **out) {
    (void)op, (void)api;
    Kernel *k = calloc(1, sizeof *k);
    if (k == NULL)
        return error(ORT_FAIL, "einopt TvmKernel: out of memory");
    OrtStatus *status = read_attributes(k, info);
    if (status == NULL && (k->library = find_library(k->id)) == NULL)
        status = error(ORT_FAIL,
                       "einopt TvmKernel %s: its kernel (description %.16s...) is not built in this process: a "
                       "model file carries no native code; open the model with einopt.runtime.session(path), "
                       "which builds its kernels from the descriptions in the model",
                       k->symbol, k->id);
    if (status == NULL) {
        char name[300];
        snprintf(name, sizeof name, "__tvm_ffi_%s", k->symbol);
        k->fn = (KernelFn)dlsym(k->library->handle, name);
        if (k->fn == NULL)
            status = error(ORT_INVALID_GRAPH, "einopt TvmKernel: the kernel library has no kernel %s", k->symbol);
    }
    if (status != NULL) {
        free(k);
        return status;
    }
    *out = k;
    return NULL;
}

/* One float32 tensor as a DLTensor on its buffer. */
static OrtStatus *describe(const OrtValue *value, DLTensor *t, int64_t *dims, const char *symbol, size_t index) {
    OrtShapeInfo *info = NULL;
    OrtStatus *status = ORT(GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(value, &info);
    int type = 0;
    size_t rank = 0;
    if (status == NULL)
        status = ORT(GetTensorElementType, GetTensorElementTypeFn)(info, &type);
    if (status == NULL)
        status = ORT(GetDimensionsCount, GetDimensionsCountFn)(info, &rank);
    if (status == NULL && (type != ELEMENT_FLOAT || rank > MAX_RANK))
        status = error(ORT_INVALID_ARGUMENT, "einopt TvmKernel %s: input %zu must be float32 of rank <= %d",
                       symbol, index, MAX_RANK);
    if (status == NULL)
        status = ORT(GetDimensions, GetDimensionsFn)(info, dims, rank);
    if (info != NULL)
        ORT(ReleaseTensorTypeAndShapeInfo, ReleaseShapeInfoFn)(info);
    void *data = NULL;
    if (status == NULL)
        status = ORT(GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)value, &data);
    *t = (DLTensor){data, {DL_CPU, 0}, (int32_t)rank, {DL_FLOAT, 32, 1}, dims, NULL, 0};
    return status;
}

static size_t elements(const DLTensor *t) {
    size_t n = 1;
    for (int32_t d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

/*
 * TVM's kernels assume 64-byte aligned buffers (they may use aligned vector loads) unless they were
 * compiled for less (einopt's own are element-aligned). ONNX Runtime's own buffers are 64-byte
 * aligned, but a graph input fed from Python may not be (numpy aligns to 16 bytes): a buffer less
 * aligned than its kernel assumes is read from (or written to) an aligned copy, in a scratch area
 * that each thread keeps and only grows, so a call allocates nothing.
 */
static _Thread_local void *scratch;
static _Thread_local size_t scratch_size;

static void *scratch_of(size_t bytes) {
    if (bytes <= scratch_size)
        return scratch;
    void *p = NULL;
    if (posix_memalign(&p, ALIGNMENT, bytes) != 0)
        return NULL;
    free(scratch);
    scratch = p;
    scratch_size = bytes;
    return p;
}

static int misaligned(const DLTensor *t, uintptr_t alignment) { return ((uintptr_t)t->data & (alignment - 1)) != 0; }

static size_t padded_bytes(const DLTensor *t) {
    return (elements(t) * sizeof(float) + ALIGNMENT - 1) & ~(size_t)(ALIGNMENT - 1);
}

static OrtStatus *compute(void *kernel, OrtKernelContext *context) {
    Kernel *k = kernel;
    size_t n_in = 0, n_out = 0;
    OrtStatus *status = ORT(KernelContext_GetInputCount, GetCountFn)(context, &n_in);
    if (status == NULL)
        status = ORT(KernelContext_GetOutputCount, GetCountFn)(context, &n_out);
    if (status != NULL)
        return status;
    size_t n = n_in + n_out;
    if (n_out != k->outputs || n > MAX_ARGS)
        return error(ORT_INVALID_ARGUMENT, "einopt TvmKernel %s: %zu inputs and %zu outputs, expected %zu outputs",
                     k->symbol, n_in, n_out, k->outputs);
    DLTensor tensors[MAX_ARGS];
    int64_t dims[MAX_ARGS][MAX_RANK];
    void *originals[MAX_ARGS];
    TVMFFIAny args[MAX_ARGS];
    int declared = size_in_bytes != NULL && k->inputs == n_in;
    for (size_t i = 0; i < n_in && status == NULL; i++) {
        const OrtValue *value = NULL;
        status = ORT(KernelContext_GetInput, GetInputFn)(context, i, &value);
        size_t bytes = 0;
        if (status == NULL && declared) {
            OrtStatus *unknown = size_in_bytes(value, &bytes);
            if (unknown != NULL) {
                ORT(ReleaseStatus, ReleaseStatusFn)(unknown);
                bytes = 0;
            }
        }
        if (status == NULL && declared && bytes == k->input_bytes[i]) {
            /* the declared shape, checked by its size (ORT checks the element type against the schema) */
            void *data = NULL;
            status = ORT(GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)value, &data);
            tensors[i] = (DLTensor){data, {DL_CPU, 0}, (int32_t)k->input_ranks[i], {DL_FLOAT, 32, 1},
                                    k->input_shapes[i], NULL, 0};
        } else if (status == NULL) {
            status = describe(value, &tensors[i], dims[i], k->symbol, i);
            /* an input of the declared size in another shape (a Reshape the kernel reads through) */
            if (status == NULL && k->inputs == n_in && elements(&tensors[i]) * sizeof(float) == k->input_bytes[i]) {
                tensors[i].ndim = (int32_t)k->input_ranks[i];
                tensors[i].shape = k->input_shapes[i];
            }
        }
    }
    for (size_t j = 0; j < n_out && status == NULL; j++) {
        OrtValue *value = NULL;
        size_t a = n_in + j;
        status = ORT(KernelContext_GetOutput, GetOutputFn)(context, j, k->shapes[j], (size_t)k->ranks[j], &value);
        void *data = NULL;
        if (status == NULL)
            status = ORT(GetTensorMutableData, GetTensorMutableDataFn)(value, &data);
        memcpy(dims[a], k->shapes[j], sizeof(int64_t) * (size_t)k->ranks[j]);
        tensors[a] = (DLTensor){data, {DL_CPU, 0}, (int32_t)k->ranks[j], {DL_FLOAT, 32, 1}, dims[a], NULL, 0};
    }
    if (status != NULL)
        return status;
    size_t need = 0;
    for (size_t a = 0; a < n; a++)
        need += misaligned(&tensors[a], k->library->alignment) ? padded_bytes(&tensors[a]) : 0;
    char *area = need ? scratch_of(need) : NULL;
    if (need && area == NULL)
        return error(ORT_FAIL, "einopt TvmKernel %s: out of memory", k->symbol);
    for (size_t a = 0; a < n; a++) {
        originals[a] = NULL;
        if (!misaligned(&tensors[a], k->library->alignment))
            continue;
        originals[a] = tensors[a].data;
        if (a < n_in)
            memcpy(area, tensors[a].data, elements(&tensors[a]) * sizeof(float));
        tensors[a].data = area;
        area += padded_bytes(&tensors[a]);
    }
    for (size_t a = 0; a < n; a++)
        args[a] = (TVMFFIAny){TVMFFI_DLTENSOR_PTR, 0, {.v_ptr = &tensors[a]}};
    TVMFFIAny result = {TVMFFI_NONE, 0, {0}};
    const OrtKernelContext *outer = running;
    running = context;
    int rc = k->fn(NULL, args, (int32_t)n, &result);
    running = outer;
    if (rc != 0)
        return error(ORT_RUNTIME_EXCEPTION, "einopt TvmKernel %s failed: %s", k->symbol, k->library->last_error());
    for (size_t a = n_in; a < n; a++)
        if (originals[a] != NULL)
            memcpy(originals[a], tensors[a].data, elements(&tensors[a]) * sizeof(float));
    return NULL;
}

static void destroy_kernel(void *kernel) { free(kernel); }

static const char *op_name(const OrtCustomOp *op) { (void)op; return "TvmKernel"; }
static const char *op_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static size_t op_input_count(const OrtCustomOp *op) { (void)op; return 1; }
static size_t op_output_count(const OrtCustomOp *op) { (void)op; return 1; }
static int op_input_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static int op_output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static int op_input_io(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return IO_VARIADIC; }
static int op_output_io(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return IO_VARIADIC; }
static int op_memory(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return MEM_DEFAULT; }
static int op_one(const OrtCustomOp *op) { (void)op; return 1; }

static const OrtCustomOp tvm_kernel = {
    .version = 16,
    .GetName = op_name,
    .GetExecutionProviderType = op_provider,
    .GetInputType = op_input_type,
    .GetInputTypeCount = op_input_count,
    .GetOutputType = op_output_type,
    .GetOutputTypeCount = op_output_count,
    .KernelDestroy = destroy_kernel,
    .GetInputCharacteristic = op_input_io,
    .GetOutputCharacteristic = op_output_io,
    .GetInputMemoryType = op_memory,
    .GetVariadicInputMinArity = op_one,
    .GetVariadicInputHomogeneity = op_one,
    .GetVariadicOutputMinArity = op_one,
    .GetVariadicOutputHomogeneity = op_one,
    .CreateKernelV2 = create_kernel,
    .KernelComputeV2 = compute,
};

/* ------------------------------------------------------------------ registration */

/* The library's own version, for einopt to check that a cached build is the current source. */
EXPORT const char *einopt_ort_library_version(void) {
#ifdef EINOPT_SOURCE_HASH
    return EINOPT_SOURCE_HASH;
#else
    return "unversioned";
#endif
}

/* Keep this library loaded for the process once ONNX Runtime has loaded it: a session's end unloads
 * what it registered, and loading it again would lose the kernel libraries loaded so far (and map
 * them again). */
static void stay_loaded(void) {
    Dl_info self;
    if (dladdr((void *)stay_loaded, &self) != 0 && self.dli_fname != NULL)
        (void)dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    const char *version = base->GetVersionString();
    stay_loaded();
    int major = 0, minor = 0;
    ort = base->GetApi(API_VERSION);
    if (ort == NULL || sscanf(version, "%d.%d", &major, &minor) != 2 || (major == 1 && minor < 17)) {
        ort = base->GetApi(1); /* every runtime has version 1: enough to say why */
        return error(ORT_FAIL, "einopt's kernel library needs ONNX Runtime 1.17 or later (API %d); this is %s",
                     API_VERSION, version);
    }
    if (base->GetApi(SIZE_API_VERSION) != NULL)
        size_in_bytes = (GetTensorSizeInBytesFn)ort[SLOT_GetTensorSizeInBytes];
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cores = online > 0 ? (int)online : 1;
    OrtCustomOpDomain *domain = NULL; /* kept for the process: sessions hold on to it */
    OrtStatus *status = ORT(CreateCustomOpDomain, CreateCustomOpDomainFn)("ai.einopt", &domain);
    if (status == NULL)
        status = ORT(CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &tvm_kernel);
    if (status == NULL)
        status = ORT(AddCustomOpDomain, AddCustomOpDomainFn)(options, domain);
    return status;
}
