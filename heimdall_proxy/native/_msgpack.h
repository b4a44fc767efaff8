/* A msgpack reader that walks a payload without decoding it: headers, skips, string
 * compares and non-negative ints, every read bounds-checked; and `grow`, for the buffers a
 * walk fills. Shared by native/_tokens.c and native/_vllm_ingest.c (static inline: each
 * compiles its own copy). */
#ifndef HEIMDALL_MSGPACK_H
#define HEIMDALL_MSGPACK_H
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
} Reader;

static inline int
need(const Reader *r, size_t n)
{
    return r->len - r->pos >= n;
}

static inline uint64_t
be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* The header at r->pos: kind (see below), its length or value, and its size in bytes (a
 * scalar's data included; a str's, bin's or container's contents not). Returns 0, or -1
 * when the payload ends before that size or the byte is never used (0xc1). */
enum { K_SCALAR, K_ARRAY, K_MAP, K_STR, K_BIN, K_UINT, K_INT };

static inline int
header(const Reader *r, int *kind, uint64_t *n, size_t *size)
{
    if (!need(r, 1)) {
        return -1;
    }
    const uint8_t *p = r->p + r->pos;
    const uint8_t b = p[0];
    size_t extra = 0; /* payload bytes of a scalar */
    *size = 1;
    *n = 0;
    if (b <= 0x7f) {
        *kind = K_UINT;
        *n = b;
        return 0;
    }
    if (b >= 0xe0) {
        *kind = K_INT; /* negative fixint */
        *n = (uint64_t)(int64_t)(int8_t)b;
        return 0;
    }
    if (b <= 0x8f || (b >= 0x90 && b <= 0x9f)) {
        *kind = b <= 0x8f ? K_MAP : K_ARRAY;
        *n = b & 0x0f;
        return 0;
    }
    if (b <= 0xbf) {
        *kind = K_STR;
        *n = b & 0x1f;
        return 0;
    }
    int lenbytes = 0;
    switch (b) {
    case 0xc0: /* nil */
    case 0xc2: /* false */
    case 0xc3: /* true */
        *kind = K_SCALAR;
        return 0;
    case 0xc4: case 0xc5: case 0xc6:
        *kind = K_BIN;
        lenbytes = 1 << (b - 0xc4);
        break;
    case 0xc7: case 0xc8: case 0xc9: /* ext: length, type byte, data */
        lenbytes = 1 << (b - 0xc7);
        if (!need(r, 1 + (size_t)lenbytes + 1)) {
            return -1;
        }
        *kind = K_SCALAR;
        *size = 1 + (size_t)lenbytes + 1 + (size_t)be(p + 1, lenbytes);
        return need(r, *size) ? 0 : -1;
    case 0xca: extra = 4; break;
    case 0xcb: extra = 8; break;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        if (!need(r, 1 + ((size_t)1 << (b - 0xcc)))) {
            return -1;
        }
        *kind = K_UINT;
        *n = be(p + 1, 1 << (b - 0xcc));
        *size = 1 + ((size_t)1 << (b - 0xcc));
        return 0;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        const int w = 1 << (b - 0xd0);
        if (!need(r, 1 + (size_t)w)) {
            return -1;
        }
        uint64_t raw = be(p + 1, w);
        int64_t v = w == 8 ? (int64_t)raw : (int64_t)(raw ^ (1ULL << (8 * w - 1))) -
                                                (int64_t)(1ULL << (8 * w - 1));
        *kind = K_INT;
        *n = (uint64_t)v;
        *size = 1 + (size_t)w;
        return 0;
    }
    case 0xd4: extra = 2; break;  /* fixext 1: type + 1 */
    case 0xd5: extra = 3; break;
    case 0xd6: extra = 5; break;
    case 0xd7: extra = 9; break;
    case 0xd8: extra = 17; break;
    case 0xd9: case 0xda: case 0xdb:
        *kind = K_STR;
        lenbytes = 1 << (b - 0xd9);
        break;
    case 0xdc: case 0xdd:
        *kind = K_ARRAY;
        lenbytes = 2 << (b - 0xdc);
        break;
    case 0xde: case 0xdf:
        *kind = K_MAP;
        lenbytes = 2 << (b - 0xde);
        break;
    default: /* 0xc1 */
        return -1;
    }
    if (lenbytes) {
        if (!need(r, 1 + (size_t)lenbytes)) {
            return -1;
        }
        *n = be(p + 1, lenbytes);
        *size = 1 + (size_t)lenbytes;
        return 0;
    }
    *kind = K_SCALAR;
    *size = 1 + extra;
    return need(r, *size) ? 0 : -1;
}

/* Skip one object (and everything in it). 0, or -1 for a payload that ends early. */
static inline int
skip(Reader *r)
{
    uint64_t pending = 1;
    while (pending) {
        int kind;
        uint64_t n;
        size_t size;
        if (header(r, &kind, &n, &size) < 0 || !need(r, size)) {
            return -1;
        }
        r->pos += size;
        pending--;
        if (kind == K_STR || kind == K_BIN) {
            if (!need(r, n)) {
                return -1;
            }
            r->pos += n;
        }
        else if (kind == K_ARRAY || kind == K_MAP) {
            const uint64_t items = kind == K_MAP ? 2 * n : n;
            if (items > r->len - r->pos) {
                return -1; /* each item is a byte at least */
            }
            pending += items;
        }
    }
    return 0;
}

/* Whether the object at r->pos is the string `s` (r->pos is not moved). */
static inline int
is_str(const Reader *r, const char *s)
{
    int kind;
    uint64_t n;
    size_t size;
    const size_t len = strlen(s);
    return header(r, &kind, &n, &size) == 0 && kind == K_STR && n == len &&
           need(r, size + len) && memcmp(r->p + r->pos + size, s, len) == 0;
}

/* A u64 at r->pos (a uint, or an int encoding of one >= 0), moved past; 0, or -1. */
static inline int
read_u64(Reader *r, uint64_t *v)
{
    /* the encodings a packer gives ids and hashes first: fixint, uint16, uint32, uint64 */
    const uint8_t *p = r->p + r->pos;
    const size_t left = r->len - r->pos;
    if (left >= 1 && p[0] <= 0x7f) {
        *v = p[0];
        r->pos += 1;
        return 0;
    }
    if (left >= 3 && p[0] == 0xcd) {
        *v = (uint64_t)p[1] << 8 | p[2];
        r->pos += 3;
        return 0;
    }
    if (left >= 5 && p[0] == 0xce) {
        *v = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 | p[4];
        r->pos += 5;
        return 0;
    }
    if (left >= 9 && p[0] == 0xcf) {
        *v = be(p + 1, 8);
        r->pos += 9;
        return 0;
    }
    int kind;
    size_t size;
    if (header(r, &kind, v, &size) < 0 || (kind != K_UINT && kind != K_INT) ||
        (kind == K_INT && (int64_t)*v < 0)) {
        return -1;
    }
    r->pos += size;
    return 0;
}

/* Room for `want` items of `item` bytes in *buf (PyMem, doubling from 16): the buffers a
 * walk fills as it reads. 0, or -1 (no exception set). */
static inline int
grow(void **buf, size_t *cap, size_t want, size_t item)
{
    if (want <= *cap) {
        return 0;
    }
    size_t cap2 = *cap ? *cap : 16;
    while (cap2 < want) {
        cap2 *= 2;
    }
    void *p = PyMem_Realloc(*buf, cap2 * item);
    if (p == NULL) {
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

#endif /* HEIMDALL_MSGPACK_H */
