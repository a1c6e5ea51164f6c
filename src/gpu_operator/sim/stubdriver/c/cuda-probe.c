/*
 * gpu-operator-cuda-probe: does the CUDA driver in this container work? It loads libcuda.so.1
 * by soname, initialises it, allocates memory on device 0, sets it, copies it back and checks
 * every byte. Only the CUDA driver API's documented semantics are used, so the same probe runs
 * against the gpu-operator SIMULATED stub driver and against NVIDIA's real driver.
 *
 *     gpu-operator-cuda-probe [--bytes N]     (default: 1 GiB)
 *
 * One line a step; exit 0 when every step passed, 1 naming the call and its CUresult if not.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static void *lib;
static CUresult (*get_error_name)(CUresult, const char **);

static void *resolve(const char *symbol)
{
    void *fn = dlsym(lib, symbol);
    if (!fn) {
        printf("dlsym %s: %s\n", symbol, dlerror());
        exit(1);
    }
    return fn;
}

static void check(CUresult ret, const char *call)
{
    const char *name = NULL;

    if (ret == 0)
        return;
    if (!get_error_name || get_error_name(ret, &name) != 0 || !name)
        name = "CUDA_ERROR_?";
    printf("%s: %s (%d)\n", call, name, ret);
    exit(1);
}

int main(int argc, char **argv)
{
    CUresult (*cu_init)(unsigned int);
    CUresult (*driver_get_version)(int *);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*ctx_create)(CUcontext *, unsigned int, CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    unsigned long long bytes = 1ULL << 30;
    const char *stub;
    char name[256];
    int version = 0, count = 0;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr dptr;
    unsigned char *host;
    Dl_info info;
    size_t i;

    for (int a = 1; a < argc; a++) {
        char *end = NULL;
        if (strcmp(argv[a], "--bytes") == 0 && a + 1 < argc) {
            errno = 0;
            bytes = strtoull(argv[++a], &end, 10);
            if (errno || !end || *end || bytes == 0) {
                printf("--bytes: not a positive number: %s\n", argv[a]);
                return 2;
            }
        } else {
            printf("usage: gpu-operator-cuda-probe [--bytes N]\n");
            return 2;
        }
    }

    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        printf("dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    *(void **)&cu_init = resolve("cuInit");
    *(void **)&get_error_name = resolve("cuGetErrorName");
    *(void **)&driver_get_version = resolve("cuDriverGetVersion");
    *(void **)&device_get_count = resolve("cuDeviceGetCount");
    *(void **)&device_get = resolve("cuDeviceGet");
    *(void **)&device_get_name = resolve("cuDeviceGetName");
    *(void **)&ctx_create = resolve("cuCtxCreate_v2");
    *(void **)&ctx_destroy = resolve("cuCtxDestroy_v2");
    *(void **)&mem_alloc = resolve("cuMemAlloc_v2");
    *(void **)&mem_free = resolve("cuMemFree_v2");
    *(void **)&memset_d8 = resolve("cuMemsetD8_v2");
    *(void **)&memcpy_dtoh = resolve("cuMemcpyDtoH_v2");
    stub = (const char *)dlsym(lib, "gpu_operator_stub_driver");
    if (dladdr(*(void **)&cu_init, &info) && info.dli_fname)
        printf("libcuda: %s%s%s\n", info.dli_fname, stub ? " -- " : "", stub ? stub : "");

    check(cu_init(0), "cuInit");
    printf("cuInit: ok\n");
    check(driver_get_version(&version), "cuDriverGetVersion");
    printf("cuDriverGetVersion: %d\n", version);
    check(device_get_count(&count), "cuDeviceGetCount");
    printf("cuDeviceGetCount: %d\n", count);
    if (count < 1) {
        printf("cuDeviceGetCount: no device\n");
        return 1;
    }
    check(device_get(&dev, 0), "cuDeviceGet");
    check(device_get_name(name, sizeof(name), dev), "cuDeviceGetName");
    printf("device 0: %s\n", name);
    check(ctx_create(&ctx, 0, dev), "cuCtxCreate_v2");
    printf("cuCtxCreate: ok\n");
    check(mem_alloc(&dptr, (size_t)bytes), "cuMemAlloc_v2");
    printf("cuMemAlloc %llu bytes: ok\n", bytes);
    check(memset_d8(dptr, 0xA5, (size_t)bytes), "cuMemsetD8_v2");
    printf("cuMemsetD8 0xa5: ok\n");
    host = malloc((size_t)bytes);
    if (!host) {
        printf("malloc %llu bytes (host buffer): out of memory\n", bytes);
        return 1;
    }
    memset(host, 0, (size_t)bytes);
    check(memcpy_dtoh(host, dptr, (size_t)bytes), "cuMemcpyDtoH_v2");
    printf("cuMemcpyDtoH: ok\n");
    for (i = 0; i < (size_t)bytes; i++) {
        if (host[i] != 0xA5) {
            printf("check: byte %zu is 0x%02x, not 0xa5\n", i, host[i]);
            return 1;
        }
    }
    printf("check: ok\n");
    free(host);
    check(mem_free(dptr), "cuMemFree_v2");
    check(ctx_destroy(ctx), "cuCtxDestroy_v2");
    printf("cuMemFree, cuCtxDestroy: ok\n");
    return 0;
}
