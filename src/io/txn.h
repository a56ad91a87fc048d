/* txn.h - an output directory written as one transaction.
 *
 * The checkpoint writers (convert, cast-bf16, synth) never write into their
 * destination directly. txn_begin() takes an exclusive flock() on
 * "<parent>/.<name>.dsv3-lock" (a second writer fails at once with the
 * holder's pid), removes temporaries that dead writers left beside the
 * destination, and creates a fresh "<parent>/.<name>.dsv3-tmp-<pid>-XXXXXX".
 * The writer puts every file there (txn_path) and fsyncs it. txn_commit()
 * then publishes with one rename: into place when the destination does not
 * exist, else by renameat2(RENAME_EXCHANGE) after hard-linking into the
 * temporary every entry of the destination that the new output does not
 * replace (files the user keeps there, the other shards of an in-place
 * conversion). Until that rename the destination is exactly as it was; after
 * it, it is the complete new output. A failure, txn_abort(), or a SIGINT/
 * SIGTERM (through txn_signal_cleanup) removes the temporary.
 *
 * Needs a file system with renameat2 RENAME_EXCHANGE (ext4, xfs, btrfs,
 * tmpfs, ...) when the destination exists, and write access to its parent.
 * One transaction at a time per process. */
#ifndef DS_TXN_H
#define DS_TXN_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef struct out_txn out_txn;

/* Locks dest (a directory path; created at commit if absent) and makes the
 * temporary. `flag` names the option dest came from, for messages. */
ds_status txn_begin(out_txn **t, const char *dest, const char *flag);

/* The temporary directory and dest as resolved (absolute when dest existed). */
const char *txn_dir(const out_txn *t);
const char *txn_dest(const out_txn *t);

/* txn_dir(t) + "/" + name in a new string (NULL when out of memory). */
char *txn_path(const out_txn *t, const char *name);

/* Publishes the temporary as dest (see above), unlocks and frees t, also on
 * failure (then dest is untouched and the temporary removed). */
ds_status txn_commit(out_txn *t);

/* Removes the temporary, unlocks, frees. Safe on NULL. */
void txn_abort(out_txn *t);

/* For a SIGINT/SIGTERM/SIGHUP handler (async-signal-safe). Returns 1 when it
 * removed the temporary of a transaction in progress (the handler should then
 * end the process), 2 when a commit is publishing (the signal is recorded and
 * the commit completes; txn_pending_signal() then returns it), 0 with no
 * transaction. */
int txn_signal_cleanup(int sig);
int txn_pending_signal(void);

/* Writes len bytes to path (a new file), fsyncs and closes it. */
ds_status txn_write_file(const char *path, const void *data, size_t len);

/* Copies src (must be a regular file) to the new file dst, fsynced. */
ds_status txn_copy_file(const char *src, const char *dst);

/* True if a and b exist and are the same directory (or file). */
bool txn_same_file(const char *a, const char *b);

#endif
