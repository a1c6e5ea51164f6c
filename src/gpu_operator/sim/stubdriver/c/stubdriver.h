/*
 * gpu-operator SIMULATED stub driver: what libnvidia-ml and libcuda share.
 *
 * This is not NVIDIA software. It stands in for the user-space half of NVIDIA's driver in
 * tests, so that containers get a driver root laid out like a real one.
 *
 * The GPU table. Each library carries a fixed-size array that starts with STUB_TABLE_MARKER
 * and is patched in place in the library file (gpu_operator.sim.stubdriver.table does it,
 * no compiler needed). Its text, NUL-terminated, one record a line:
 *
 *     GPU_OPERATOR_STUB_GPU_TABLE_V1
 *     driver 580.95.05
 *     cuda 13000
 *     gpu <minor> <uuid> <memory MiB> <pci bus id> <name, spaces allowed>
 *
 * Which GPUs are visible. The driver root is the library's own directory less a known library
 * directory (STUB_LIB_DIRS); the device dir is <root>/dev when <root>/dev/nvidiactl exists (a
 * driver container's nodes, as NVIDIA's toolkit takes its dev root to be its driver root), else
 * /dev when /dev/nvidiactl exists; else the driver is "not loaded".
 * A row is visible when <device dir>/nvidia<minor> exists (stat). Index = ascending minor.
 */
#ifndef GPU_OPERATOR_STUBDRIVER_H
#define GPU_OPERATOR_STUBDRIVER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STUB_EXPORT __attribute__((visibility("default")))

#define STUB_DRIVER_MARKER "gpu-operator SIMULATED stub driver 1"
#define STUB_TABLE_MARKER "GPU_OPERATOR_STUB_GPU_TABLE_V1"
#define STUB_TABLE_SIZE 65536
#define STUB_MAX_GPUS 64
#define STUB_NAME_LEN 96
#define STUB_UUID_LEN 96
#define STUB_PCI_LEN 32
#define STUB_VERSION_LEN 80

/* Longest first: the first that ends the library's directory gives the driver root. */
#define STUB_LIB_DIRS                                                                         \
    {                                                                                         \
        "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu", \
            "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64", "/lib"             \
    }

/* Every stub library exports this, so a loader can tell the stub from NVIDIA's driver. */
STUB_EXPORT const char gpu_operator_stub_driver[] = STUB_DRIVER_MARKER;

#ifndef STUB_MARKER_ONLY /* empty.c: the marker and nothing else */

/* The table: patched in the file, never written at run time. */
static char stub_table_data[STUB_TABLE_SIZE] __attribute__((used)) = STUB_TABLE_MARKER "\n";

struct stub_gpu {
    unsigned int minor;
    unsigned long long memory_mib;
    char uuid[STUB_UUID_LEN];
    char pci_bus_id[STUB_PCI_LEN];
    char name[STUB_NAME_LEN];
};

struct stub_node {
    char driver[STUB_VERSION_LEN];
    int cuda;
    unsigned int count; /* visible GPUs, ascending minor */
    struct stub_gpu gpus[STUB_MAX_GPUS];
};

/* The table as compiled is only its marker: hide its contents from the optimiser. */
static inline const char *stub_table_text(void)
{
    const char *p = stub_table_data;
    __asm__ volatile("" : "+r"(p));
    return p;
}

/* Copy src into dst[len], cut short when longer (len > 0). */
static inline void stub_copy(char *dst, size_t len, const char *src)
{
    size_t n = strlen(src);

    if (n >= len)
        n = len - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Parse the table into node (all rows, not yet filtered). */
static inline void stub_parse_table(struct stub_node *node)
{
    static char text[STUB_TABLE_SIZE + 1];
    char *line, *save = NULL;

    memset(node, 0, sizeof(*node));
    stub_copy(node->driver, sizeof(node->driver), "0.0");
    memcpy(text, stub_table_text(), STUB_TABLE_SIZE);
    text[STUB_TABLE_SIZE] = '\0';
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        struct stub_gpu gpu;
        int used = 0;

        if (strncmp(line, "driver ", 7) == 0) {
            stub_copy(node->driver, sizeof(node->driver), line + 7);
        } else if (strncmp(line, "cuda ", 5) == 0) {
            node->cuda = atoi(line + 5);
        } else if (strncmp(line, "gpu ", 4) == 0 && node->count < STUB_MAX_GPUS) {
            memset(&gpu, 0, sizeof(gpu));
            if (sscanf(line + 4, "%u %95s %llu %31s %n", &gpu.minor, gpu.uuid, &gpu.memory_mib,
                       gpu.pci_bus_id, &used) < 4 || used == 0)
                continue;
            stub_copy(gpu.name, sizeof(gpu.name), line + 4 + used);
            node->gpus[node->count++] = gpu;
        }
    }
}

static inline int stub_exists(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return 0;
    return stat(path, &st) == 0;
}

/* The device dir (see the top of this file) into out; 0 when found, -1 when "not loaded". */
static inline int stub_device_dir(char *out, size_t len)
{
    static const char *const lib_dirs[] = STUB_LIB_DIRS;
    char dir[PATH_MAX];
    Dl_info info;
    size_t i, dir_len;
    char *slash;

    if (!dladdr((const void *)stub_table_data, &info) || !info.dli_fname)
        goto host_dev;
    if (info.dli_fname[0] == '/') {
        stub_copy(dir, sizeof(dir), info.dli_fname);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd)))
            goto host_dev;
        if (snprintf(dir, sizeof(dir), "%s/%s", cwd, info.dli_fname) >= (int)sizeof(dir))
            goto host_dev;
    }
    slash = strrchr(dir, '/');
    if (!slash)
        goto host_dev;
    *slash = '\0';
    dir_len = strlen(dir);
    for (i = 0; i < sizeof(lib_dirs) / sizeof(lib_dirs[0]); i++) {
        size_t suffix_len = strlen(lib_dirs[i]);
        char dev[PATH_MAX];

        if (dir_len < suffix_len || strcmp(dir + dir_len - suffix_len, lib_dirs[i]) != 0)
            continue;
        if (snprintf(dev, sizeof(dev), "%.*s/dev", (int)(dir_len - suffix_len), dir) >=
            (int)sizeof(dev))
            continue;
        if (stub_exists(dev, "nvidiactl")) {
            stub_copy(out, len, dev);
            return 0;
        }
    }
host_dev:
    if (stub_exists("/dev", "nvidiactl")) {
        stub_copy(out, len, "/dev");
        return 0;
    }
    return -1;
}

static int stub_by_minor(const void *a, const void *b)
{
    unsigned int x = ((const struct stub_gpu *)a)->minor, y = ((const struct stub_gpu *)b)->minor;
    return (x > y) - (x < y);
}

/* Load the node as this process sees it: 0, or -1 when the driver is "not loaded". */
static inline int stub_load_node(struct stub_node *node)
{
    char devdir[PATH_MAX];
    unsigned int i, kept = 0;

    stub_parse_table(node);
    if (stub_device_dir(devdir, sizeof(devdir)) != 0) {
        node->count = 0;
        return -1;
    }
    for (i = 0; i < node->count; i++) {
        char name[32];
        snprintf(name, sizeof(name), "nvidia%u", node->gpus[i].minor);
        if (stub_exists(devdir, name))
            node->gpus[kept++] = node->gpus[i];
    }
    node->count = kept;
    qsort(node->gpus, node->count, sizeof(node->gpus[0]), stub_by_minor);
    return 0;
}

#endif /* STUB_MARKER_ONLY */
#endif
