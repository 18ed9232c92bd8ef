/*
 * Types and the control interface shared by the simulated CUDA libraries and
 * the workload. The CUDA types mirror the real headers' ABI (sizes, by-value
 * dim3, 64-bit device pointers) so the tracer sees real argument registers.
 */
#ifndef CUDA_SIM_H
#define CUDA_SIM_H
#include <stddef.h>
#include <stdint.h>

typedef int cudaError_t;
typedef int CUresult;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraphExec_t;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUfunction;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct {
	unsigned int x, y, z;
} dim3;

typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	void *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

#define cudaSuccess 0
#define cudaErrorMemoryAllocation 2
#define cudaErrorInvalidValue 1
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2

/* Allocator rule (mirrored by sleuth-sim's Rust API). */
#define SIM_DEVICE_BASE 0x7f0000000000ULL
#define SIM_HOST_BASE 0x7e0000000000ULL
#define SIM_VA_BASE 0x7d0000000000ULL
#define SIM_ALIGN 512ULL
#define SIM_DEFAULT_DEVICE_BYTES (80ULL << 30)

/*
 * Control functions of the driver stand-in (not CUDA; never probed).
 * simSetNextDurationNs: the next sync on this thread sleeps `ns` (blocks, like
 * a GPU wait); the next copy spins `ns` of thread CPU time (like a pageable copy).
 */
void simSetNextDurationNs(uint64_t ns);
/* simSetNextAwaitPath: the next sync on this thread blocks until `path` exists. */
void simSetNextAwaitPath(const char *path);
/* Driver-side ground truth: calls per entry point in this process. */
const char *simDriverOpName(int i); /* NULL past the end */
unsigned long long simDriverOpCount(int i);
void simDriverResetCounts(void);
#endif
