/* Copy a file, or a byte range of one, and hash it with XXH3-128 on the way, outside the interpreter.
 *
 * common/nativecopy.py builds this into _stagecopy.so and calls it through ctypes, which releases the
 * GIL for the whole call, so staging threads copy files truly in parallel. Staging calls
 * stage_copy_batch(): many files per call, each checked against its expected size and digest and renamed
 * from its temporary name to its final one here, so the interpreter does no work per file. Plain staging
 * copies whole files (offset 0, length -1: to the end); unpacking an uncompressed tar copies each member's
 * range of the archive (its data starts at `offset` and is `length` bytes long). The source is read in
 * preads into the caller's `buf` of `chunk` bytes (each staging thread keeps one: a fresh allocation per
 * file would be a new mapping, zeroed pages and an unmapping every time) (measured cheaper here than mapping it, for ext4 and tmpfs destinations alike: see
 * docs/performance.md), and every piece is hashed and written to `dst` (created or truncated).
 * Returns 0, or an errno value with a message in `err` naming the step that failed.
 *
 * Hashing: built with STAGE_XXH_DISPATCH (x86-64, linked to libxxhash), XXH3 runs the widest vector code
 * the CPU has, chosen at run time by the library's dispatcher (AVX2: 0.030 s/GB here, AVX-512 0.026);
 * otherwise it is compiled in from the header with the vector code the compiler targets by default
 * (SSE2 on x86-64: 0.069 s/GB; NEON on aarch64). The same .so can then run on login and compute nodes
 * with different CPUs. */
#define _GNU_SOURCE
#ifdef STAGE_XXH_DISPATCH
#define XXH_STATIC_LINKING_ONLY  /* XXH3_state_t's layout, to keep the state on the stack */
#include <xxhash.h>
#include <xxh_x86dispatch.h>
#define stage_hash_update XXH3_128bits_update_dispatch
#define STAGE_HASH_CODE "xxh3 dispatched at run time (libxxhash)"
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#define stage_hash_update XXH3_128bits_update
#define STAGE_HASH_CODE "xxh3 compiled in (header)"
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
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

/* Hash and write [offset, offset + length) of `in`, read in preads of `chunk` bytes into `buf`; -1 with
 * errno set on failure. */
static int copy_read(int in, int out, unsigned long long offset, unsigned long long length, unsigned char *buf,
                     size_t chunk, XXH3_state_t *state, unsigned long long *size, const char **step) {
    int rc = 0;
    while (*size < length) {
        size_t want = length - *size < chunk ? (size_t)(length - *size) : chunk;
        *step = "read the source";
        ssize_t got = pread(in, buf, want, (off_t)(offset + *size));
        if (got < 0) { if (errno == EINTR) continue; rc = -1; break; }
        if (got == 0) { errno = EIO; *step = "read the source (it ended early)"; rc = -1; break; }
        stage_hash_update(state, buf, (size_t)got);
        *step = "write the copy";
        if ((rc = write_all(out, buf, (size_t)got)) < 0) break;
        *size += (unsigned long long)got;
    }
    return rc;
}

/* How this build hashes (`python -m common.nativecopy` prints it). */
const char *stage_hash_code(void) { return STAGE_HASH_CODE; }

int stage_copy(const char *src, unsigned long long offset, long long length, const char *dst, unsigned char *buf,
               size_t chunk, unsigned char *digest, unsigned long long *size, char *err, size_t errlen) {
    int in = -1, out = -1, rc = 0;
    struct stat st;
    XXH3_state_t state;
    const char *step = "open the source";
    *size = 0;
    errno = 0;
    XXH3_128bits_reset(&state);
    if ((in = open(src, O_RDONLY | O_CLOEXEC)) < 0) goto fail;
    step = "stat the source";
    if (fstat(in, &st) < 0) goto fail;
    unsigned long long total = (unsigned long long)st.st_size;
    unsigned long long want = length < 0 ? (offset < total ? total - offset : 0) : (unsigned long long)length;
    if (offset + want > total) {
        snprintf(err, errlen, "the source has %llu bytes, too few for %llu bytes from offset %llu; it is truncated",
                 total, want, offset);
        rc = EIO;
        goto done;
    }
    step = "create the copy";
    if ((out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) goto fail;
    if (copy_read(in, out, offset, want, buf, chunk, &state, size, &step) < 0) goto fail;
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
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return rc;
}

/* One file of a batch; the layout of nativecopy.BatchJob. The expected digest is XXH3-128 in canonical
 * (big-endian) form, as the manifest's hex digest reads. */
struct stage_job {
    const char *src;
    unsigned long long offset;
    long long length;
    const char *tmp;
    const char *final;
    unsigned long long size;
    unsigned char digest[16];
    unsigned long long got_size;   /* out: bytes copied */
    unsigned char got_digest[16];  /* out: their digest */
};

#define STAGE_SIZE_MISMATCH (-1)
#define STAGE_DIGEST_MISMATCH (-2)

/* Copy jobs[0..n) in order: each to its `tmp`, checked against its size and digest, then renamed to its
 * `final`. Stops at the first failure, with its index in *failed, the temporary copy removed and the
 * return value: an errno value (message in `err`), STAGE_SIZE_MISMATCH or STAGE_DIGEST_MISMATCH (the
 * job's got_size and got_digest say what was found). Returns 0 with *failed = n when all are done. */
int stage_copy_batch(struct stage_job *jobs, size_t n, unsigned char *buf, size_t chunk, size_t *failed,
                     char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        struct stage_job *job = &jobs[i];
        int rc = stage_copy(job->src, job->offset, job->length, job->tmp, buf, chunk, job->got_digest,
                            &job->got_size, err, errlen);
        if (!rc && job->got_size != job->size) rc = STAGE_SIZE_MISMATCH;
        if (!rc && memcmp(job->got_digest, job->digest, 16) != 0) rc = STAGE_DIGEST_MISMATCH;
        if (!rc && rename(job->tmp, job->final) < 0) {
            rc = errno;
            snprintf(err, errlen, "cannot rename the copy to %s: %s", job->final, strerror(rc));
        }
        if (rc) {
            unlink(job->tmp);
            *failed = i;
            return rc;
        }
    }
    *failed = n;
    return 0;
}
