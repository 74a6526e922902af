/* Copy one file and hash it with XXH3-128 on the way, outside the Python interpreter.
 *
 * common/nativecopy.py builds this into _stagecopy.so and calls stage_copy() through ctypes, which
 * releases the GIL for the whole call, so staging threads copy files truly in parallel. The source is
 * read from a read-only memory map (use_mmap, for node-local file systems) or in `chunk`-byte reads
 * (parallel file systems), and every piece is hashed and written to `dst` (created or truncated).
 * Returns 0, or an errno value with a message in `err` naming the step that failed. */
#define _GNU_SOURCE
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return -1; }
        p += w; n -= (size_t)w;
    }
    return 0;
}

int stage_copy(const char *src, const char *dst, int use_mmap, size_t chunk,
               unsigned char *digest, unsigned long long *size, char *err, size_t errlen) {
    int in = -1, out = -1, rc = 0;
    unsigned char *buf = NULL, *map = NULL;
    struct stat st;
    XXH3_state_t state;
    const char *step = "open the source";
    *size = 0;
    XXH3_128bits_reset(&state);
    if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0) goto fail;
    step = "stat the source";
    if (fstat(in, &st) < 0) goto fail;
    step = "create the copy";
    if ((out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) goto fail;
    if (use_mmap && st.st_size > 0) {
        step = "map the source";
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, in, 0);
        if (map == MAP_FAILED) { map = NULL; goto fail; }
        madvise(map, (size_t)st.st_size, MADV_SEQUENTIAL);
        for (size_t off = 0; off < (size_t)st.st_size; off += chunk) {
            size_t n = (size_t)st.st_size - off < chunk ? (size_t)st.st_size - off : chunk;
            XXH3_128bits_update(&state, map + off, n);
            step = "write the copy";
            if (write_all(out, map + off, n) < 0) goto fail;
            *size += n;
        }
    } else {
        step = "allocate a buffer";
        if (!(buf = malloc(chunk))) goto fail;
        for (;;) {
            step = "read the source";
            ssize_t got = read(in, buf, chunk);
            if (got < 0) { if (errno == EINTR) continue; goto fail; }
            if (got == 0) break;
            XXH3_128bits_update(&state, buf, (size_t)got);
            step = "write the copy";
            if (write_all(out, buf, (size_t)got) < 0) goto fail;
            *size += (unsigned long long)got;
        }
    }
    step = "close the copy";
    if (close(out) < 0) { out = -1; goto fail; }
    out = -1;
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&state));
    memcpy(digest, canon.digest, 16);
    goto done;
fail:
    rc = errno ? errno : EIO;
    snprintf(err, errlen, "cannot %s: %s", step, strerror(rc));
done:
    if (map) munmap(map, (size_t)st.st_size);
    free(buf);
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return rc;
}
