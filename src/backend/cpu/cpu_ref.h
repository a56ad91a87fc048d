/* cpu_ref.h - the scalar reference operations of the CPU backend. */
#ifndef DS_CPU_REF_H
#define DS_CPU_REF_H

#include "backend/backend.h"

extern const ds_ops cpu_ref_ops;

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
/* Row r of w as float32 (exact dequantisation). */
void cpu_dequant_row(const ds_weight *w, int r, float *out);

#endif
