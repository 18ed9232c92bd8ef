/*
 * libcuda.so.1 stand-in: the CUDA driver entry points gpusleuth probes, with
 * the real signatures. Device pointers come from a deterministic bump
 * allocator (SIM_DEVICE_BASE, 512-byte aligned, never reused) and a device
 * memory limit (env SIM_DEVICE_BYTES) makes allocations beyond it fail with
 * CUDA_ERROR_OUT_OF_MEMORY. Syncs sleep and copies spin for a duration the
 * caller scripted with simSetNextDurationNs, so tests know the ground truth.
 *
 * With SIM_GPU_ACTIVITY=PATH the stand-in also tells the simulated NVML what
 * "the GPU" is doing, by appending lines to PATH (O_APPEND, one write each):
 *   mem PID DEVICE_BYTES        after every change of the process's device bytes
 *   busy PID START_US END_US    a scripted sync: the GPU is busy until it returns
 * (CLOCK_REALTIME microseconds, the clock NVML stamps its samples with).
 */
#define _GNU_SOURCE
#include "cuda_sim.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default"), noinline))

/* ------------------------------------------------------------ ground truth */

#define DRIVER_OPS(X)                                                                              \
	X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocManaged) X(cuMemAllocHost_v2) X(cuMemFreeHost) \
	X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemAddressReserve)             \
	X(cuMemAddressFree) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuLaunchKernel)                  \
	X(cuLaunchKernelEx) X(cuMemcpy) X(cuMemcpyAsync) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)     \
	X(cuMemcpyDtoD_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2)                          \
	X(cuMemcpyDtoDAsync_v2) X(cuCtxSynchronize) X(cuStreamSynchronize) X(cuEventSynchronize)    \
	X(cuMemHostRegister_v2) X(cuMemHostUnregister)

#define AS_ENUM(n) OP_##n,
#define AS_NAME(n) #n,
enum { DRIVER_OPS(AS_ENUM) OP_COUNT };
static const char *const op_names[OP_COUNT] = { DRIVER_OPS(AS_NAME) };
static unsigned long long op_counts[OP_COUNT];

#define COUNT(n) __atomic_fetch_add(&op_counts[OP_##n], 1, __ATOMIC_RELAXED)

EXPORT const char *simDriverOpName(int i)
{
	return (i >= 0 && i < OP_COUNT) ? op_names[i] : NULL;
}

EXPORT unsigned long long simDriverOpCount(int i)
{
	return (i >= 0 && i < OP_COUNT) ? __atomic_load_n(&op_counts[i], __ATOMIC_RELAXED) : 0;
}

EXPORT void simDriverResetCounts(void)
{
	for (int i = 0; i < OP_COUNT; i++)
		__atomic_store_n(&op_counts[i], 0, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------ scripted time */

static __thread uint64_t next_duration_ns;

EXPORT void simSetNextDurationNs(uint64_t ns)
{
	next_duration_ns = ns;
}

static __thread const char *next_await_path;

EXPORT void simSetNextAwaitPath(const char *path)
{
	next_await_path = path;
}

static uint64_t take_duration(void)
{
	uint64_t ns = next_duration_ns;
	next_duration_ns = 0;
	return ns;
}

/* ------------------------------------------------------------ activity for the simulated NVML */

static void activity_line(const char *line, int len)
{
	const char *path = getenv("SIM_GPU_ACTIVITY");
	if (!path || !*path || len <= 0)
		return;
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	ssize_t n = write(fd, line, (size_t)len);
	(void)n;
	close(fd);
}

static unsigned long long realtime_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

static void activity_mem(unsigned long long device_bytes)
{
	char line[96];
	int len = snprintf(line, sizeof line, "mem %d %llu\n", (int)getpid(), device_bytes);
	activity_line(line, len);
}

/* Written when the GPU work starts, with its known end, so a sample taken
 * while the sync still waits already sees it. */
static void activity_busy(uint64_t ns)
{
	char line[96];
	unsigned long long start = realtime_us();
	int len = snprintf(line, sizeof line, "busy %d %llu %llu\n", (int)getpid(), start,
			   start + (unsigned long long)(ns / 1000ULL));
	activity_line(line, len);
}

/* Blocks the thread (state S), like a driver waiting for the GPU: until the
 * path set by simSetNextAwaitPath exists, then for `ns`. */
static void block_for(uint64_t ns)
{
	const char *await_path = next_await_path;
	next_await_path = NULL;
	while (await_path && access(await_path, F_OK) != 0) {
		struct timespec ms = { .tv_sec = 0, .tv_nsec = 1000000 };
		nanosleep(&ms, NULL);
	}
	if (!ns)
		return;
	activity_busy(ns);
	struct timespec ts = { .tv_sec = ns / 1000000000ULL, .tv_nsec = ns % 1000000000ULL };
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
	}
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/*
 * Burns `ns` of this thread's CPU time (not wall time), like a pageable copy:
 * when another task shares the CPU the call takes longer in wall time, and the
 * extra is exactly the time spent runnable.
 */
static void spin_for(uint64_t ns)
{
	if (!ns)
		return;
	uint64_t end = thread_cpu_ns() + ns;
	while (thread_cpu_ns() < end) {
	}
}

/* ------------------------------------------------------------ memory */

#define MAX_LIVE 65536

struct live {
	unsigned long long ptr, size;
	int device; /* counts against the device limit */
};

static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_device = SIM_DEVICE_BASE, next_host = SIM_HOST_BASE,
			  next_va = SIM_VA_BASE;
static unsigned long long device_used, device_limit;
static struct live live[MAX_LIVE];
static int n_live;

static unsigned long long round_up(unsigned long long n)
{
	return (n + SIM_ALIGN - 1) & ~(SIM_ALIGN - 1);
}

static unsigned long long limit(void)
{
	if (!device_limit) {
		const char *env = getenv("SIM_DEVICE_BYTES");
		device_limit = env ? strtoull(env, NULL, 0) : 0;
		if (!device_limit)
			device_limit = SIM_DEFAULT_DEVICE_BYTES;
	}
	return device_limit;
}

/* Allocates from a bump region; device allocations obey the memory limit. */
static CUresult alloc(unsigned long long *region, int device, size_t size, unsigned long long *out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (size == 0) {
		*out = 0;
		return CUDA_SUCCESS;
	}
	CUresult r = CUDA_SUCCESS;
	unsigned long long used_now = 0;
	pthread_mutex_lock(&mem_lock);
	if (n_live >= MAX_LIVE || (device && (size > limit() || device_used > limit() - size))) {
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		*out = *region;
		*region += round_up(size);
		if (device)
			device_used += size;
		live[n_live++] = (struct live){ *out, size, device };
	}
	used_now = device_used;
	pthread_mutex_unlock(&mem_lock);
	if (r == CUDA_SUCCESS && device)
		activity_mem(used_now);
	return r;
}

static CUresult release(unsigned long long ptr)
{
	if (!ptr)
		return CUDA_SUCCESS;
	CUresult r = CUDA_ERROR_INVALID_VALUE;
	int was_device = 0;
	unsigned long long used_now;
	pthread_mutex_lock(&mem_lock);
	for (int i = n_live - 1; i >= 0; i--) {
		if (live[i].ptr == ptr) {
			was_device = live[i].device;
			if (live[i].device)
				device_used -= live[i].size;
			live[i] = live[--n_live];
			r = CUDA_SUCCESS;
			break;
		}
	}
	used_now = device_used;
	pthread_mutex_unlock(&mem_lock);
	if (was_device)
		activity_mem(used_now);
	return r;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	COUNT(cuMemAlloc_v2);
	return alloc(&next_device, 1, bytesize, dptr);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	COUNT(cuMemFree_v2);
	/* The real driver waits for the device before freeing: a scripted
	 * duration (`free NAME MS`) blocks like a sync; none by default. */
	block_for(take_duration());
	return release(dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	(void)flags;
	COUNT(cuMemAllocManaged);
	return alloc(&next_device, 1, bytesize, dptr);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	COUNT(cuMemAllocHost_v2);
	return alloc(&next_host, 0, bytesize, (unsigned long long *)pp);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
	COUNT(cuMemFreeHost);
	return release((unsigned long long)p);
}

/* Page-locking an existing host range: no memory moves, nothing to track. */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags)
{
	(void)flags;
	COUNT(cuMemHostRegister_v2);
	return (p && bytesize) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
	COUNT(cuMemHostUnregister);
	return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
	(void)stream;
	COUNT(cuMemAllocAsync);
	return alloc(&next_device, 1, bytesize, dptr);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	(void)stream;
	COUNT(cuMemFreeAsync);
	return release(dptr);
}

/* Virtual memory management: physical handles count against the device limit. */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
			    unsigned long long flags)
{
	(void)prop;
	(void)flags;
	COUNT(cuMemCreate);
	unsigned long long ptr;
	CUresult r = alloc(&next_device, 1, size, &ptr);
	if (r == CUDA_SUCCESS && handle)
		*handle = ptr; /* the handle is the backing range's address: unique */
	return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	COUNT(cuMemRelease);
	return release(handle);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				    CUdeviceptr addr, unsigned long long flags)
{
	(void)alignment;
	(void)addr;
	(void)flags;
	COUNT(cuMemAddressReserve);
	return alloc(&next_va, 0, size, ptr);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	(void)size;
	COUNT(cuMemAddressFree);
	return release(ptr);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	(void)offset;
	(void)flags;
	COUNT(cuMemMap);
	return (ptr && size && handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	COUNT(cuMemUnmap);
	return (ptr && size) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------ launches */

/*
 * A real launch costs the host a few microseconds in the driver (2-5 us on
 * an H200's host). The stand-in burns 4 us of the thread's CPU, so a loop of
 * launches is launch-bound by its own work, as a real one is, and not by the
 * tracer's traps alone (round 56: the verdicts take the traps out).
 */
#define SIM_LAUNCH_NS 4000ULL

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
			       unsigned int gridDimZ, unsigned int blockDimX,
			       unsigned int blockDimY, unsigned int blockDimZ,
			       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
			       void **extra)
{
	(void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY;
	(void)blockDimZ, (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
	COUNT(cuLaunchKernel);
	spin_for(SIM_LAUNCH_NS);
	return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
				 void **extra)
{
	(void)kernelParams, (void)extra;
	COUNT(cuLaunchKernelEx);
	spin_for(SIM_LAUNCH_NS);
	return (config && f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------ copies (spin) */

#define COPY(name, dst_t, src_t)                                                   \
	EXPORT CUresult name(dst_t dst, src_t src, size_t n)                       \
	{                                                                          \
		(void)dst, (void)src, (void)n;                                     \
		COUNT(name);                                                       \
		spin_for(take_duration());                                         \
		return CUDA_SUCCESS;                                               \
	}
#define COPY_ASYNC(name, dst_t, src_t)                                             \
	EXPORT CUresult name(dst_t dst, src_t src, size_t n, CUstream s)           \
	{                                                                          \
		(void)dst, (void)src, (void)n, (void)s;                            \
		COUNT(name);                                                       \
		spin_for(take_duration());                                         \
		return CUDA_SUCCESS;                                               \
	}

COPY(cuMemcpy, CUdeviceptr, CUdeviceptr)
COPY(cuMemcpyHtoD_v2, CUdeviceptr, const void *)
COPY(cuMemcpyDtoH_v2, void *, CUdeviceptr)
COPY(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyAsync, CUdeviceptr, CUdeviceptr)
COPY_ASYNC(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *)
COPY_ASYNC(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr)
COPY_ASYNC(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr)

/* ------------------------------------------------------------ syncs (sleep) */

EXPORT CUresult cuCtxSynchronize(void)
{
	COUNT(cuCtxSynchronize);
	block_for(take_duration());
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
	(void)hStream;
	COUNT(cuStreamSynchronize);
	block_for(take_duration());
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
	(void)hEvent;
	COUNT(cuEventSynchronize);
	block_for(take_duration());
	return CUDA_SUCCESS;
}
