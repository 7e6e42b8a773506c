/*
 * A link stub for the CUDA driver API (libcuda.so.1) for machines without a GPU.
 *
 * `cust` links `-lcuda`; with this stub as that library, test binaries built with the
 * `cuda` feature link and run on a machine without CUDA: every entry point returns
 * CUDA_ERROR_NO_DEVICE (100), so the backend's constructor reports "no CUDA device" and
 * the tests print SKIPPED. cuGetErrorString / cuGetErrorName write a valid static
 * string (cust formats errors through them). On a GPU machine the driver's real
 * libcuda.so.1 is found first, as long as this directory is not on LD_LIBRARY_PATH.
 *
 * Every function takes no declared parameters: on the x86-64 and AArch64 C ABIs a callee
 * that ignores its arguments is compatible with any caller. Built by `cargo xtask
 * cuda-stub`; the list is the set of cu* symbols cust 0.3 and andrea-cuda reference.
 */
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_NOT_SUPPORTED 801

/* With -DANDREA_CUDA_EMU this file is the rest of `cargo xtask cuda-emu`'s emulator
 * (xtask/cuda-emu/emu_runtime.cpp implements the calls andrea-cuda makes; the others
 * return CUDA_ERROR_NOT_SUPPORTED there). */
#ifdef ANDREA_CUDA_EMU
#define STUB_RESULT CUDA_ERROR_NOT_SUPPORTED
#else
#define STUB_RESULT CUDA_ERROR_NO_DEVICE
#endif

#define STUB(name) \
    int name() { return STUB_RESULT; }

#ifndef ANDREA_CUDA_EMU
int cuGetErrorString(int error, const char **str) {
    (void)error;
    if (str) *str = "no CUDA device (andrea's libcuda link stub is loaded, not a real driver)";
    return 0;
}

int cuGetErrorName(int error, const char **str) {
    (void)error;
    if (str) *str = "CUDA_ERROR_NO_DEVICE";
    return 0;
}

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuDeviceGet)
STUB(cuDeviceGetAttribute)
STUB(cuDeviceGetCount)
STUB(cuDeviceGetName)
STUB(cuDeviceTotalMem_v2)
STUB(cuDevicePrimaryCtxRelease_v2)
STUB(cuDevicePrimaryCtxRetain)
STUB(cuCtxGetCurrent)
STUB(cuCtxSetCurrent)
STUB(cuCtxSynchronize)
STUB(cuLaunchKernel)
STUB(cuMemAlloc_v2)
STUB(cuMemFree_v2)
STUB(cuMemGetInfo_v2)
STUB(cuMemcpyDtoHAsync_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuMemcpyHtoDAsync_v2)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemAllocHost_v2)
STUB(cuMemFreeHost)
STUB(cuMemsetD32Async)
STUB(cuMemsetD32_v2)
STUB(cuMemsetD8_v2)
STUB(cuFuncGetAttribute)
STUB(cuFuncSetAttribute)
STUB(cuModuleGetFunction)
STUB(cuModuleLoadDataEx)
STUB(cuModuleUnload)
STUB(cuStreamCreateWithPriority)
STUB(cuStreamDestroy_v2)
STUB(cuStreamSynchronize)
#endif /* ANDREA_CUDA_EMU */

STUB(cuDevicePrimaryCtxReset_v2)
STUB(cuDevicePrimaryCtxSetFlags_v2)
STUB(cuCtxCreate_v2)
STUB(cuCtxDestroy_v2)
STUB(cuCtxGetApiVersion)
STUB(cuCtxGetCacheConfig)
STUB(cuCtxGetDevice)
STUB(cuCtxGetFlags)
STUB(cuCtxGetLimit)
STUB(cuCtxGetSharedMemConfig)
STUB(cuCtxGetStreamPriorityRange)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuCtxSetCacheConfig)
STUB(cuCtxSetLimit)
STUB(cuCtxSetSharedMemConfig)
STUB(cuArray3DCreate_v2)
STUB(cuArray3DGetDescriptor_v2)
STUB(cuArrayDestroy)
STUB(cuDestroyExternalMemory)
STUB(cuEventCreate)
STUB(cuEventDestroy_v2)
STUB(cuEventElapsedTime)
STUB(cuEventQuery)
STUB(cuEventRecord)
STUB(cuEventSynchronize)
STUB(cuExternalMemoryGetMappedBuffer)
STUB(cuFuncSetCacheConfig)
STUB(cuFuncSetSharedMemConfig)
STUB(cuGraphAddKernelNode)
STUB(cuGraphCreate)
STUB(cuGraphDebugDotPrint)
STUB(cuGraphDestroy)
STUB(cuGraphGetEdges)
STUB(cuGraphGetNodes)
STUB(cuGraphKernelNodeGetParams)
STUB(cuGraphNodeGetType)
STUB(cuImportExternalMemory)
STUB(cuLaunchHostFunc)
STUB(cuLinkAddData_v2)
STUB(cuLinkComplete)
STUB(cuLinkCreate_v2)
STUB(cuLinkDestroy)
STUB(cuMemAdvise)
STUB(cuMemAllocAsync)
STUB(cuMemAllocManaged)
STUB(cuMemAllocPitch)
STUB(cuMemFreeAsync)
STUB(cuMemPrefetchAsync)
STUB(cuMemcpy2D_v2)
STUB(cuMemcpyAtoH_v2)
STUB(cuMemcpyDtoDAsync_v2)
STUB(cuMemcpyDtoD_v2)
STUB(cuMemcpyHtoA_v2)
STUB(cuMemsetD16Async)
STUB(cuMemsetD16_v2)
STUB(cuMemsetD8Async)
STUB(cuModuleGetGlobal_v2)
STUB(cuModuleLoad)
STUB(cuModuleLoadData)
STUB(cuOccupancyAvailableDynamicSMemPerBlock)
STUB(cuOccupancyMaxActiveBlocksPerMultiprocessor)
STUB(cuOccupancyMaxPotentialBlockSize)
STUB(cuStreamCreate)
STUB(cuStreamGetFlags)
STUB(cuStreamGetPriority)
STUB(cuStreamWaitEvent)
STUB(cuSurfObjectCreate)
STUB(cuSurfObjectDestroy)
STUB(cuSurfObjectGetResourceDesc)
STUB(cuTexObjectCreate)
STUB(cuTexObjectDestroy)
STUB(cuTexObjectGetResourceDesc)
STUB(cuTexObjectGetResourceViewDesc)
