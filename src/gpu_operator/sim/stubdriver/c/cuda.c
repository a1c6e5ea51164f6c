/*
 * gpu-operator SIMULATED stub driver: libcuda.so.1, a small subset of the CUDA driver API
 * (types and return codes as in NVIDIA's cuda.h) over the GPU table of stubdriver.h.
 * "Device" memory is host memory (malloc). Not NVIDIA software.
 */
#include "stubdriver.h" /* first: it defines _GNU_SOURCE */

#include <pthread.h>
#include <stdint.h>

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_DEVICE_UNAVAILABLE = 46,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

struct CUctx_st {
    CUdevice device;
};

/* One allocation: "device" memory is host memory here. */
struct allocation {
    CUcontext ctx;
    unsigned char *ptr;
    size_t size;
    struct allocation *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised;
static struct stub_node node;
static unsigned long long allocated[STUB_MAX_GPUS];
static struct allocation *allocations;
static __thread CUcontext current;

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
     "OS call failed or operation not supported on this OS"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

STUB_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    size_t i;

    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
        if (errors[i].code == error) {
            *pStr = errors[i].name;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

STUB_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    size_t i;

    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
        if (errors[i].code == error) {
            *pStr = errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* With no kernel module (no nvidiactl) NVIDIA's libcuda fails cuInit with NO_DEVICE too. */
STUB_EXPORT CUresult cuInit(unsigned int Flags)
{
    CUresult ret = CUDA_SUCCESS;

    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!initialised) {
        if (stub_load_node(&node) != 0 || node.count == 0)
            ret = CUDA_ERROR_NO_DEVICE;
        else
            initialised = 1;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

/* Like NVIDIA's, this one answers before cuInit. */
STUB_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    struct stub_node table;

    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    stub_parse_table(&table);
    *driverVersion = table.cuda;
    return CUDA_SUCCESS;
}

static int ready(void)
{
    int yes;

    pthread_mutex_lock(&lock);
    yes = initialised;
    pthread_mutex_unlock(&lock);
    return yes;
}

static CUresult check_device(CUdevice dev)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || (unsigned int)dev >= node.count)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)node.count;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult ret = check_device(ordinal);

    if (ret != CUDA_SUCCESS)
        return ret;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult ret = check_device(dev);

    if (ret != CUDA_SUCCESS)
        return ret;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", node.gpus[dev].name);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult ret = check_device(dev);

    if (ret != CUDA_SUCCESS)
        return ret;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)(node.gpus[dev].memory_mib * 1024ULL * 1024ULL);
    return CUDA_SUCCESS;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The 16 bytes of "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVIDIA's CUuuid has them. */
STUB_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CUresult ret = check_device(dev);
    const char *p;
    int nibbles = 0;

    if (ret != CUDA_SUCCESS)
        return ret;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    memset(uuid->bytes, 0, sizeof(uuid->bytes));
    p = node.gpus[dev].uuid;
    if (strncmp(p, "GPU-", 4) == 0)
        p += 4;
    for (; *p && nibbles < 32; p++) {
        int v = hex_value(*p);
        if (v < 0)
            continue;
        uuid->bytes[nibbles / 2] = (char)(uuid->bytes[nibbles / 2] | (nibbles % 2 ? v : v << 4));
        nibbles++;
    }
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CUresult ret = check_device(dev);
    CUcontext ctx;

    (void)flags;
    if (ret != CUDA_SUCCESS)
        return ret;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    ctx = malloc(sizeof(*ctx));
    if (!ctx)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->device = dev;
    current = ctx; /* a new context is made current to the calling thread */
    *pctx = ctx;
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    struct allocation **a;

    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (a = &allocations; *a;) {
        struct allocation *gone = *a;
        if (gone->ctx != ctx) {
            a = &gone->next;
            continue;
        }
        *a = gone->next;
        allocated[ctx->device] -= gone->size;
        free(gone->ptr);
        free(gone);
    }
    pthread_mutex_unlock(&lock);
    if (current == ctx)
        current = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    unsigned long long total;
    struct allocation *a;
    CUresult ret = CUDA_SUCCESS;

    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    total = node.gpus[current->device].memory_mib * 1024ULL * 1024ULL;
    pthread_mutex_lock(&lock);
    if (bytesize > total - allocated[current->device]) {
        ret = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!(a = malloc(sizeof(*a))) || !(a->ptr = malloc(bytesize))) {
        free(a);
        ret = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        a->ctx = current;
        a->size = bytesize;
        a->next = allocations;
        allocations = a;
        allocated[current->device] += bytesize;
        *dptr = (CUdeviceptr)(uintptr_t)a->ptr;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

STUB_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    struct allocation **a;

    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (dptr == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    for (a = &allocations; *a; a = &(*a)->next) {
        struct allocation *gone = *a;
        if ((CUdeviceptr)(uintptr_t)gone->ptr != dptr)
            continue;
        *a = gone->next;
        allocated[gone->ctx->device] -= gone->size;
        pthread_mutex_unlock(&lock);
        free(gone->ptr);
        free(gone);
        return CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* Host address of [dptr, dptr + count) when it lies inside one allocation, else NULL. */
static unsigned char *device_range(CUdeviceptr dptr, size_t count, CUresult *ret)
{
    struct allocation *a;
    unsigned char *host = NULL;

    *ret = CUDA_SUCCESS;
    if (!ready()) {
        *ret = CUDA_ERROR_NOT_INITIALIZED;
        return NULL;
    }
    if (!current) {
        *ret = CUDA_ERROR_INVALID_CONTEXT;
        return NULL;
    }
    pthread_mutex_lock(&lock);
    for (a = allocations; a; a = a->next) {
        CUdeviceptr start = (CUdeviceptr)(uintptr_t)a->ptr;
        if (dptr >= start && dptr - start <= a->size && count <= a->size - (dptr - start)) {
            host = a->ptr + (dptr - start);
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (!host)
        *ret = CUDA_ERROR_INVALID_VALUE;
    return host;
}

STUB_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult ret;
    unsigned char *dst = device_range(dstDevice, N, &ret);

    if (dst)
        memset(dst, uc, N);
    return ret;
}

STUB_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    CUresult ret;
    unsigned char *src = device_range(srcDevice, ByteCount, &ret);

    if (!src)
        return ret;
    if (!dstHost && ByteCount)
        return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount)
        memcpy(dstHost, src, ByteCount);
    return CUDA_SUCCESS;
}

STUB_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    CUresult ret;
    unsigned char *dst = device_range(dstDevice, ByteCount, &ret);

    if (!dst)
        return ret;
    if (!srcHost && ByteCount)
        return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount)
        memcpy(dst, srcHost, ByteCount);
    return CUDA_SUCCESS;
}
