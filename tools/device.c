/* device.c - maps --device and --ref-kernels to a backend (backend/registry.h). */
#include "device.h"

#include "backend/registry.h"

ds_status tool_backend(const char *device, bool ref, const ds_ops **out)
{
    ds_backend_opts o = backend_default_opts();
    o.device = device;
    if (ref) o.cpu.isa = CPU_ISA_SCALAR;
    return backend_open(&o, out);
}

void tool_backend_release(const ds_ops *ops) { backend_release(ops); }

ds_status tool_backend_status(const ds_ops *ops) { return backend_status(ops); }
