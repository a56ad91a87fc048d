/* device.h - the --device flag: which backend runs the model. */
#ifndef DS_TOOL_DEVICE_H
#define DS_TOOL_DEVICE_H

#include <stdbool.h>

#include "backend/backend.h"

/* device: "cpu", "cuda" or "auto" (CUDA when this build has it and a GPU is
 * present, else the CPU). ref: the CPU's scalar reference kernels. */
ds_status tool_backend(const char *device, bool ref, const ds_ops **out);
/* Releases what the backend cached for a model that is being freed. */
void tool_backend_release(const ds_ops *ops);
/* Reports an error a backend recorded asynchronously (DS_OK if none). */
ds_status tool_backend_status(const ds_ops *ops);

#endif
