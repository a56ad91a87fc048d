/* txn.c - output directories published by one rename (see txn.h).
 *
 * States of the one transaction a process may hold, shared with the signal
 * handler through an atomic: IDLE, WRITING (the temporary may be removed at
 * any time), PUBLISHING (commit owns it: a signal is only recorded), DYING
 * (the handler is removing it). Commit and the handler each claim WRITING
 * with a compare-exchange, so exactly one of them acts on the temporary.
 * The lock file is unlinked while still held when the transaction ends; a
 * locker checks after flock() that the file it locked is still the one at the
 * path (else it retries), so unlinking never lets two writers in. */
#include "txn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { T_IDLE, T_WRITING, T_PUBLISHING, T_DYING };

struct out_txn {
    char *dest;    /* resolved destination */
    char *parent;  /* its parent directory */
    char *base;    /* its last component */
    char *tmp;     /* the temporary directory */
    char *lock;    /* the lock file */
    int lock_fd;
    bool existed;  /* dest existed at begin */
    mode_t mode;   /* the mode the published directory gets */
};

/* What the signal handler may touch: fixed buffers, filled before the state
 * becomes WRITING. */
static _Atomic int g_state = T_IDLE;
static volatile sig_atomic_t g_pending;
static char g_sig_tmp[PATH_MAX], g_sig_lock[PATH_MAX];

static const char k_tmp_tag[] = ".dsv3-tmp-", k_lock_tag[] = ".dsv3-lock";

static char *str_printf(const char *fmt, const char *a, const char *b, const char *c)
{
    size_t n = strlen(fmt) + strlen(a) + strlen(b) + strlen(c) + 32;
    char *s = malloc(n);
    if (s) snprintf(s, n, fmt, a, b, c);
    return s;
}

/* ---- small file helpers ---- */

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static ds_status write_all(int fd, const void *data, size_t len, const char *path)
{
    const char *p = data;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return ds_errorf(DS_ERR_IO, "%s: write failed: %s", path, n < 0 ? strerror(errno) : "no progress");
        p += n;
        len -= (size_t)n;
    }
    return DS_OK;
}

static ds_status close_synced(int fd, const char *path, ds_status s)
{
    if (!s && fsync(fd)) s = ds_errorf(DS_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) && !s) s = ds_errorf(DS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return s;
}

ds_status txn_write_file(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return ds_errorf(DS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    return close_synced(fd, path, write_all(fd, data, len, path));
}

ds_status txn_copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (in < 0) return ds_errorf(DS_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    struct stat sb;
    if (fstat(in, &sb) || !S_ISREG(sb.st_mode)) {
        close(in);
        return ds_errorf(DS_ERR_IO, "%s: not a regular file", src);
    }
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (out < 0) {
        ds_status s = ds_errorf(DS_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
        close(in);
        return s;
    }
    char buf[1 << 16];
    ds_status s = DS_OK;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) s = ds_errorf(DS_ERR_IO, "%s: read failed: %s", src, strerror(errno));
        if (n <= 0) break;
        if ((s = write_all(out, buf, (size_t)n, dst))) break;
    }
    close(in);
    return close_synced(out, dst, s);
}

bool txn_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static int open_dir(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_D || flag == FTW_DNR) chmod(path, (sb->st_mode & 07777) | 0700);
    return 0;
}

/* rm -rf without following links; directories are first made writable (a
 * published output may have had a read-only mode). */
static void remove_tree(const char *path)
{
    nftw(path, open_dir, 16, FTW_PHYS);
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Creates dir and missing parents. */
static ds_status mkdirs(const char *dir)
{
    char *p = strdup(dir);
    if (!p) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    ds_status s = DS_OK;
    for (char *c = p + 1;; c++) {
        if (*c && *c != '/') continue;
        char was = *c;
        *c = 0;
        if (mkdir(p, 0777) && errno != EEXIST) {
            s = ds_errorf(DS_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
            break;
        }
        if (!(*c = was)) break;
    }
    free(p);
    struct stat sb;
    if (!s && (stat(dir, &sb) || !S_ISDIR(sb.st_mode)))
        s = ds_errorf(DS_ERR_IO, "%s: not a directory", dir);
    return s;
}

/* ---- begin ---- */

/* Splits path (no trailing '/') into a new parent and base. */
static ds_status split(out_txn *t, const char *path, const char *flag)
{
    const char *sl = strrchr(path, '/');
    const char *base = sl ? sl + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
        return ds_errorf(DS_ERR_ARG, "%s '%s': name the output directory itself (not '.', '..' or '/')", flag, path);
    t->base = strdup(base);
    t->parent = sl == path ? strdup("/") : sl ? strndup(path, (size_t)(sl - path)) : strdup(".");
    t->dest = strdup(path);
    if (!t->base || !t->parent || !t->dest) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    return DS_OK;
}

static ds_status resolve(out_txn *t, const char *dest, const char *flag)
{
    if (!dest || !*dest) return ds_errorf(DS_ERR_ARG, "%s is empty: give the output directory", flag);
    size_t n = strlen(dest);
    while (n > 1 && dest[n - 1] == '/') n--;
    char *d = strndup(dest, n);
    if (!d) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    struct stat sb;
    ds_status s = DS_OK;
    if (stat(d, &sb) == 0) {
        /* an existing destination (or a link to one) is replaced where it really is */
        char *r = S_ISDIR(sb.st_mode) ? realpath(d, NULL) : NULL;
        if (!S_ISDIR(sb.st_mode)) s = ds_errorf(DS_ERR_IO, "%s '%s': exists and is not a directory", flag, d);
        else if (!r) s = ds_errorf(DS_ERR_IO, "%s '%s': %s", flag, d, strerror(errno));
        else s = split(t, r, flag);
        free(r);
        t->existed = true;
    } else if (errno != ENOENT) {
        s = ds_errorf(DS_ERR_IO, "%s '%s': %s", flag, d, strerror(errno));
    } else if (lstat(d, &sb) == 0) {
        s = ds_errorf(DS_ERR_IO, "%s '%s': a dangling symbolic link", flag, d);
    } else {
        s = split(t, d, flag);
        if (!s) s = mkdirs(t->parent);
    }
    free(d);
    return s;
}

/* The pid written in a lock file, or "unknown". */
static void lock_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n <= 0) n = 0;
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    if (!*buf) snprintf(buf, cap, "unknown");
}

static ds_status take_lock(out_txn *t)
{
    if (!(t->lock = str_printf("%s/.%s%s", t->parent, t->base, k_lock_tag))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(t->lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
        if (fd < 0) return ds_errorf(DS_ERR_IO, "%s: cannot create the lock file: %s", t->lock, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            int e = errno;
            char who[64];
            lock_holder(fd, who, sizeof who);
            close(fd);
            if (e == EWOULDBLOCK)
                return ds_errorf(DS_ERR_IO, "%s: another process (pid %s) is writing this output; lock %s", t->dest,
                                 who, t->lock);
            return ds_errorf(DS_ERR_IO, "%s: cannot lock: %s", t->lock, strerror(e));
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(t->lock, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
            if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)n, 0) == n) {}
            t->lock_fd = fd;
            return DS_OK;
        }
        close(fd); /* the holder removed it as we opened it: lock the new one */
    }
    return ds_errorf(DS_ERR_IO, "%s: the lock file keeps being replaced", t->lock);
}

/* Removes temporaries of earlier writers of this destination: holding the
 * lock, any that exist belong to processes that died. */
static void remove_stale(const out_txn *t)
{
    DIR *d = opendir(t->parent);
    if (!d) return;
    size_t bl = strlen(t->base);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (n[0] != '.' || strncmp(n + 1, t->base, bl) || strncmp(n + 1 + bl, k_tmp_tag, sizeof k_tmp_tag - 1)) continue;
        char *p = str_printf("%s/%s%s", t->parent, n, "");
        if (p) remove_tree(p);
        free(p);
    }
    closedir(d);
}

static ds_status make_tmp(out_txn *t)
{
    char pid[32];
    snprintf(pid, sizeof pid, "%ld-XXXXXX", (long)getpid());
    char *tmpl = malloc(strlen(t->parent) + strlen(t->base) + sizeof k_tmp_tag + 40);
    if (!tmpl) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    sprintf(tmpl, "%s/.%s%s%s", t->parent, t->base, k_tmp_tag, pid);
    if (strlen(tmpl) >= PATH_MAX || strlen(t->lock) >= PATH_MAX) {
        free(tmpl);
        return ds_errorf(DS_ERR_ARG, "%s: path too long", t->dest);
    }
    if (!mkdtemp(tmpl)) {
        ds_status s = ds_errorf(DS_ERR_IO, "%s: cannot create a temporary directory: %s", tmpl, strerror(errno));
        free(tmpl);
        return s;
    }
    t->tmp = tmpl;
    /* the published directory gets the mode it had, or a new directory's
     * mode; set at publish time, as it may not let us write */
    struct stat sb;
    if (t->existed && stat(t->dest, &sb) == 0) t->mode = sb.st_mode & 07777;
    else {
        mode_t um = umask(0);
        umask(um);
        t->mode = 0777 & ~um;
    }
    return DS_OK;
}

ds_status txn_begin(out_txn **out, const char *dest, const char *flag)
{
    *out = NULL;
    if (atomic_load(&g_state) != T_IDLE)
        return ds_errorf(DS_ERR_INTERNAL, "%s: another output transaction is open in this process", dest ? dest : "");
    out_txn *t = calloc(1, sizeof *t);
    if (!t) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    t->lock_fd = -1;
    ds_status s = resolve(t, dest, flag);
    if (!s) s = take_lock(t);
    if (!s) {
        remove_stale(t);
        s = make_tmp(t);
    }
    if (s) {
        txn_abort(t);
        return s;
    }
    memcpy(g_sig_tmp, t->tmp, strlen(t->tmp) + 1);
    memcpy(g_sig_lock, t->lock, strlen(t->lock) + 1);
    g_pending = 0;
    atomic_store(&g_state, T_WRITING);
    *out = t;
    return DS_OK;
}

const char *txn_dir(const out_txn *t) { return t->tmp; }
const char *txn_dest(const out_txn *t) { return t->dest; }

char *txn_path(const out_txn *t, const char *name)
{
    return str_printf("%s/%s%s", t->tmp, name, "");
}

/* ---- end ---- */

static void txn_free(out_txn *t)
{
    if (t->lock_fd >= 0) {
        unlink(t->lock); /* still held: see the file comment */
        close(t->lock_fd);
    }
    free(t->dest);
    free(t->parent);
    free(t->base);
    free(t->tmp);
    free(t->lock);
    free(t);
}

void txn_abort(out_txn *t)
{
    if (!t) return;
    int w = T_WRITING, p = T_PUBLISHING;
    if (t->tmp && (atomic_compare_exchange_strong(&g_state, &w, T_IDLE) ||
                   atomic_compare_exchange_strong(&g_state, &p, T_IDLE)))
        remove_tree(t->tmp);
    txn_free(t);
}

/* Links (or, where links fail, copies) src into dst, recursing into directories. */
static ds_status carry(const char *src, const char *dst)
{
    struct stat sb;
    if (lstat(src, &sb)) return ds_errorf(DS_ERR_IO, "%s: %s", src, strerror(errno));
    if (S_ISREG(sb.st_mode)) {
        if (link(src, dst) == 0) return DS_OK;
        return txn_copy_file(src, dst);
    }
    if (S_ISLNK(sb.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlink(src, target, sizeof target - 1);
        if (n < 0) return ds_errorf(DS_ERR_IO, "%s: %s", src, strerror(errno));
        target[n] = 0;
        if (symlink(target, dst)) return ds_errorf(DS_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
        return DS_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return ds_errorf(DS_ERR_IO, "%s: not a file, link or directory: cannot keep it in the new output", src);
    if (mkdir(dst, sb.st_mode & 07777)) return ds_errorf(DS_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    DIR *d = opendir(src);
    if (!d) return ds_errorf(DS_ERR_IO, "%s: %s", src, strerror(errno));
    ds_status s = DS_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *a = str_printf("%s/%s%s", src, e->d_name, ""), *b = str_printf("%s/%s%s", dst, e->d_name, "");
        s = a && b ? carry(a, b) : ds_errorf(DS_ERR_NOMEM, "out of memory");
        free(a);
        free(b);
    }
    closedir(d);
    return s;
}

/* Brings into the temporary every entry of dest it does not have; an entry
 * the new output replaces must be a regular file (or a link). */
static ds_status carry_dest(const out_txn *t)
{
    DIR *d = opendir(t->dest);
    if (!d) return ds_errorf(DS_ERR_IO, "%s: %s", t->dest, strerror(errno));
    ds_status s = DS_OK;
    struct dirent *e;
    while (!s && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *a = str_printf("%s/%s%s", t->dest, e->d_name, ""), *b = txn_path(t, e->d_name);
        struct stat sa, sb;
        if (!a || !b) s = ds_errorf(DS_ERR_NOMEM, "out of memory");
        else if (lstat(b, &sb) == 0) {
            if (lstat(a, &sa) == 0 && !S_ISREG(sa.st_mode) && !S_ISLNK(sa.st_mode))
                s = ds_errorf(DS_ERR_IO, "%s: exists and is not a regular file, so the output cannot replace it", a);
        } else {
            s = carry(a, b);
        }
        free(a);
        free(b);
    }
    closedir(d);
    return s;
}

static ds_status publish(out_txn *t)
{
    struct stat sb;
    bool exists = lstat(t->dest, &sb) == 0;
    if (exists != t->existed)
        return ds_errorf(DS_ERR_IO, "%s: %s while being written", t->dest, exists ? "appeared" : "disappeared");
    if (exists) {
        ds_status s = carry_dest(t);
        if (s) return s;
    }
    /* last, as the mode may not let us write */
    if (chmod(t->tmp, t->mode) || fsync_path(t->tmp))
        return ds_errorf(DS_ERR_IO, "%s: cannot finish the output directory: %s", t->tmp, strerror(errno));
    if (!exists) {
        /* NOREPLACE: never over a directory that appeared; plain rename where unsupported */
        int rc = (int)syscall(SYS_renameat2, AT_FDCWD, t->tmp, AT_FDCWD, t->dest, 1 /* RENAME_NOREPLACE */);
        if (rc && (errno == ENOSYS || errno == EINVAL)) rc = rename(t->tmp, t->dest);
        if (rc) return ds_errorf(DS_ERR_IO, "%s: cannot rename the output into place: %s", t->dest, strerror(errno));
    } else {
        if (syscall(SYS_renameat2, AT_FDCWD, t->tmp, AT_FDCWD, t->dest, 2 /* RENAME_EXCHANGE */))
            return ds_errorf(DS_ERR_IO, "%s: cannot swap the new output in (renameat2 RENAME_EXCHANGE): %s",
                             t->dest, strerror(errno));
    }
    fsync_path(t->parent);
    return DS_OK;
}

ds_status txn_commit(out_txn *t)
{
    int w = T_WRITING;
    if (!atomic_compare_exchange_strong(&g_state, &w, T_PUBLISHING)) {
        /* a signal handler owns the temporary and ends the process */
        ds_status s = ds_errorf(DS_ERR_IO, "%s: interrupted", t->dest);
        txn_free(t);
        return s;
    }
    ds_status s = publish(t);
    /* on success the temporary's name now holds the previous output (or nothing) */
    remove_tree(t->tmp);
    atomic_store(&g_state, T_IDLE);
    txn_free(t);
    return s;
}

/* ---- signals ---- */

struct linux_dirent64 {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

int txn_signal_cleanup(int sig)
{
    int w = T_WRITING;
    if (!atomic_compare_exchange_strong(&g_state, &w, T_DYING)) {
        if (w == T_PUBLISHING) {
            g_pending = sig;
            return 2;
        }
        return 0;
    }
    /* The temporary holds only files (the writers make no subdirectories). */
    for (int pass = 0; pass < 4 && rmdir(g_sig_tmp) && errno == ENOTEMPTY; pass++) {
        int fd = open(g_sig_tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) break;
        char buf[4096] __attribute__((aligned(8)));
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
            for (long off = 0; off < n;) {
                struct linux_dirent64 *e = (struct linux_dirent64 *)(buf + off);
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(fd, e->d_name, 0);
                off += e->d_reclen;
            }
        }
        close(fd);
    }
    unlink(g_sig_lock);
    return 1;
}

int txn_pending_signal(void)
{
    return g_pending;
}
