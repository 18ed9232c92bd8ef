/*
 * libcudart.so.13 stand-in: the CUDA runtime entry points gpusleuth probes,
 * with the real signatures (cudaLaunchKernel takes dim3 by value) and
 * versioned symbols (libcudart.map: cudaMalloc@@libcudart.so.13). Each call
 * goes to the driver stand-in like the real runtime does; calls the real
 * runtime serves without a probed driver entry point (memset, graph launch,
 * set device) make no driver call here either.
 */
#include <stdlib.h>
#include "cuda_sim.h"

#define EXPORT __attribute__((visibility("default"), noinline))

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
			CUstream s, void **params, void **extra);
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult cuCtxSynchronize(void);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuEventSynchronize(CUevent e);

/* CUDA_ERROR_OUT_OF_MEMORY (2) maps to cudaErrorMemoryAllocation (2); others pass through. */
static cudaError_t rt(CUresult r)
{
	return r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation : (cudaError_t)r;
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return rt(cuMemAlloc_v2((CUdeviceptr *)devPtr, size));
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
	return devPtr ? rt(cuMemFree_v2((CUdeviceptr)devPtr)) : cudaSuccess;
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	return rt(cuMemAllocManaged((CUdeviceptr *)devPtr, size, flags));
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return rt(cuMemAllocHost_v2(ptr, size));
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	(void)flags;
	return rt(cuMemAllocHost_v2(pHost, size));
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
	return ptr ? rt(cuMemFreeHost(ptr)) : cudaSuccess;
}

EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	return rt(cuMemHostRegister_v2(ptr, size, flags));
}

EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
	return rt(cuMemHostUnregister(ptr));
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
	return rt(cuMemAllocAsync((CUdeviceptr *)devPtr, size, stream));
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
	return devPtr ? rt(cuMemFreeAsync((CUdeviceptr)devPtr, stream)) : cudaSuccess;
}

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return rt(cuMemcpyHtoD_v2((CUdeviceptr)dst, src, count));
	case cudaMemcpyDeviceToHost:
		return rt(cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, count));
	case cudaMemcpyDeviceToDevice:
		return rt(cuMemcpyDtoD_v2((CUdeviceptr)dst, (CUdeviceptr)src, count));
	default:
		return rt(cuMemcpy((CUdeviceptr)dst, (CUdeviceptr)src, count));
	}
}

EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return rt(cuMemcpyHtoDAsync_v2((CUdeviceptr)dst, src, count, stream));
	case cudaMemcpyDeviceToHost:
		return rt(cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)src, count, stream));
	case cudaMemcpyDeviceToDevice:
		return rt(cuMemcpyDtoDAsync_v2((CUdeviceptr)dst, (CUdeviceptr)src, count, stream));
	default:
		return rt(cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, count, stream));
	}
}

EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	(void)value;
	return (devPtr || !count) ? cudaSuccess : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	(void)value, (void)stream;
	return (devPtr || !count) ? cudaSuccess : cudaErrorInvalidValue;
}

EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				    size_t sharedMem, cudaStream_t stream)
{
	return rt(cuLaunchKernel((CUfunction)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x,
				 blockDim.y, blockDim.z, (unsigned int)sharedMem, stream, args,
				 NULL));
}

EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	return rt(cuStreamSynchronize(stream));
}

EXPORT cudaError_t cudaDeviceSynchronize(void)
{
	return rt(cuCtxSynchronize());
}

EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	return rt(cuEventSynchronize(event));
}

EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	(void)stream;
	return graphExec ? cudaSuccess : cudaErrorInvalidValue;
}

/* Devices 0 .. SIM_DEVICE_COUNT-1 exist (env; default 1). */
EXPORT cudaError_t cudaSetDevice(int device)
{
	const char *env = getenv("SIM_DEVICE_COUNT");
	int count = env ? atoi(env) : 1;
	return device >= 0 && device < count ? cudaSuccess : 101 /* cudaErrorInvalidDevice */;
}
