/* fuzz.h - what every fuzz target defines.
 *
 * LLVMFuzzerTestOneInput(data, size) must return 0 for every input: a clean
 * error status is fine, a crash, a sanitizer report, a leak or an abort() on
 * a broken invariant is a finding. LLVMFuzzerInitialize (optional, weak in
 * the plain driver) loads what the target needs once. The same file builds as
 * a libFuzzer target (-DDSV3_LIBFUZZER, see tests.cmake) or with
 * fuzz_driver.c as a plain program for the test suite. */
#ifndef DS_FUZZ_H
#define DS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A NUL-terminated heap copy of the input (for text APIs); abort()s on OOM. */
char *fuzz_cstr(const uint8_t *data, size_t size);

#endif
