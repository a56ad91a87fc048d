/* manifest.h - comparing written safetensors files with the golden manifests
 * ({file: {"tensors": {name: {dtype, shape, sha256}}, ...}} or {file: {"sha256"}}). */
#ifndef DS_TEST_MANIFEST_H
#define DS_TEST_MANIFEST_H

/* Checks that dir holds every file of the manifest with exactly its tensors
 * (same names, dtypes, shapes, byte sha256) or, for plain entries, exactly its
 * bytes. Counts failures through the CHECK macros. */
void check_manifest(const char *manifest_path, const char *dir);

/* sha256 of a whole file into hex; 0 on success. */
int sha256_file(const char *path, char hex[65]);

#endif
