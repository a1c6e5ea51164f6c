/*
 * gpu-operator SIMULATED stub driver: libnvidia-ml.so.1, a small subset of NVML's C API
 * (signatures and return codes as in NVIDIA's nvml.h) over the GPU table of stubdriver.h.
 * Not NVIDIA software.
 */
#include "stubdriver.h" /* first: it defines _GNU_SOURCE */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/file.h>

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* The handle a caller gets points at one of these: a GPU, or one of its MIG devices. */
struct nvmlDevice_st {
    struct stub_gpu gpu;  /* a MIG device's: its GPU's */
    unsigned int gi, ci;   /* a MIG device's GPU and compute instance */
    char profile[32];      /* a MIG device's GPU-instance profile, "1g.10gb" */
    char mig_uuid[STUB_UUID_LEN];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int refcount;
static struct stub_node node;
static struct nvmlDevice_st devices[STUB_MAX_GPUS];

STUB_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    unsigned int i;

    (void)flags; /* NO_GPUS / NO_ATTACH: initialisation is lazy and never fails on 0 GPUs */
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        if (stub_load_node(&node) != 0) {
            ret = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            for (i = 0; i < node.count; i++)
                devices[i].gpu = node.gpus[i];
        }
    }
    if (ret == NVML_SUCCESS)
        refcount++;
    pthread_mutex_unlock(&lock);
    return ret;
}

STUB_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

STUB_EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

STUB_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;

    pthread_mutex_lock(&lock);
    if (refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        refcount--;
    pthread_mutex_unlock(&lock);
    return ret;
}

STUB_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    default: return "Unknown Error";
    }
}

/* Copy a string into a caller's buffer as NVML does: all of it with its NUL, or nothing. */
static nvmlReturn_t put_string(char *buf, unsigned int length, const char *value)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static int initialised(void)
{
    int yes;

    pthread_mutex_lock(&lock);
    yes = refcount > 0;
    pthread_mutex_unlock(&lock);
    return yes;
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return put_string(version, length, node.driver);
}

/* Like NVIDIA's, this one answers without nvmlInit (from the table alone). */
STUB_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    struct stub_node table;

    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    stub_parse_table(&table);
    *cudaDriverVersion = table.cuda;
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = node.count;
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= node.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* Which of our handles this is, or -1. */
static long handle_index(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device, first = (uintptr_t)devices;

    if (p < first || (p - first) % sizeof(devices[0]) != 0)
        return -1;
    if ((p - first) / sizeof(devices[0]) >= node.count)
        return -1;
    return (long)((p - first) / sizeof(devices[0]));
}

/* The GPU behind a handle, or NULL when the handle is not one of ours. */
static const struct stub_gpu *gpu_of(nvmlDevice_t device, nvmlReturn_t *ret)
{
    if (!initialised()) {
        *ret = NVML_ERROR_UNINITIALIZED;
        return NULL;
    }
    if (handle_index(device) < 0) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *ret = NVML_SUCCESS;
    return &device->gpu;
}

/*
 * MIG devices. The simulated NVML (the agents' Python one) makes them and writes each GPU's to
 * <dev>/gpu-operator-sim/mig/<uuid>: "mode <0|1>", then "mig <gi> <ci> <profile> <uuid>" a
 * device. A process sees a MIG device only when it has both its capability nodes,
 * <dev>/nvidia-caps/nvidia-cap<minor>, numbered as the kernel numbers them (gpu<G>/gi<I>/access
 * = 3 + 135G + 9I, its ci<C>/access 4 + 135G + 9I + C): as a container given it through CDI.
 */
#define MIG_DIR "gpu-operator-sim/mig"
#define STUB_MAX_MIGS 8
static struct nvmlDevice_st migs[STUB_MAX_GPUS][STUB_MAX_MIGS];

/* Which MIG handle this is (its GPU's index * STUB_MAX_MIGS + its own), or -1. */
static long mig_index(nvmlDevice_t device)
{
    uintptr_t p = (uintptr_t)device, first = (uintptr_t)migs;

    if (p < first || (p - first) % sizeof(migs[0][0]) != 0)
        return -1;
    if ((p - first) / sizeof(migs[0][0]) >= (uintptr_t)node.count * STUB_MAX_MIGS)
        return -1;
    return (long)((p - first) / sizeof(migs[0][0]));
}

static int has_cap(const char *dev, unsigned int minor)
{
    char name[64];

    snprintf(name, sizeof(name), "nvidia-caps/nvidia-cap%u", minor);
    return stub_exists(dev, name);
}

/* GPU ``index``'s MIG mode and the MIG devices this process may use, read now (the simulated
 * NVML changes them at run time) into migs[index]; returns how many. Under the lock. */
static unsigned int mig_load(unsigned int index, unsigned int *mode)
{
    const struct stub_gpu *gpu = &devices[index].gpu;
    char dev[PATH_MAX], path[PATH_MAX], line[256], profile[32], uuid[STUB_UUID_LEN];
    unsigned int gi, ci, n = 0, g = gpu->minor;
    FILE *f;

    *mode = 0;
    if (stub_device_dir(dev, sizeof(dev)) != 0)
        return 0;
    if (snprintf(path, sizeof(path), "%s/%s/%s", dev, MIG_DIR, gpu->uuid) >= (int)sizeof(path))
        return 0;
    if (!(f = fopen(path, "r")))
        return 0;
    while (fgets(line, sizeof(line), f)) {
        struct nvmlDevice_st *mig;

        if (sscanf(line, "mode %u", mode) == 1)
            continue;
        if (sscanf(line, "mig %u %u %31s %95s", &gi, &ci, profile, uuid) != 4)
            continue;
        if (n >= STUB_MAX_MIGS || !has_cap(dev, 3 + 135 * g + 9 * gi) ||
            !has_cap(dev, 4 + 135 * g + 9 * gi + ci))
            continue;
        mig = &migs[index][n++];
        mig->gpu = *gpu;
        mig->gi = gi;
        mig->ci = ci;
        stub_copy(mig->profile, sizeof(mig->profile), profile);
        stub_copy(mig->mig_uuid, sizeof(mig->mig_uuid), uuid);
    }
    fclose(f);
    return n;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu;
    char mig[STUB_NAME_LEN + 40];

    if (initialised() && mig_index(device) >= 0) {
        snprintf(mig, sizeof(mig), "%s MIG %s", device->gpu.name, device->profile);
        return put_string(name, length, mig);
    }
    gpu = gpu_of(device, &ret);
    return gpu ? put_string(name, length, gpu->name) : ret;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu;

    if (initialised() && mig_index(device) >= 0)
        return put_string(uuid, length, device->mig_uuid);
    gpu = gpu_of(device, &ret);
    return gpu ? put_string(uuid, length, gpu->uuid) : ret;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = gpu->minor;
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = gpu->memory_mib * 1024ULL * 1024ULL;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)handle_index(device);
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned int i;

    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (i = 0; i < node.count; i++) {
        if (strcmp(devices[i].gpu.uuid, uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* MIG mode as the simulated NVML left it; never pending apart from current. */
STUB_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                              unsigned int *pendingMode)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);
    unsigned int mode;

    if (!gpu)
        return ret;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    mig_load((unsigned int)handle_index(device), &mode);
    pthread_mutex_unlock(&lock);
    *currentMode = *pendingMode = mode ? 1 : 0;
    return NVML_SUCCESS;
}

/* How many MIG devices this process may use on the GPU (NVIDIA's is the most there could be:
 * a caller asks each index and skips those NOT_FOUND, which works the same here). */
STUB_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);
    unsigned int mode;

    if (!gpu)
        return ret;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    *count = mig_load((unsigned int)handle_index(device), &mode);
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device,
                                                             unsigned int index,
                                                             nvmlDevice_t *migDevice)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);
    unsigned int mode, n, gpu_index;

    if (!gpu)
        return ret;
    if (!migDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    gpu_index = (unsigned int)handle_index(device);
    pthread_mutex_lock(&lock);
    n = mig_load(gpu_index, &mode);
    pthread_mutex_unlock(&lock);
    if (index >= n)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[gpu_index][index];
    return NVML_SUCCESS;
}

/* nvml.h's nvmlPciInfo_t (the layout since NVML 7: the legacy 16-byte id first). */
typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

STUB_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    stub_copy(pci->busId, sizeof(pci->busId), gpu->pci_bus_id);
    /* The legacy id: "DDDD:BB:DD.F", the domain cut to 4 digits. */
    stub_copy(pci->busIdLegacy, sizeof(pci->busIdLegacy),
              strlen(gpu->pci_bus_id) > 12 ? gpu->pci_bus_id + strlen(gpu->pci_bus_id) - 12
                                           : gpu->pci_bus_id);
    if (sscanf(gpu->pci_bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device) != 3)
        return NVML_ERROR_UNKNOWN;
    pci->pciDeviceId = 0x10de; /* vendor in the low half, as NVML gives it; device id unknown */
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/*
 * The compute policy a GPU holds (compute mode, scheduling time-slice), kept as the hardware
 * would: per GPU, for every process on the node, in <device dir>/gpu-operator-sim/compute/
 * <uuid> ("mode <m>\ntimeslice <t>\n"; absent: both 0, NVIDIA's defaults). NVML sets the mode;
 * the time-slice has no public NVML call (nvidia-smi compute-policy sets it), so the stub
 * exports it under its own name for its nvidia-smi.
 */
#define COMPUTE_DIR "gpu-operator-sim/compute"
#define NVML_COMPUTEMODE_COUNT 4
#define TIMESLICE_COUNT 4 /* Default, Short, Medium, Long */

static int policy_path(const struct stub_gpu *gpu, char *out, size_t len, int make)
{
    char dev[PATH_MAX], dir[PATH_MAX];

    if (stub_device_dir(dev, sizeof(dev)) != 0)
        return -1;
    if (snprintf(dir, sizeof(dir), "%s/gpu-operator-sim", dev) >= (int)sizeof(dir))
        return -1;
    if (make && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -1;
    if (snprintf(dir, sizeof(dir), "%s/%s", dev, COMPUTE_DIR) >= (int)sizeof(dir))
        return -1;
    if (make && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -1;
    return snprintf(out, len, "%s/%s", dir, gpu->uuid) >= (int)len ? -1 : 0;
}

static void policy_read(const struct stub_gpu *gpu, unsigned int *mode, unsigned int *slice)
{
    char path[PATH_MAX];
    FILE *f;

    *mode = *slice = 0;
    if (policy_path(gpu, path, sizeof(path), 0) != 0 || !(f = fopen(path, "r")))
        return;
    if (fscanf(f, "mode %u\ntimeslice %u", mode, slice) != 2)
        *mode = *slice = 0;
    fclose(f);
}

/* Written whole and renamed into place: a reader never sees half a policy. */
static nvmlReturn_t policy_write(const struct stub_gpu *gpu, unsigned int mode, unsigned int slice)
{
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    FILE *f;

    if (policy_path(gpu, path, sizeof(path), 1) != 0)
        return errno == EROFS || errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
    if (!(f = fopen(tmp, "w")))
        return errno == EROFS || errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    fprintf(f, "mode %u\ntimeslice %u\n", mode, slice);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* Set one half of the policy, keeping the other: under an flock on the directory, so two
 * processes setting the two halves at once both land. */
static nvmlReturn_t policy_update(const struct stub_gpu *gpu, int set_mode, unsigned int value)
{
    char path[PATH_MAX], *slash;
    unsigned int mode, slice;
    nvmlReturn_t ret;
    int dir;

    if (policy_path(gpu, path, sizeof(path), 1) != 0)
        return errno == EROFS || errno == EACCES ? NVML_ERROR_NO_PERMISSION : NVML_ERROR_UNKNOWN;
    slash = strrchr(path, '/');
    *slash = '\0';
    dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return NVML_ERROR_UNKNOWN;
    pthread_mutex_lock(&lock);
    flock(dir, LOCK_EX);
    policy_read(gpu, &mode, &slice);
    ret = policy_write(gpu, set_mode ? value : mode, set_mode ? slice : value);
    flock(dir, LOCK_UN);
    pthread_mutex_unlock(&lock);
    close(dir);
    return ret;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);
    unsigned int slice;

    if (!gpu)
        return ret;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    policy_read(gpu, mode, &slice);
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, unsigned int mode)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (mode >= NVML_COMPUTEMODE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return policy_update(gpu, 1, mode);
}

STUB_EXPORT nvmlReturn_t gpuOperatorStubGetTimeslice(nvmlDevice_t device, unsigned int *slice)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);
    unsigned int mode;

    if (!gpu)
        return ret;
    if (!slice)
        return NVML_ERROR_INVALID_ARGUMENT;
    policy_read(gpu, &mode, slice);
    return NVML_SUCCESS;
}

STUB_EXPORT nvmlReturn_t gpuOperatorStubSetTimeslice(nvmlDevice_t device, unsigned int slice)
{
    nvmlReturn_t ret;
    const struct stub_gpu *gpu = gpu_of(device, &ret);

    if (!gpu)
        return ret;
    if (slice >= TIMESLICE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return policy_update(gpu, 0, slice);
}
