/* file.c - whole-file reads with type and size checks (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *file_kind(unsigned mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISREG(mode)) return "a regular file";
    return "not a regular file";
}

ds_status file_read(const char *path, size_t max, const char *what, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return ds_errorf(DS_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        ds_status s = ds_errorf(DS_ERR_IO, "%s: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ds_errorf(DS_ERR_IO, "%s: the %s is %s, not a regular file", path, what, file_kind(sb.st_mode));
    }
    if ((unsigned long long)sb.st_size > max) {
        close(fd);
        return ds_errorf(DS_ERR_FORMAT, "%s: the %s is %lld bytes, over the limit of %zu MiB", path, what,
                         (long long)sb.st_size, max >> 20);
    }
    /* read one byte past the size seen, so a file that grew is noticed */
    size_t cap = (size_t)sb.st_size + 1, n = 0;
    char *b = malloc(cap + 1);
    if (!b) {
        close(fd);
        return ds_errorf(DS_ERR_NOMEM, "%s: out of memory for the %zu-byte %s", path, cap, what);
    }
    while (n < cap) {
        ssize_t r = read(fd, b + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            ds_status s = ds_errorf(DS_ERR_IO, "%s: read error: %s", path, strerror(errno));
            free(b);
            close(fd);
            return s;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n == cap) {
        free(b);
        return ds_errorf(DS_ERR_IO, "%s: the %s changed while being read", path, what);
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return DS_OK;
}
