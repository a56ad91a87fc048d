/* cpu.c - picks the CPU backend's operations: the scalar reference, or the
 * fast kernels where they exist and the CPU supports them. */
#include "backend/backend.h"
#include "cpu_ref.h"

const ds_ops *cpu_backend(bool simd)
{
    (void)simd;
    return &cpu_ref_ops;
}
