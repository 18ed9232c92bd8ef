/*
 * workload: runs a scripted scenario against the CUDA stand-ins, so tests know
 * the ground truth of what a tracer must see.
 *
 *   workload [--wait-file PATH] [--truth PATH] STEP [; STEP]...
 *
 * The script is every remaining argument joined by spaces; steps are separated
 * by ';' and blocks are written `{ ... }`. The step language is documented in
 * crates/sleuth-sim/src/lib.rs. With --truth, each process of the scenario
 * appends one JSON line with its own counts (runtime calls it made, driver
 * calls the driver stand-in served) and allocations, at exit.
 */
#define _GNU_SOURCE
#include "cuda_sim.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Runtime API (linked), reached through a table so `dlopen` can switch copies. */
cudaError_t cudaMalloc(void **, size_t);
cudaError_t cudaFree(void *);
cudaError_t cudaMallocManaged(void **, size_t, unsigned int);
cudaError_t cudaMallocHost(void **, size_t);
cudaError_t cudaHostAlloc(void **, size_t, unsigned int);
cudaError_t cudaFreeHost(void *);
cudaError_t cudaMallocAsync(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync(void *, cudaStream_t);
cudaError_t cudaMemcpy(void *, const void *, size_t, enum cudaMemcpyKind);
cudaError_t cudaMemcpyAsync(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t);
cudaError_t cudaMemset(void *, int, size_t);
cudaError_t cudaMemsetAsync(void *, int, size_t, cudaStream_t);
cudaError_t cudaLaunchKernel(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventSynchronize(cudaEvent_t);
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
cudaError_t cudaSetDevice(int);
cudaError_t cudaHostRegister(void *, size_t, unsigned int);
cudaError_t cudaHostUnregister(void *);
/* Driver API used directly by some steps. */
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
			unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const void *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);

#define RT_OPS(X)                                                                                  \
	X(cudaMalloc) X(cudaFree) X(cudaMallocManaged) X(cudaMallocHost) X(cudaHostAlloc)          \
	X(cudaFreeHost) X(cudaMallocAsync) X(cudaFreeAsync) X(cudaMemcpy) X(cudaMemcpyAsync)       \
	X(cudaMemset) X(cudaMemsetAsync) X(cudaLaunchKernel) X(cudaStreamSynchronize)              \
	X(cudaDeviceSynchronize) X(cudaEventSynchronize) X(cudaGraphLaunch) X(cudaSetDevice)      \
	X(cudaHostRegister) X(cudaHostUnregister)

#define AS_ENUM(n) RT_##n,
#define AS_NAME(n) #n,
#define AS_FIELD(n) __typeof__(&n) n;
#define AS_LINKED(n) .n = n,
enum { RT_OPS(AS_ENUM) RT_COUNT };
static const char *const rt_names[RT_COUNT] = { RT_OPS(AS_NAME) };
static unsigned long long rt_counts[RT_COUNT];
static struct {
	RT_OPS(AS_FIELD)
} api = { RT_OPS(AS_LINKED) };

/* Counts a runtime call, then makes it through the current runtime copy. */
#define RT(n, ...) (rt_counts[RT_##n]++, api.n(__VA_ARGS__))

static void die(const char *fmt, const char *arg)
{
	fprintf(stderr, "workload: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(120);
}

/* ------------------------------------------------------------ ground truth */

#define MAX_ALLOCS 1024
struct alloc_rec {
	const char *op;
	unsigned long long size, ptr;
	int ret;
};
static struct alloc_rec allocs[MAX_ALLOCS];
static int n_allocs;
static unsigned long long allocs_dropped;
static const char *truth_path;
static const char *self_argv0 = "workload";

static void note_alloc(const char *op, unsigned long long size, unsigned long long ptr, int ret)
{
	if (n_allocs < MAX_ALLOCS)
		allocs[n_allocs++] = (struct alloc_rec){ op, size, ret == 0 ? ptr : 0, ret };
	else
		allocs_dropped++;
}

#define MAX_NAMES 256
static struct {
	char name[32];
	unsigned long long ptr;
} names[MAX_NAMES];
static int n_names;

static void name_ptr(const char *name, unsigned long long ptr)
{
	if (!name)
		return;
	for (int i = 0; i < n_names; i++)
		if (!strcmp(names[i].name, name)) {
			names[i].ptr = ptr;
			return;
		}
	if (n_names == MAX_NAMES)
		die("too many named pointers (%s)", name);
	snprintf(names[n_names].name, sizeof(names[n_names].name), "%s", name);
	names[n_names++].ptr = ptr;
}

static unsigned long long named(const char *name)
{
	for (int i = 0; i < n_names; i++)
		if (!strcmp(names[i].name, name))
			return names[i].ptr;
	die("unknown pointer name '%s'", name);
	return 0;
}

static void reset_truth(void)
{
	memset(rt_counts, 0, sizeof(rt_counts));
	simDriverResetCounts();
	n_allocs = 0;
	allocs_dropped = 0;
}

/* Appends this process's JSON line to the truth file in one write. */
static void write_truth(int exit_code)
{
	if (!truth_path)
		return;
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	if (!buf)
		return;
#define OUT(...) len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, __VA_ARGS__)
	OUT("{\"pid\":%d,\"ppid\":%d,\"exit_code\":%d,\"runtime\":{", getpid(), getppid(), exit_code);
	int first = 1;
	for (int i = 0; i < RT_COUNT; i++)
		if (rt_counts[i]) {
			OUT("%s\"%s\":%llu", first ? "" : ",", rt_names[i], rt_counts[i]);
			first = 0;
		}
	OUT("},\"driver\":{");
	first = 1;
	for (int i = 0; simDriverOpName(i); i++)
		if (simDriverOpCount(i)) {
			OUT("%s\"%s\":%llu", first ? "" : ",", simDriverOpName(i), simDriverOpCount(i));
			first = 0;
		}
	OUT("},\"allocs\":[");
	for (int i = 0; i < n_allocs; i++)
		OUT("%s{\"op\":\"%s\",\"size\":%llu,\"ptr\":%llu,\"ret\":%d}", i ? "," : "",
		    allocs[i].op, allocs[i].size, allocs[i].ptr, allocs[i].ret);
	OUT("],\"allocs_dropped\":%llu}\n", allocs_dropped);
#undef OUT
	if (len < cap) {
		int fd = open(truth_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0) {
			ssize_t w = write(fd, buf, len);
			(void)w;
			close(fd);
		}
	}
	free(buf);
}

static void finish(int code)
{
	write_truth(code);
	fflush(NULL);
	exit(code);
}

/* ------------------------------------------------------------ helpers */

static unsigned long long num(const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (*end == 'e' || *end == 'E' || *end == '.') {
		double d = strtod(s, &end);
		v = (unsigned long long)d;
	}
	if (errno || *end || end == s)
		die("not a number: '%s'", s);
	return v;
}

static void sleep_ms(unsigned long long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
	}
}

static void wait_for_file(const char *path)
{
	struct stat st;
	while (stat(path, &st) != 0) {
		struct timespec ts = { 0, 1000000L };
		nanosleep(&ts, NULL);
	}
}

static void touch(const char *path)
{
	int fd = open(path, O_CREAT | O_WRONLY, 0644);
	if (fd < 0)
		die("cannot create '%s'", path);
	close(fd);
}

static enum cudaMemcpyKind kind_of(const char *s)
{
	if (!s || !strcmp(s, "h2d"))
		return cudaMemcpyHostToDevice;
	if (!strcmp(s, "d2h"))
		return cudaMemcpyDeviceToHost;
	if (!strcmp(s, "d2d"))
		return cudaMemcpyDeviceToDevice;
	if (!strcmp(s, "h2h"))
		return cudaMemcpyHostToHost;
	if (!strcmp(s, "default"))
		return cudaMemcpyDefault;
	die("unknown copy kind '%s' (h2d, d2h, d2d, h2h, default)", s);
	return cudaMemcpyDefault;
}

static void use_runtime_copy(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die("dlopen failed: %s", dlerror());
#define AS_DLSYM(n)                                                                                \
	*(void **)&api.n = dlsym(h, #n);                                                           \
	if (!api.n)                                                                                \
		die("symbol missing in the runtime copy: %s", #n);
	RT_OPS(AS_DLSYM)
#undef AS_DLSYM
}

/* PyTorch caching-allocator stand-in (libc10_cuda.so beside the runtime, via
 * the rpath), loaded by the first torch step so other scripts never map it. */
static struct {
	void *(*malloc)(unsigned long);
	void (*free)(void *);
	void (*empty_cache)(void);
} torch_api;

static void load_torch(void)
{
	if (torch_api.malloc)
		return;
	void *h = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die("cannot load the allocator stand-in: %s", dlerror());
	*(void **)&torch_api.malloc = dlsym(h, "simTorchMalloc");
	*(void **)&torch_api.free = dlsym(h, "simTorchFree");
	*(void **)&torch_api.empty_cache = dlsym(h, "simTorchEmptyCache");
	if (!torch_api.malloc || !torch_api.free || !torch_api.empty_cache)
		die("%s", "libc10_cuda.so lacks simTorchMalloc/simTorchFree/simTorchEmptyCache");
}

static void *pong(void *arg)
{
	int *fds = arg; /* fds[0]: read ping, fds[1]: write pong */
	char c;
	while (read(fds[0], &c, 1) == 1 && c == 'p')
		if (write(fds[1], &c, 1) != 1)
			break;
	return NULL;
}

/* N round trips between two threads over pipes: 2N voluntary context switches. */
static void pingpong(unsigned long long n)
{
	int ping[2], back[2];
	if (pipe(ping) || pipe(back))
		die("%s", "pipe failed");
	int fds[2] = { ping[0], back[1] };
	pthread_t t;
	pthread_create(&t, NULL, pong, fds);
	char c = 'p';
	for (unsigned long long i = 0; i < n; i++)
		if (write(ping[1], &c, 1) != 1 || read(back[0], &c, 1) != 1)
			die("%s", "pingpong pipe broke");
	c = 'q';
	if (write(ping[1], &c, 1) != 1)
		die("%s", "pingpong pipe broke");
	pthread_join(t, NULL);
	close(ping[0]), close(ping[1]), close(back[0]), close(back[1]);
}

/* Burns `ms` of this thread's CPU time outside any CUDA call (host compute). */
static void compute_ms(unsigned long long ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	unsigned long long end = (unsigned long long)ts.tv_sec * 1000000000ULL +
				 (unsigned long long)ts.tv_nsec + ms * 1000000ULL;
	for (;;) {
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
		if ((unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec >= end)
			break;
	}
}

/* Loader threads (like DataLoader workers): each builds `items` batches of
 * `ms` CPU time and hands each over through one pipe the main thread reads. */
static int loader_pipe[2] = { -1, -1 };
struct loader_arg {
	unsigned long long ms, items;
};

static void *loader(void *arg)
{
	struct loader_arg *la = arg;
	prctl(PR_SET_NAME, "gs-loader", 0, 0, 0);
	char c = 'b';
	for (unsigned long long i = 0; i < la->items; i++) {
		compute_ms(la->ms);
		if (write(loader_pipe[1], &c, 1) != 1)
			break;
	}
	return NULL;
}

static void start_loaders(unsigned long long k, unsigned long long ms, unsigned long long items)
{
	if (loader_pipe[0] < 0 && pipe(loader_pipe))
		die("%s", "pipe failed");
	for (unsigned long long i = 0; i < k; i++) {
		struct loader_arg *la = malloc(sizeof(*la));
		if (!la)
			die("%s", "out of memory");
		*la = (struct loader_arg){ ms, items };
		pthread_t t;
		if (pthread_create(&t, NULL, loader, la))
			die("%s", "pthread_create failed");
		pthread_detach(t);
	}
}

/* ------------------------------------------------------------ the script */

#define MAX_TOKENS 4096
static char *tok[MAX_TOKENS];
static int n_tok;

/* Splits the script into words; ';', '{' and '}' are words of their own. */
static void tokenize(char *s)
{
	while (*s) {
		if (*s == ' ' || *s == '\t' || *s == '\n') {
			*s++ = 0;
			continue;
		}
		if (n_tok == MAX_TOKENS)
			die("%s", "script too long");
		if (*s == ';' || *s == '{' || *s == '}') {
			static char punct[3][2] = { ";", "{", "}" };
			tok[n_tok++] = punct[*s == ';' ? 0 : *s == '{' ? 1 : 2];
			*s++ = 0;
			continue;
		}
		tok[n_tok++] = s;
		while (*s && !strchr(" \t\n;{}", *s))
			s++;
	}
}

/* Index of the '}' closing the '{' at `open`. */
static int block_end(int open, int end)
{
	int depth = 0;
	for (int i = open; i < end; i++) {
		if (!strcmp(tok[i], "{"))
			depth++;
		else if (!strcmp(tok[i], "}") && --depth == 0)
			return i;
	}
	die("%s", "unbalanced '{'");
	return -1;
}

static void run(int begin, int end);

static void fork_block(int b, int e, int exec_self)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		die("%s", "fork failed");
	if (pid == 0) {
		if (exec_self) {
			size_t cap = 1, len = 0;
			for (int i = b; i < e; i++)
				cap += strlen(tok[i]) + 1;
			char *script = calloc(1, cap);
			for (int i = b; i < e; i++)
				len += (size_t)sprintf(script + len, "%s ", tok[i]);
			char *argv[] = { (char *)self_argv0, "--truth", (char *)truth_path, script, NULL };
			if (!truth_path)
				argv[1] = script, argv[2] = NULL;
			execv("/proc/self/exe", argv);
			die("%s", "exec of itself failed");
		}
		reset_truth();
		run(b, e);
		finish(0);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
	}
}

static dim3 d3(unsigned x)
{
	return (dim3){ x, 1, 1 };
}

/* Runs one step: words [b, e) (a step's block, if any, is [blk_b, blk_e)). */
static void step(int b, int e, int blk_b, int blk_e)
{
	const char *s = tok[b];
	int argc = e - b - 1;
	char **a = &tok[b + 1];
#define NEED(n)                                                                                    \
	if (argc < (n))                                                                            \
		die("step '%s' needs more arguments", s);
#define ARG(i) (argc > (i) ? a[i] : NULL)
	static const void *kernel = (const void *)0x5000; /* a fake kernel handle */
	void *p = NULL;
	int r;

	if (!strcmp(s, "malloc") || !strcmp(s, "malloc_managed") || !strcmp(s, "malloc_host") ||
	    !strcmp(s, "host_alloc") || !strcmp(s, "malloc_async")) {
		NEED(1);
		unsigned long long size = num(a[0]);
		const char *op;
		if (!strcmp(s, "malloc"))
			op = "cudaMalloc", r = RT(cudaMalloc, &p, size);
		else if (!strcmp(s, "malloc_managed"))
			op = "cudaMallocManaged", r = RT(cudaMallocManaged, &p, size, 1);
		else if (!strcmp(s, "malloc_host"))
			op = "cudaMallocHost", r = RT(cudaMallocHost, &p, size);
		else if (!strcmp(s, "host_alloc"))
			op = "cudaHostAlloc", r = RT(cudaHostAlloc, &p, size, 0);
		else
			op = "cudaMallocAsync", r = RT(cudaMallocAsync, &p, size, NULL);
		note_alloc(op, size, (unsigned long long)p, r);
		name_ptr(ARG(1), r == 0 ? (unsigned long long)p : 0);
	} else if (!strcmp(s, "cu_malloc")) {
		NEED(1);
		CUdeviceptr d = 0;
		r = cuMemAlloc_v2(&d, num(a[0]));
		note_alloc("cuMemAlloc_v2", num(a[0]), d, r);
		name_ptr(ARG(1), r == 0 ? d : 0);
	} else if (!strcmp(s, "free")) {
		NEED(1);
		/* A real cudaFree synchronizes the device: MS scripts that wait. */
		if (ARG(1))
			simSetNextDurationNs(num(a[1]) * 1000000ULL);
		RT(cudaFree, (void *)named(a[0]));
	} else if (!strcmp(s, "free_host")) {
		NEED(1);
		RT(cudaFreeHost, (void *)named(a[0]));
	} else if (!strcmp(s, "free_async")) {
		NEED(1);
		RT(cudaFreeAsync, (void *)named(a[0]), NULL);
	} else if (!strcmp(s, "cu_free")) {
		NEED(1);
		cuMemFree_v2(named(a[0]));
	} else if (!strcmp(s, "torch_malloc")) {
		NEED(1);
		load_torch();
		void *block = torch_api.malloc(num(a[0]));
		name_ptr(ARG(1), (unsigned long long)block);
	} else if (!strcmp(s, "torch_free")) {
		NEED(1);
		load_torch();
		torch_api.free((void *)named(a[0]));
	} else if (!strcmp(s, "torch_empty_cache")) {
		load_torch();
		torch_api.empty_cache();
	} else if (!strcmp(s, "vmm")) {
		NEED(1);
		unsigned long long size = num(a[0]);
		CUdeviceptr va = 0;
		CUmemGenericAllocationHandle h = 0;
		r = cuMemAddressReserve(&va, size, 0, 0, 0);
		note_alloc("cuMemAddressReserve", size, va, r);
		r = cuMemCreate(&h, size, NULL, 0);
		note_alloc("cuMemCreate", size, h, r);
		cuMemMap(va, size, 0, h, 0);
		cuMemUnmap(va, size);
		cuMemRelease(h);
		cuMemAddressFree(va, size);
	} else if (!strcmp(s, "memcpy") || !strcmp(s, "memcpy_async")) {
		NEED(1);
		size_t n = num(a[0]);
		void *dst = (void *)SIM_DEVICE_BASE, *src = (void *)SIM_HOST_BASE;
		if (!strcmp(s, "memcpy"))
			RT(cudaMemcpy, dst, src, n, kind_of(ARG(1)));
		else
			RT(cudaMemcpyAsync, dst, src, n, kind_of(ARG(1)), NULL);
	} else if (!strcmp(s, "memset")) {
		NEED(1);
		RT(cudaMemset, (void *)SIM_DEVICE_BASE, 0, num(a[0]));
	} else if (!strcmp(s, "memset_async")) {
		NEED(1);
		RT(cudaMemsetAsync, (void *)SIM_DEVICE_BASE, 0, num(a[0]), NULL);
	} else if (!strcmp(s, "launch")) {
		unsigned long long n = argc ? num(a[0]) : 1;
		for (unsigned long long i = 0; i < n; i++)
			RT(cudaLaunchKernel, kernel, d3(1), d3(32), NULL, 0, NULL);
	} else if (!strcmp(s, "cu_launch")) {
		unsigned long long n = argc ? num(a[0]) : 1;
		for (unsigned long long i = 0; i < n; i++)
			cuLaunchKernel((CUfunction)kernel, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
	} else if (!strcmp(s, "launch_ex")) {
		unsigned long long n = argc ? num(a[0]) : 1;
		CUlaunchConfig cfg = { 1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0 };
		for (unsigned long long i = 0; i < n; i++)
			cuLaunchKernelEx(&cfg, (CUfunction)kernel, NULL, NULL);
	} else if (!strcmp(s, "sync_stream")) {
		RT(cudaStreamSynchronize, NULL);
	} else if (!strcmp(s, "sync_device")) {
		RT(cudaDeviceSynchronize);
	} else if (!strcmp(s, "sync_event")) {
		RT(cudaEventSynchronize, (cudaEvent_t)0x6000);
	} else if (!strcmp(s, "graph_launch")) {
		RT(cudaGraphLaunch, (cudaGraphExec_t)0x7000, NULL);
	} else if (!strcmp(s, "set_device")) {
		RT(cudaSetDevice, argc ? (int)num(a[0]) : 0);
	} else if (!strcmp(s, "sync_sleep")) {
		NEED(1);
		simSetNextDurationNs(num(a[0]) * 1000000ULL);
		const char *which = ARG(1) ? ARG(1) : "stream";
		if (!strcmp(which, "stream"))
			RT(cudaStreamSynchronize, NULL);
		else if (!strcmp(which, "device"))
			RT(cudaDeviceSynchronize);
		else if (!strcmp(which, "event"))
			RT(cudaEventSynchronize, (cudaEvent_t)0x6000);
		else
			die("sync_sleep: unknown sync '%s' (stream, device, event)", which);
	} else if (!strcmp(s, "sync_until")) {
		NEED(1);
		simSetNextAwaitPath(a[0]);
		RT(cudaStreamSynchronize, NULL);
	} else if (!strcmp(s, "spin")) {
		NEED(1);
		simSetNextDurationNs(num(a[0]) * 1000000ULL);
		RT(cudaMemcpy, (void *)SIM_DEVICE_BASE, (void *)SIM_HOST_BASE,
		   ARG(1) ? num(a[1]) : 4096, cudaMemcpyHostToDevice);
	} else if (!strcmp(s, "compute")) {
		NEED(1);
		compute_ms(num(a[0]));
	} else if (!strcmp(s, "h2d")) {
		NEED(2);
		size_t n = num(a[0]);
		static char *pageable;
		static size_t pageable_len;
		void *src;
		if (ARG(2)) {
			src = (void *)named(a[2]);
		} else {
			if (pageable_len < n) {
				free(pageable);
				pageable = calloc(1, n);
				if (!pageable)
					die("%s", "out of memory");
				pageable_len = n;
			}
			src = pageable;
		}
		simSetNextDurationNs(num(a[1]) * 1000000ULL);
		RT(cudaMemcpy, (void *)SIM_DEVICE_BASE, src, n, cudaMemcpyHostToDevice);
	} else if (!strcmp(s, "host_register")) {
		NEED(2);
		size_t n = num(a[0]);
		void *buf = calloc(1, n);
		if (!buf)
			die("%s", "out of memory");
		RT(cudaHostRegister, buf, n, 0);
		name_ptr(a[1], (unsigned long long)buf);
	} else if (!strcmp(s, "loaders")) {
		NEED(3);
		start_loaders(num(a[0]), num(a[1]), num(a[2]));
	} else if (!strcmp(s, "next_batch")) {
		char c;
		if (loader_pipe[0] < 0)
			die("%s", "next_batch before loaders");
		if (read(loader_pipe[0], &c, 1) != 1)
			die("%s", "loader pipe closed");
	} else if (!strcmp(s, "churn")) {
		NEED(1);
		unsigned long long n = num(a[0]);
		for (unsigned long long i = 0; i < n; i++) {
			r = RT(cudaMalloc, &p, 256);
			note_alloc("cudaMalloc", 256, (unsigned long long)p, r);
			RT(cudaFree, p);
		}
	} else if (!strcmp(s, "pingpong")) {
		NEED(1);
		pingpong(num(a[0]));
	} else if (!strcmp(s, "sleep")) {
		NEED(1);
		sleep_ms(num(a[0]));
	} else if (!strcmp(s, "pin")) {
		NEED(1);
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET((int)num(a[0]), &set);
		if (sched_setaffinity(0, sizeof(set), &set))
			die("cannot pin to CPU %s", a[0]);
	} else if (!strcmp(s, "await")) {
		NEED(1);
		wait_for_file(a[0]);
	} else if (!strcmp(s, "stamp")) {
		NEED(1);
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		FILE *f = fopen(a[0], "a");
		if (!f)
			die("cannot open '%s'", a[0]);
		fprintf(f, "%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
		fclose(f);
	} else if (!strcmp(s, "touch")) {
		NEED(1);
		touch(a[0]);
	} else if (!strcmp(s, "dlopen")) {
		NEED(1);
		use_runtime_copy(a[0]);
	} else if (!strcmp(s, "exit")) {
		finish(argc ? (int)num(a[0]) : 0);
	} else if (!strcmp(s, "repeat")) {
		NEED(1);
		if (blk_b < 0)
			die("%s", "repeat needs a { block }");
		for (unsigned long long i = num(a[0]); i > 0; i--)
			run(blk_b, blk_e);
	} else if (!strcmp(s, "fork") || !strcmp(s, "spawn")) {
		if (blk_b < 0)
			die("%s needs a { block }", s);
		fork_block(blk_b, blk_e, !strcmp(s, "spawn"));
	} else {
		die("unknown step '%s'", s);
	}
#undef NEED
#undef ARG
}

static void run(int begin, int end)
{
	int i = begin;
	while (i < end) {
		if (!strcmp(tok[i], ";")) {
			i++;
			continue;
		}
		int j = i;
		while (j < end && strcmp(tok[j], ";") && strcmp(tok[j], "{"))
			j++;
		if (j < end && !strcmp(tok[j], "{")) {
			int close = block_end(j, end);
			step(i, j, j + 1, close);
			i = close + 1;
		} else {
			step(i, j, -1, -1);
			i = j;
		}
	}
}

int main(int argc, char **argv)
{
	int i = 1;
	const char *wait_file = NULL;
	self_argv0 = argv[0];
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--wait-file") && i + 1 < argc)
			wait_file = argv[++i];
		else if (!strcmp(argv[i], "--truth") && i + 1 < argc)
			truth_path = argv[++i];
		else
			break;
	}
	size_t cap = 1;
	for (int k = i; k < argc; k++)
		cap += strlen(argv[k]) + 1;
	char *script = calloc(1, cap);
	for (int k = i; k < argc; k++) {
		strcat(script, argv[k]);
		strcat(script, " ");
	}
	tokenize(script);
	if (wait_file)
		wait_for_file(wait_file);
	run(0, n_tok);
	finish(0);
}
