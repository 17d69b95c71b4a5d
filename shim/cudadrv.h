/*
 * cudadrv.h — the subset of the CUDA driver API that libmigswap.so, the fake
 * libcuda.so and the shim's test programs use, declared from the public driver
 * API documentation. No CUDA headers are needed to build anything in shim/.
 *
 * Handles are opaque pointers; CUresult is an int; CUdeviceptr is 64 bits.
 * Struct layouts that cross the ABI (CUmemAllocationProp, CUmemAccessDesc,
 * CUlaunchConfig, CUDA_KERNEL_NODE_PARAMS) follow the documented layouts.
 */
#ifndef MIGSWAP_CUDADRV_H
#define MIGSWAP_CUDADRV_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

/* cuGetProcAddress flags */
enum {
	CU_GET_PROC_ADDRESS_DEFAULT = 0,
	CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
	CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
};

/* VMM */
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 };

typedef struct {
	int type;
	int id;
} CUmemLocation;

typedef struct {
	int type;
	int requestedHandleTypes;
	CUmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CUmemAllocationProp;

typedef struct {
	CUmemLocation location;
	int flags;
} CUmemAccessDesc;

typedef struct {
	char reserved[64];
} CUipcMemHandle;

typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct {
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned int numAttrs;
} CUlaunchConfig;

typedef struct {
	CUfunction func;
	unsigned int gridDimX, gridDimY, gridDimZ;
	unsigned int blockDimX, blockDimY, blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
} CUDA_KERNEL_NODE_PARAMS;

/* Opaque to us: passed through untouched. */
typedef struct CUDA_MEMCPY2D_st CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;

enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_MEMHOSTALLOC_PORTABLE = 1 };
enum { CU_EVENT_DISABLE_TIMING = 2 };

#endif
