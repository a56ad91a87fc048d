/* cpu_ref.h - the scalar reference operations of the CPU backend. */
#ifndef DS_CPU_REF_H
#define DS_CPU_REF_H

#include "backend/backend.h"

extern const ds_ops cpu_ref_ops;

void *cpu_alloc(size_t bytes);
void cpu_free(void *p);
/* Row r of w as float32 (exact dequantisation). */
void cpu_dequant_row(const ds_weight *w, int r, float *out);

/* Ops return void: one that cannot get its scratch memory records it here and
 * returns without its result; cpu_status() (the table's status op) reports and
 * clears the first such failure, and model_forward turns it into an error. */
void cpu_fail_oom(const char *what, size_t bytes);
ds_status cpu_status(void);

#endif
