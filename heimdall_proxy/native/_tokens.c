/* pack_token_ids: a vLLM KV-event batch with its token ids as u32 bytes, before msgpack
 * decodes it (kvcache.events).
 *
 * A prefill's BlockStored event carries every token of its blocks: 512 ids for 32 blocks of
 * 16. Decoded by msgpack they become 512 int objects, made only to be converted back to u32
 * for hashing (kvcache.hashing) and freed: that was most of the decode of a vLLM batch and
 * ~0.25 us of each block's ingest. Here the payload is walked once, without decoding it, and
 * each such array of ids is rewritten as one msgpack bin of little-endian u32s; msgpack
 * then decodes the batch as before, each token list as one bytes object, which
 * kvcache.events reads as array('I').
 *
 * Rewritten: the token_ids of a BlockStored event in vLLM's tagged-array form
 * (["BlockStored", hashes, parent, token_ids, ...]) or of any event in the map form
 * ({"type": ..., "token_ids": ...}: only a BlockStored's are read), in a batch that is an
 * array ([ts, events, ...]) or a map with "events", when they are an array of integers in
 * [0, 2**32). Anything else (an id out of range) is left as it is, for the decoder's own
 * checks; and the payload is not rewritten at all (None) unless it is well-formed msgpack
 * to its last byte (msgpack's own error then stays the plain decode's), or if a token_ids
 * is already a bin somewhere (the decoder must still refuse it). Little-endian hosts only:
 * the Python side does not call in on a big-endian one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_msgpack.h"

/* A token array to rewrite: where it starts and ends in the payload, its ids. */
typedef struct {
    size_t start, end;
    size_t first; /* index of its first id in `ids` */
    size_t count;
} Span;

typedef struct {
    Span *spans;
    size_t nspans, capspans;
    uint32_t *ids;
    size_t nids, capids;
    int refuse; /* a token_ids already given as a bin: leave the payload alone */
} Plan;

/* The token_ids array at r->pos: read into the plan when every id is a u32, else skipped.
 * 0; -1 for an early end; -2 out of memory. */
static int
tokens(Reader *r, Plan *plan)
{
    int kind;
    uint64_t n;
    size_t size;
    const size_t start = r->pos;
    if (header(r, &kind, &n, &size) < 0) {
        return -1;
    }
    if (kind == K_BIN) {
        plan->refuse = 1;
    }
    if (kind != K_ARRAY || n == 0 || n > r->len - r->pos || n > UINT32_MAX / 4) {
        return skip(r); /* (a bin32 holds at most 2**30 u32s) */
    }
    if (grow((void **)&plan->ids, &plan->capids, plan->nids + n, sizeof(uint32_t)) < 0) {
        return -2;
    }
    r->pos += size;
    uint32_t *out = plan->ids + plan->nids;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v;
        if (read_u64(r, &v) < 0 || v > UINT32_MAX) {
            r->pos = start; /* not all u32, or cut short: as is, for the decoder's checks */
            return skip(r);
        }
        out[i] = (uint32_t)v;
    }
    if (grow((void **)&plan->spans, &plan->capspans, plan->nspans + 1, sizeof(Span)) < 0) {
        return -2;
    }
    plan->spans[plan->nspans++] = (Span){start, r->pos, plan->nids, (size_t)n};
    plan->nids += n;
    return 0;
}

/* The events array at r->pos. 0, -1 (early end), -2 (memory). */
static int
events(Reader *r, Plan *plan)
{
    int kind;
    uint64_t n;
    size_t size;
    if (header(r, &kind, &n, &size) < 0) {
        return -1;
    }
    if (kind != K_ARRAY) {
        return skip(r);
    }
    r->pos += size;
    for (uint64_t e = 0; e < n; e++) {
        uint64_t fields;
        if (header(r, &kind, &fields, &size) < 0) {
            return -1;
        }
        if (kind == K_MAP) { /* {"type": ..., "token_ids": [...], ...}: any type's ids */
            r->pos += size;
            for (uint64_t f = 0; f < fields; f++) {
                const int ids = is_str(r, "token_ids");
                int rc = skip(r) < 0 ? -1 : ids ? tokens(r, plan) : skip(r);
                if (rc < 0) {
                    return rc;
                }
            }
            continue;
        }
        if (kind != K_ARRAY || fields < 4) {
            if (skip(r) < 0) {
                return -1;
            }
            continue;
        }
        r->pos += size;
        if (!is_str(r, "BlockStored")) {
            for (uint64_t f = 0; f < fields; f++) {
                if (skip(r) < 0) {
                    return -1;
                }
            }
            continue;
        }
        /* tag, block_hashes, parent_block_hash; then token_ids; then the rest */
        if (skip(r) < 0 || skip(r) < 0 || skip(r) < 0) {
            return -1;
        }
        int rc = tokens(r, plan);
        if (rc < 0) {
            return rc;
        }
        for (uint64_t f = 4; f < fields; f++) {
            if (skip(r) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* The batch: [ts, events, ...] or a map with "events". */
static int
batch(Reader *r, Plan *plan)
{
    int kind;
    uint64_t n;
    size_t size;
    if (header(r, &kind, &n, &size) < 0) {
        return -1;
    }
    r->pos += size;
    if (kind == K_ARRAY) {
        if (n < 2 || skip(r) < 0) {
            return -1;
        }
        int rc = events(r, plan);
        for (uint64_t i = 2; rc == 0 && i < n; i++) {
            rc = skip(r);
        }
        return rc;
    }
    if (kind != K_MAP) {
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        const int wanted = is_str(r, "events");
        if (skip(r) < 0) {
            return -1;
        }
        int rc = wanted ? events(r, plan) : skip(r);
        if (rc < 0) {
            return rc;
        }
    }
    return 0;
}

static size_t
bin_header_size(size_t bytes)
{
    return bytes <= 0xff ? 2 : bytes <= 0xffff ? 3 : 5;
}

static size_t
bin_header(uint8_t *out, size_t bytes)
{
    if (bytes <= 0xff) {
        out[0] = 0xc4;
        out[1] = (uint8_t)bytes;
        return 2;
    }
    if (bytes <= 0xffff) {
        out[0] = 0xc5;
        out[1] = (uint8_t)(bytes >> 8);
        out[2] = (uint8_t)bytes;
        return 3;
    }
    out[0] = 0xc6;
    for (int i = 0; i < 4; i++) {
        out[1 + i] = (uint8_t)(bytes >> (24 - 8 * i));
    }
    return 5;
}

PyDoc_STRVAR(pack_token_ids_doc,
             "pack_token_ids(payload) -> bytes | None\n\n"
             "The vLLM event batch `payload` (bytes) with each BlockStored's token ids as a\n"
             "msgpack bin of little-endian u32 (see the module); None when nothing is\n"
             "rewritten.");

static PyObject *
pack_token_ids(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "payload must be bytes");
        return NULL;
    }
    Reader r = {(const uint8_t *)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), 0};
    Plan plan = {0};
    PyObject *out = NULL;
    const int rc = batch(&r, &plan);
    if (rc == -2) {
        PyErr_NoMemory();
        goto done;
    }
    /* a batch that is not well-formed msgpack to its last byte is not rewritten: msgpack's
     * error (whose limits follow the payload's length) is then the plain decode's */
    if (rc < 0 || r.pos != r.len || plan.refuse || plan.nspans == 0) {
        out = Py_None; /* not ours to fix: the decoder says what is wrong */
        Py_INCREF(out);
        goto done;
    }
    size_t total = r.len;
    for (size_t i = 0; i < plan.nspans; i++) {
        const Span *s = &plan.spans[i];
        total = total - (s->end - s->start) + bin_header_size(4 * s->count) + 4 * s->count;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) {
        goto done;
    }
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out);
    size_t from = 0;
    for (size_t i = 0; i < plan.nspans; i++) {
        const Span *s = &plan.spans[i];
        memcpy(w, r.p + from, s->start - from);
        w += s->start - from;
        w += bin_header(w, 4 * s->count);
        memcpy(w, plan.ids + s->first, 4 * s->count);
        w += 4 * s->count;
        from = s->end;
    }
    memcpy(w, r.p + from, r.len - from);
done:
    PyMem_Free(plan.spans);
    PyMem_Free(plan.ids);
    return out;
}

static PyMethodDef methods[] = {
    {"pack_token_ids", (PyCFunction)pack_token_ids, METH_O, pack_token_ids_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "heimdall_proxy.native._tokens",
    "vLLM KV-event batches with their token ids packed as u32 (see kvcache.events).",
    0,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__tokens(void)
{
    return PyModuleDef_Init(&module);
}
