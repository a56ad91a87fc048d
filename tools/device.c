/* device.c - maps --device to a backend operation table. */
#include "device.h"

#include <string.h>

#ifdef DSV3_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

ds_status tool_backend(const char *device, bool ref, const ds_ops **out)
{
    if (!strcmp(device, "cpu")) {
        *out = cpu_backend(!ref);
        return DS_OK;
    }
    if (strcmp(device, "cuda") && strcmp(device, "auto"))
        return ds_errorf(DS_ERR_ARG, "--device must be cpu, cuda or auto, not '%s'", device);
#ifdef DSV3_CUDA
    if (!ref && cuda_device_count() > 0) {
        const ds_ops *o = cuda_backend();
        if (o) {
            *out = o;
            return DS_OK;
        }
        if (!strcmp(device, "cuda")) return DS_ERR_UNSUPPORTED; /* cuda_backend() set the message */
    }
    if (!strcmp(device, "cuda"))
        return ds_errorf(DS_ERR_UNSUPPORTED, ref ? "--ref-kernels runs on the CPU only" : "--device cuda: no CUDA device found");
#else
    if (!strcmp(device, "cuda"))
        return ds_errorf(DS_ERR_UNSUPPORTED, "--device cuda: this build has no CUDA backend (configure with -DDSV3_CUDA=ON)");
#endif
    *out = cpu_backend(!ref);
    return DS_OK;
}

void tool_backend_release(const ds_ops *ops)
{
#ifdef DSV3_CUDA
    if (ops && !strcmp(ops->name, "cuda")) cuda_forget_weights();
#else
    (void)ops;
#endif
}

ds_status tool_backend_status(const ds_ops *ops)
{
#ifdef DSV3_CUDA
    if (ops && !strcmp(ops->name, "cuda")) return cuda_backend_status();
#else
    (void)ops;
#endif
    return DS_OK;
}
