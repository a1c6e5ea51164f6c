/*
 * gpu-operator SIMULATED nvidia-smi: a small stand-in for NVIDIA's tool. It loads
 * libnvidia-ml.so.1 by soname (as NVIDIA's does) and supports:
 *
 *     nvidia-smi                 a summary: a SIMULATED header with the versions, a line a GPU
 *     nvidia-smi -L              "GPU <i>: <name> (UUID: <uuid>)", as NVIDIA's prints it, each
 *                                followed by the MIG devices this process may use on it
 *     nvidia-smi --query-gpu=name,uuid,memory.total,driver_version,index,minor_number,
 *                compute_mode --format=csv[,noheader][,nounits]
 *     nvidia-smi -i <index|uuid> -c <DEFAULT|PROHIBITED|EXCLUSIVE_PROCESS|0|2|3>
 *     nvidia-smi compute-policy -i <index|uuid> --set-timeslice <0-3>
 *
 * The compute mode and time-slice are the stub library's simulated GPU state (nvml.c).
 * Exit codes are NVML's return codes, as NVIDIA's: 9 when the driver cannot be reached.
 * Not NVIDIA software.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define EXIT_BAD_ARGUMENTS 2
#define FAILED_MESSAGE                                                                         \
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure " \
    "that the latest NVIDIA driver is installed and running.\n"

static struct {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    const char *(*error_string)(nvmlReturn_t);
    nvmlReturn_t (*driver_version)(char *, unsigned int);
    nvmlReturn_t (*cuda_version)(int *);
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*handle)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*name)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*minor)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*get_mode)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*set_mode)(nvmlDevice_t, unsigned int);
    nvmlReturn_t (*set_slice)(nvmlDevice_t, unsigned int);
    nvmlReturn_t (*mig_count)(nvmlDevice_t, unsigned int *);
    nvmlReturn_t (*mig_handle)(nvmlDevice_t, unsigned int, nvmlDevice_t *);
} nvml;

/* nvidia-smi's names of NVML's compute modes, by value. */
static const char *const MODE_NAMES[] = {"Default", "Exclusive_Thread", "Prohibited",
                                         "Exclusive_Process"};

struct gpu {
    char name[96];
    char uuid[96];
    unsigned int minor;
    unsigned long long memory_mib;
    unsigned int compute_mode;
};

static void *resolve(void *lib, const char *symbol)
{
    void *fn = dlsym(lib, symbol);
    if (!fn) {
        fprintf(stderr, "nvidia-smi: %s\n", dlerror());
        printf(FAILED_MESSAGE);
        exit(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    return fn;
}

static void load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvmlReturn_t ret;

    if (!lib) {
        fprintf(stderr, "nvidia-smi: %s\n", dlerror());
        printf(FAILED_MESSAGE);
        exit(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    *(void **)&nvml.init = resolve(lib, "nvmlInit_v2");
    *(void **)&nvml.shutdown = resolve(lib, "nvmlShutdown");
    *(void **)&nvml.error_string = resolve(lib, "nvmlErrorString");
    *(void **)&nvml.driver_version = resolve(lib, "nvmlSystemGetDriverVersion");
    *(void **)&nvml.cuda_version = resolve(lib, "nvmlSystemGetCudaDriverVersion");
    *(void **)&nvml.count = resolve(lib, "nvmlDeviceGetCount_v2");
    *(void **)&nvml.handle = resolve(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.name = resolve(lib, "nvmlDeviceGetName");
    *(void **)&nvml.uuid = resolve(lib, "nvmlDeviceGetUUID");
    *(void **)&nvml.minor = resolve(lib, "nvmlDeviceGetMinorNumber");
    *(void **)&nvml.memory = resolve(lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.by_uuid = resolve(lib, "nvmlDeviceGetHandleByUUID");
    *(void **)&nvml.get_mode = resolve(lib, "nvmlDeviceGetComputeMode");
    *(void **)&nvml.set_mode = resolve(lib, "nvmlDeviceSetComputeMode");
    *(void **)&nvml.set_slice = resolve(lib, "gpuOperatorStubSetTimeslice");
    *(void **)&nvml.mig_count = resolve(lib, "nvmlDeviceGetMaxMigDeviceCount");
    *(void **)&nvml.mig_handle = resolve(lib, "nvmlDeviceGetMigDeviceHandleByIndex");
    ret = nvml.init();
    if (ret != 0) {
        fprintf(stderr, "nvidia-smi: nvmlInit_v2: %s\n", nvml.error_string(ret));
        printf(FAILED_MESSAGE);
        exit(NVML_ERROR_DRIVER_NOT_LOADED);
    }
}

static void check(nvmlReturn_t ret, const char *call)
{
    if (ret != 0) {
        printf("%s failed: %s\n", call, nvml.error_string(ret));
        exit(ret);
    }
}

/* The visible GPUs, in NVML's order; exits 6 as NVIDIA's does when there are none. */
static unsigned int gpus(struct gpu *out, unsigned int max)
{
    unsigned int count, i;

    check(nvml.count(&count), "nvmlDeviceGetCount_v2");
    if (count == 0) {
        printf("No devices were found\n");
        exit(NVML_ERROR_NOT_FOUND);
    }
    if (count > max)
        count = max;
    for (i = 0; i < count; i++) {
        nvmlDevice_t dev;
        nvmlMemory_t mem;

        check(nvml.handle(i, &dev), "nvmlDeviceGetHandleByIndex_v2");
        check(nvml.name(dev, out[i].name, sizeof(out[i].name)), "nvmlDeviceGetName");
        check(nvml.uuid(dev, out[i].uuid, sizeof(out[i].uuid)), "nvmlDeviceGetUUID");
        check(nvml.minor(dev, &out[i].minor), "nvmlDeviceGetMinorNumber");
        check(nvml.memory(dev, &mem), "nvmlDeviceGetMemoryInfo");
        out[i].memory_mib = mem.total / (1024ULL * 1024ULL);
        check(nvml.get_mode(dev, &out[i].compute_mode), "nvmlDeviceGetComputeMode");
    }
    return count;
}

static void summary(void)
{
    struct gpu list[64];
    char driver[80];
    int cuda = 0;
    unsigned int i, n;

    check(nvml.driver_version(driver, sizeof(driver)), "nvmlSystemGetDriverVersion");
    check(nvml.cuda_version(&cuda), "nvmlSystemGetCudaDriverVersion");
    printf("SIMULATED nvidia-smi (gpu-operator stub driver, not NVIDIA software)   "
           "Driver Version: %s   CUDA Version: %d.%d\n",
           driver, cuda / 1000, (cuda % 1000) / 10);
    n = gpus(list, 64);
    for (i = 0; i < n; i++)
        printf("GPU %u: %s | %s | %llu MiB | /dev/nvidia%u\n", i, list[i].name, list[i].uuid,
               list[i].memory_mib, list[i].minor);
}

static void list_gpus(void)
{
    struct gpu list[64];
    unsigned int i, n = gpus(list, 64);

    for (i = 0; i < n; i++) {
        nvmlDevice_t dev, mig;
        unsigned int count = 0, k;

        printf("GPU %u: %s (UUID: %s)\n", i, list[i].name, list[i].uuid);
        check(nvml.handle(i, &dev), "nvmlDeviceGetHandleByIndex_v2");
        check(nvml.mig_count(dev, &count), "nvmlDeviceGetMaxMigDeviceCount");
        for (k = 0; k < count; k++) {
            char name[160], uuid[96];
            const char *profile;

            if (nvml.mig_handle(dev, k, &mig) != 0 || nvml.name(mig, name, sizeof(name)) != 0 ||
                nvml.uuid(mig, uuid, sizeof(uuid)) != 0)
                continue;
            profile = strstr(name, " MIG ");
            printf("  MIG %-11s Device %2u: (UUID: %s)\n", profile ? profile + 5 : name, k, uuid);
        }
    }
}

static void print_field(const char *field, unsigned int index, const struct gpu *g,
                        const char *driver, int units)
{
    if (strcmp(field, "name") == 0 || strcmp(field, "gpu_name") == 0)
        printf("%s", g->name);
    else if (strcmp(field, "uuid") == 0 || strcmp(field, "gpu_uuid") == 0)
        printf("%s", g->uuid);
    else if (strcmp(field, "memory.total") == 0)
        printf(units ? "%llu MiB" : "%llu", g->memory_mib);
    else if (strcmp(field, "driver_version") == 0)
        printf("%s", driver);
    else if (strcmp(field, "index") == 0)
        printf("%u", index);
    else if (strcmp(field, "minor_number") == 0)
        printf("%u", g->minor);
    else if (strcmp(field, "compute_mode") == 0)
        printf("%s", g->compute_mode < 4 ? MODE_NAMES[g->compute_mode] : "Unknown");
}

static int known_field(const char *field)
{
    static const char *const known[] = {"name",           "gpu_name", "uuid",  "gpu_uuid",
                                        "memory.total",   "index",    "minor_number",
                                        "driver_version", "compute_mode", NULL};
    int i;

    for (i = 0; known[i]; i++)
        if (strcmp(field, known[i]) == 0)
            return 1;
    return 0;
}

static void query(char *fields_arg, const char *format)
{
    char *fields[16], *save = NULL, *f, driver[80];
    struct gpu list[64];
    int n_fields = 0, header = 1, units = 1, i;
    unsigned int g, n;
    char format_copy[64];

    snprintf(format_copy, sizeof(format_copy), "%s", format);
    for (f = strtok_r(format_copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        if (strcmp(f, "noheader") == 0)
            header = 0;
        else if (strcmp(f, "nounits") == 0)
            units = 0;
        else if (strcmp(f, "csv") != 0) {
            printf("\"%s\" is not a valid format option.\n", f);
            exit(EXIT_BAD_ARGUMENTS);
        }
    }
    for (f = strtok_r(fields_arg, ",", &save); f && n_fields < 16; f = strtok_r(NULL, ",", &save)) {
        if (!known_field(f)) {
            printf("Field \"%s\" is not a valid field to query.\n", f);
            exit(EXIT_BAD_ARGUMENTS);
        }
        fields[n_fields++] = f;
    }
    load();
    check(nvml.driver_version(driver, sizeof(driver)), "nvmlSystemGetDriverVersion");
    n = gpus(list, 64);
    if (header) {
        for (i = 0; i < n_fields; i++)
            printf("%s%s%s", i ? ", " : "", fields[i],
                   units && strcmp(fields[i], "memory.total") == 0 ? " [MiB]" : "");
        printf("\n");
    }
    for (g = 0; g < n; g++) {
        for (i = 0; i < n_fields; i++) {
            printf("%s", i ? ", " : "");
            print_field(fields[i], g, &list[g], driver, units);
        }
        printf("\n");
    }
}

/* The GPU -i names: an index, or a UUID; exits 6 as NVIDIA's does for one it cannot find. */
static nvmlDevice_t select_gpu(const char *id)
{
    nvmlDevice_t dev;
    char *end;
    unsigned long index = strtoul(id, &end, 10);
    nvmlReturn_t ret = *id && !*end ? nvml.handle((unsigned int)index, &dev) : nvml.by_uuid(id, &dev);

    if (ret != 0) {
        printf("No devices were found\n");
        exit(NVML_ERROR_NOT_FOUND);
    }
    return dev;
}

static int parse_mode(const char *text)
{
    unsigned int i;

    for (i = 0; i < 4; i++) {
        char digit[2] = {(char)('0' + i), 0};
        if (i != 1 && (strcasecmp(text, MODE_NAMES[i]) == 0 || strcmp(text, digit) == 0))
            return (int)i;
    }
    return -1;
}

static int bad_arguments(void)
{
    printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
    return EXIT_BAD_ARGUMENTS;
}

/* An option's value: "--opt=value" or the next argument. */
static const char *value_of(int argc, char **argv, int *i, const char *opt)
{
    size_t n = strlen(opt);

    if (strncmp(argv[*i], opt, n) == 0 && argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (strcmp(argv[*i], opt) == 0 && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static int compute_policy(int argc, char **argv)
{
    const char *id = NULL, *slice = NULL, *v;
    nvmlDevice_t dev;
    char *end;
    unsigned long n;
    int i;

    for (i = 2; i < argc; i++) {
        if ((v = value_of(argc, argv, &i, "-i")) || (v = value_of(argc, argv, &i, "--id")))
            id = v;
        else if ((v = value_of(argc, argv, &i, "--set-timeslice")))
            slice = v;
        else
            return bad_arguments();
    }
    if (!id || !slice)
        return bad_arguments();
    n = strtoul(slice, &end, 10);
    if (!*slice || *end || n > 3) {
        printf("Invalid timeslice value \"%s\": 0 (default), 1 (short), 2 (medium) or 3 (long)\n",
               slice);
        return EXIT_BAD_ARGUMENTS;
    }
    load();
    dev = select_gpu(id);
    check(nvml.set_slice(dev, (unsigned int)n), "set timeslice");
    printf("Set timeslice to %lu for GPU %s.\n", n, id);
    nvml.shutdown();
    return 0;
}

int main(int argc, char **argv)
{
    char *fields = NULL;
    const char *format = NULL, *id = NULL, *mode = NULL, *v;
    int i, list = 0;

    if (argc > 1 && strcmp(argv[1], "compute-policy") == 0)
        return compute_policy(argc, argv);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            list = 1;
        else if (strncmp(argv[i], "--query-gpu=", 12) == 0)
            fields = argv[i] + 12;
        else if (strncmp(argv[i], "--format=", 9) == 0)
            format = argv[i] + 9;
        else if ((v = value_of(argc, argv, &i, "-i")) || (v = value_of(argc, argv, &i, "--id")))
            id = v;
        else if ((v = value_of(argc, argv, &i, "-c")) ||
                 (v = value_of(argc, argv, &i, "--compute-mode")))
            mode = v;
        else
            return bad_arguments();
    }
    if (fields && !format) {
        printf("Please specify the output format with --format (csv).\n");
        return EXIT_BAD_ARGUMENTS;
    }
    if (mode) {
        int m = parse_mode(mode);
        if (m < 0 || !id || fields || list)
            return bad_arguments();
        load();
        check(nvml.set_mode(select_gpu(id), (unsigned int)m), "nvmlDeviceSetComputeMode");
        printf("Set compute mode to %s for GPU %s.\nAll done.\n", MODE_NAMES[m], id);
    } else if (id) {
        return bad_arguments(); /* -i selects for -c only, in this stand-in */
    } else if (fields) {
        query(fields, format);
    } else {
        load();
        if (list)
            list_gpus();
        else
            summary();
    }
    nvml.shutdown();
    return 0;
}
