/* The conductor's native path for vLLM's plain KV-event batches (conductor.native_ingest).
 *
 * In steady serving most of vLLM's events are a decode step's: one block stored per
 * sequence that filled one, one evicted per block reused. In Python each such event costs
 * ~5.5 us (decoding and checking it, a Stored object, the stream, the engine-hash map and
 * the index, a dozen calls), so one core applies ~0.18M of them a second. Here a batch of
 * plain events is read straight from its msgpack payload and applied to the same maps
 * (U64Map, _u64map.h) with the same arithmetic (native/_chain.h's chain step).
 *
 * Plain (`scan`): a batch [ts, [events], dp_rank, ...] that is well-formed msgpack to its
 * last byte, whose events all share one medium and are each
 *   ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name,
 *    extra_keys, ...]  with hashes non-empty u64s, parent nil or a u64, token ids u32s
 *    (at least one), block_size a uint, lora_id and lora_name nil, and, for a chain's
 *    first block (no parent), no cache_salt in extra_keys (nil, empty, or a first entry
 *    that is no array), or
 *   ["BlockRemoved", hashes, medium, ...]  with hashes u64s.
 * Anything else (another event type, a map, a LoRA, a salt, a hash given as bytes, ...) is
 * not plain, and the batch is decoded in Python as before.
 *
 * `apply` applies a plain batch's events in order as conductor.engine_map and
 * conductor.index would, and stops at the first one whose outcome depends on what only the
 * Python path resolves: a parent its map does not hold (another salt's chain, or an
 * orphan), a first hash already mapped (a block stored again), a block size other than the
 * registration's, a removal when the publisher has maps in several namespaces; the Python
 * path then applies the rest (scan made sure it decodes the same events). A MemoryError
 * stops it the same way, before the event changes anything (Python then meets it). tests/conductor/test_native_ingest.py holds both paths to the same
 * index, maps and counters.
 */
#define PY_SSIZE_T_CLEAN
#include "_u64map.h"
#include "_chain.h"
#include "_msgpack.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the chain hashes little-endian u32 and u64 values in place"
#endif


static PyTypeObject *U64MapType; /* heimdall_proxy.native._u64map.U64Map */

/* ---- reading one event ------------------------------------------------------------------ */

typedef struct {
    int stored; /* BlockStored, else BlockRemoved */
    size_t hashes_at; /* the first hash's position */
    uint64_t nhashes;
    int has_parent;
    uint64_t parent;
    size_t tokens_at;
    uint64_t ntokens;
    uint64_t block_size;
    size_t medium_at; /* its bytes' position, when has_medium */
    uint64_t medium_len;
    int has_medium;
} Event;

/* Skip one object as skip() does, and -1 where msgpack.unpackb(raw=False) would fail on
 * it or give something unusual: a str that is no UTF-8, a map key that is an array or a map
 * (unhashable), an ext type (msgpack's timestamps have rules of their own), nesting deeper
 * than 32. What scan skips must decode in Python without error, or the batch is not plain:
 * the Python path must meet the same events. */
static int
skip_valid(Reader *r, int depth)
{
    int kind;
    uint64_t n;
    size_t size;
    if (depth > 32 || header(r, &kind, &n, &size) < 0) {
        return -1;
    }
    const uint8_t b = r->p[r->pos];
    if ((b >= 0xc7 && b <= 0xc9) || (b >= 0xd4 && b <= 0xd8)) {
        return -1; /* ext */
    }
    r->pos += size;
    if (kind == K_STR || kind == K_BIN) {
        if (!need(r, n)) {
            return -1;
        }
        if (kind == K_STR) {
            PyObject *text = PyUnicode_DecodeUTF8((const char *)r->p + r->pos, (Py_ssize_t)n,
                                                  "strict");
            if (text == NULL) {
                PyErr_Clear();
                return -1;
            }
            Py_DECREF(text);
        }
        r->pos += n;
        return 0;
    }
    if (kind == K_ARRAY || kind == K_MAP) {
        if (n > r->len - r->pos) {
            return -1;
        }
        for (uint64_t i = 0; i < n; i++) {
            if (kind == K_MAP) {
                int kkind;
                uint64_t kn;
                size_t ksize;
                if (header(r, &kkind, &kn, &ksize) < 0 || kkind == K_ARRAY || kkind == K_MAP ||
                    skip_valid(r, depth + 1) < 0) {
                    return -1;
                }
            }
            if (skip_valid(r, depth + 1) < 0) {
                return -1;
            }
        }
    }
    return 0;
}

static int
is_nil(const Reader *r)
{
    return need(r, 1) && r->p[r->pos] == 0xc0;
}

/* An array of u64s (`max` bounds each) at r->pos: its length and first item's position,
 * moved past it. 0, or -1 when it is something else. */
static int
read_ints(Reader *r, uint64_t max, size_t *at, uint64_t *n)
{
    int kind;
    size_t size;
    if (header(r, &kind, n, &size) < 0 || kind != K_ARRAY || *n > r->len - r->pos) {
        return -1;
    }
    r->pos += size;
    *at = r->pos;
    for (uint64_t i = 0; i < *n; i++) {
        uint64_t v;
        if (read_u64(r, &v) < 0 || v > max) {
            return -1;
        }
    }
    return 0;
}

/* A medium field (nil or a str) at r->pos, moved past. 0, or -1. */
static int
read_medium(Reader *r, Event *ev)
{
    int kind;
    uint64_t n;
    size_t size;
    if (is_nil(r)) {
        r->pos += 1;
        return 0;
    }
    if (header(r, &kind, &n, &size) < 0 || kind != K_STR || !need(r, size + n)) {
        return -1;
    }
    ev->has_medium = 1;
    ev->medium_at = r->pos + size;
    ev->medium_len = n;
    r->pos += size + n;
    return 0;
}

/* No cache_salt for a chain's first block (see kvcache.events.first_block_salt): extra_keys
 * nil, empty, or whose first entry is no array. Moves past it. 0, or -1. */
static int
read_extra_keys(Reader *r)
{
    int kind;
    uint64_t n;
    size_t size;
    if (is_nil(r)) {
        r->pos += 1;
        return 0;
    }
    if (header(r, &kind, &n, &size) < 0 || kind != K_ARRAY) {
        return -1;
    }
    if (n > 0) {
        Reader first = *r;
        first.pos += size;
        int fkind;
        uint64_t fn;
        size_t fsize;
        if (header(&first, &fkind, &fn, &fsize) < 0 || fkind == K_ARRAY) {
            return -1;
        }
    }
    return skip_valid(r, 1);
}

/* The event at r->pos, moved past it: 0 when it is plain (see the module), -1 otherwise. */
static int
read_event(Reader *r, Event *ev)
{
    int kind;
    uint64_t fields;
    size_t size;
    memset(ev, 0, sizeof(*ev));
    if (header(r, &kind, &fields, &size) < 0 || kind != K_ARRAY || fields < 2) {
        return -1;
    }
    r->pos += size;
    if (is_str(r, "BlockStored")) {
        ev->stored = 1;
        if (fields < 5) {
            return -1;
        }
    }
    else if (!is_str(r, "BlockRemoved")) {
        return -1;
    }
    if (skip(r) < 0 || read_ints(r, UINT64_MAX, &ev->hashes_at, &ev->nhashes) < 0) {
        return -1;
    }
    uint64_t f = 2;
    if (ev->stored) {
        if (ev->nhashes == 0) {
            return -1;
        }
        if (is_nil(r)) {
            r->pos += 1;
        }
        else if (read_u64(r, &ev->parent) == 0) {
            ev->has_parent = 1;
        }
        else {
            return -1;
        }
        if (read_ints(r, UINT32_MAX, &ev->tokens_at, &ev->ntokens) < 0 || ev->ntokens == 0 ||
            read_u64(r, &ev->block_size) < 0) {
            return -1;
        }
        f = 5;
        if (f < fields) { /* lora_id */
            if (!is_nil(r)) {
                return -1;
            }
            r->pos += 1;
            f++;
        }
        if (f < fields) {
            if (read_medium(r, ev) < 0) {
                return -1;
            }
            f++;
        }
        if (f < fields) { /* lora_name (SGLang's salt metadata sits here too) */
            if (!is_nil(r)) {
                return -1;
            }
            r->pos += 1;
            f++;
        }
        if (f < fields) {
            if ((ev->has_parent ? skip_valid(r, 1) : read_extra_keys(r)) < 0) {
                return -1;
            }
            f++;
        }
    }
    else if (f < fields) {
        if (read_medium(r, ev) < 0) {
            return -1;
        }
        f++;
    }
    for (; f < fields; f++) { /* fields newer than this reader */
        if (skip_valid(r, 1) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The u64 at `at` (a valid item of an array read_ints accepted); moves *at past it. */
static uint64_t
item(const uint8_t *p, size_t len, size_t *at)
{
    Reader r = {p, len, *at};
    uint64_t v = 0;
    (void)read_u64(&r, &v);
    *at = r.pos;
    return v;
}

/* ---- scan ------------------------------------------------------------------------------ */

/* The batch header and ts at r->pos; moves to the events. 0, or -1. */
static int
read_batch_head(Reader *r, uint64_t *items, double *ts)
{
    int kind;
    uint64_t n;
    size_t size;
    if (header(r, &kind, items, &size) < 0 || kind != K_ARRAY || *items < 2) {
        return -1;
    }
    r->pos += size;
    const uint8_t *p = r->p + r->pos;
    if (need(r, 9) && p[0] == 0xcb) {
        uint64_t bits = be(p + 1, 8);
        memcpy(ts, &bits, 8);
        r->pos += 9;
        return 0;
    }
    if (need(r, 5) && p[0] == 0xca) {
        uint32_t bits = (uint32_t)be(p + 1, 4);
        float f;
        memcpy(&f, &bits, 4);
        *ts = f;
        r->pos += 5;
        return 0;
    }
    if (header(r, &kind, &n, &size) < 0 || (kind != K_UINT && kind != K_INT)) {
        return -1;
    }
    *ts = kind == K_INT ? (double)(int64_t)n : (double)n;
    r->pos += size;
    return 0;
}

PyDoc_STRVAR(scan_doc,
             "scan(payload) -> (ts, dp_rank, medium, events) | None\n\n"
             "A plain batch's timestamp, DP rank (None if absent or no int), medium (the\n"
             "events' one, None if they name none) and number of events; None when the\n"
             "batch is not plain (see the module).");

static PyObject *
scan(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "payload must be bytes");
        return NULL;
    }
    Reader r = {(const uint8_t *)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), 0};
    uint64_t items, n;
    double ts;
    int kind;
    size_t size;
    if (read_batch_head(&r, &items, &ts) < 0 || header(&r, &kind, &n, &size) < 0 ||
        kind != K_ARRAY || n == 0 || n > r.len - r.pos) {
        Py_RETURN_NONE;
    }
    r.pos += size;
    Event ev, first;
    for (uint64_t i = 0; i < n; i++) {
        if (read_event(&r, &ev) < 0) {
            Py_RETURN_NONE;
        }
        if (i == 0) {
            first = ev;
        }
        else if (ev.has_medium != first.has_medium ||
                 (ev.has_medium &&
                  (ev.medium_len != first.medium_len ||
                   memcmp(r.p + ev.medium_at, r.p + first.medium_at, ev.medium_len) != 0))) {
            Py_RETURN_NONE;
        }
    }
    PyObject *rank = Py_None;
    Py_INCREF(rank);
    if (items > 2) {
        uint64_t v;
        if (header(&r, &kind, &v, &size) == 0 && (kind == K_UINT || kind == K_INT)) {
            Py_DECREF(rank);
            rank = kind == K_INT ? PyLong_FromLongLong((long long)(int64_t)v)
                                 : PyLong_FromUnsignedLongLong(v);
            if (rank == NULL) {
                return NULL;
            }
        }
    }
    for (uint64_t i = 2; i < items; i++) {
        if (skip_valid(&r, 1) < 0) {
            Py_DECREF(rank);
            Py_RETURN_NONE;
        }
    }
    if (r.pos != r.len) {
        Py_DECREF(rank);
        Py_RETURN_NONE; /* bytes after the batch: the decoder's error to give */
    }
    PyObject *medium;
    if (first.has_medium) {
        medium = PyUnicode_DecodeUTF8((const char *)r.p + first.medium_at,
                                      (Py_ssize_t)first.medium_len, "strict");
        if (medium == NULL) {
            PyErr_Clear(); /* msgpack refuses it too: its error to give */
            Py_DECREF(rank);
            Py_RETURN_NONE;
        }
    }
    else {
        medium = Py_None;
        Py_INCREF(medium);
    }
    return Py_BuildValue("(dNNK)", ts, rank, medium, (unsigned long long)n);
}

/* ---- apply ----------------------------------------------------------------------------- */

typedef struct {
    U64Map *emap;
    U64Map *index;
    uint64_t bit;
    uint64_t seed;
    uint64_t block_size;
    size_t max_keys;
    int removals; /* the publisher's maps are this namespace's only: removals resolve here */
    /* what was done */
    size_t stored_events, stored_blocks, removed_events, removed_blocks, unknown_removals;
    size_t evicted;
    uint32_t *tokens;
    size_t tokens_cap;
    uint64_t *keys;
    size_t keys_cap;
} Apply;

/* Room for `n` u32 tokens and `k` keys in the scratch buffers. 0, or -1. */
static int
scratch(Apply *a, size_t n, size_t k)
{
    return grow((void **)&a->tokens, &a->tokens_cap, n, sizeof(uint32_t)) < 0 ||
                   grow((void **)&a->keys, &a->keys_cap, k, sizeof(uint64_t)) < 0
               ? -1
               : 0;
}

/* A stored event: 1 applied, 0 left for Python, -1 MemoryError (also left for Python: nothing
 * was changed but the maps' capacity). */
static int
apply_stored(Apply *a, const uint8_t *p, size_t len, const Event *ev)
{
    const uint64_t bs = a->block_size;
    if (ev->block_size != 0 && ev->block_size != bs) {
        return 0; /* ev.block_size or reg.block_size: another engine block size */
    }
    uint64_t parent_key = 0;
    if (ev->has_parent) {
        const Entry *e = find(a->emap, ev->parent);
        if (e == NULL) {
            return 0; /* another namespace's chain, or an orphan */
        }
        parent_key = e->value;
    }
    size_t at = ev->hashes_at;
    if (find(a->emap, item(p, len, &at)) != NULL) {
        return 0; /* stored again: its keys are known */
    }
    const uint64_t n = ev->nhashes < ev->ntokens / bs ? ev->nhashes : ev->ntokens / bs;
    if (n == 0) {
        return 0;
    }
    if (scratch(a, (size_t)(n * bs), (size_t)(2 * n)) < 0) {
        return -1;
    }
    uint64_t *hashes = a->keys + n; /* the event's first n engine hashes */
    at = ev->hashes_at;
    for (uint64_t b = 0; b < n; b++) {
        hashes[b] = item(p, len, &at);
    }
    at = ev->tokens_at;
    for (uint64_t i = 0; i < n * bs; i++) {
        a->tokens[i] = (uint32_t)item(p, len, &at);
    }
    uint64_t pair[2] = {parent_key, 0};
    int chained = ev->has_parent;
    for (uint64_t b = 0; b < n; b++) {
        a->keys[b] = chain_step(pair, &chained, a->tokens + b * bs, (size_t)(bs * 4), a->seed);
    }
    /* room in both maps first: a MemoryError then leaves both as they were, and Python
     * applies the event whole */
    if (room(a->emap, (size_t)n) < 0 || room(a->index, (size_t)n) < 0) {
        return -1;
    }
    /* the engine map, then the index: EngineMaps.stored, then ConductorIndex.add; a chunk
     * of slots fetched from memory together first, as U64Map's own writes do */
    for (uint64_t start = 0; start < n; start += 32) {
        const uint64_t end = n - start < 32 ? n : start + 32;
        for (uint64_t b = start; b < end; b++) {
            __builtin_prefetch(&a->emap->index[hash32(hashes[b]) & (a->emap->cap - 1)], 1);
            __builtin_prefetch(&a->index->index[hash32(a->keys[b]) & (a->index->cap - 1)], 1);
        }
        for (uint64_t b = start; b < end; b++) {
            upsert(a->emap, hashes[b])->value = a->keys[b]; /* room made: no NULL */
        }
    }
    evict_oldest(a->emap, a->max_keys);
    for (uint64_t b = 0; b < n; b++) {
        upsert(a->index, a->keys[b])->value |= a->bit;
    }
    a->evicted += evict_oldest(a->index, a->max_keys);
    a->stored_events++;
    a->stored_blocks += (size_t)n;
    return 1;
}

/* A removal (engine hashes resolved in this namespace's map): 1 applied, 0 left. */
static int
apply_removed(Apply *a, const uint8_t *p, size_t len, const Event *ev)
{
    if (!a->removals) {
        return 0;
    }
    size_t at = ev->hashes_at;
    for (uint64_t i = 0; i < ev->nhashes; i++) {
        const Entry *e = find(a->emap, item(p, len, &at));
        if (e == NULL) {
            a->unknown_removals++;
            continue;
        }
        size_t slot;
        const Py_ssize_t pos = lookup(a->index, e->value, &slot);
        if (pos < 0 || !(a->index->entries[pos].value & a->bit)) {
            continue;
        }
        a->removed_blocks++;
        a->index->entries[pos].value &= ~a->bit;
        if (a->index->entries[pos].value == 0) {
            delete_at(a->index, (size_t)pos, slot);
        }
    }
    a->removed_events++;
    return 1;
}

PyDoc_STRVAR(apply_doc,
             "apply(payload, engine_map, index, bit, seed, block_size, max_keys, removals)\n"
             "    -> (events, stored_events, stored_blocks, removed_events, removed_blocks,\n"
             "        unknown_removals, evicted_keys)\n\n"
             "Apply the plain batch `payload` (scan said so) of one publisher: its engine-hash\n"
             "map and the index's map of its namespace and medium (U64Maps), its bit there,\n"
             "the hash seed, the registration's block size, the maps' bound, and whether\n"
             "removals resolve in this map alone. `events`: how many, from the first, were\n"
             "applied; the rest are the Python path's. The rest: what they did.");

/* The caller ran scan on `payload` (it is plain: every event's shape, one medium); what
 * apply still checks is what decides, event by event, between C and Python. */
static PyObject *
apply(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "apply takes 8 arguments");
        return NULL;
    }
    if (!PyBytes_Check(args[0]) || Py_TYPE(args[1]) != U64MapType ||
        Py_TYPE(args[2]) != U64MapType) {
        PyErr_SetString(PyExc_TypeError, "apply takes bytes and two U64Maps");
        return NULL;
    }
    Apply a;
    memset(&a, 0, sizeof(a));
    a.emap = (U64Map *)args[1];
    a.index = (U64Map *)args[2];
    a.bit = PyLong_AsUnsignedLongLong(args[3]);
    if (a.bit == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *seed = PyNumber_Index(args[4]);
    if (seed == NULL) {
        return NULL;
    }
    a.seed = PyLong_AsUnsignedLongLongMask(seed); /* modulo 2**64, as native/_chain.c */
    Py_DECREF(seed);
    if (a.seed == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    a.block_size = PyLong_AsUnsignedLongLong(args[5]);
    if (a.block_size == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t max_keys = PyLong_AsSsize_t(args[6]);
    if (max_keys == -1 && PyErr_Occurred()) {
        return NULL;
    }
    a.removals = PyObject_IsTrue(args[7]);
    if (a.removals < 0) {
        return NULL;
    }
    if (a.bit == 0 || a.block_size == 0 || max_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "apply: bit and block_size must be > 0, max_keys >= 0");
        return NULL;
    }
    a.max_keys = (size_t)max_keys;
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(args[0]);
    const size_t len = (size_t)PyBytes_GET_SIZE(args[0]);
    Reader r = {p, len, 0};
    uint64_t items, n = 0, done = 0;
    double ts;
    int kind;
    size_t size;
    if (read_batch_head(&r, &items, &ts) == 0 && header(&r, &kind, &n, &size) == 0 &&
        kind == K_ARRAY) {
        r.pos += size;
        for (; done < n; done++) {
            Event ev;
            if (read_event(&r, &ev) < 0) {
                break; /* scan said plain: cannot be */
            }
            const int rc = ev.stored ? apply_stored(&a, p, len, &ev)
                                     : apply_removed(&a, p, len, &ev);
            if (rc < 0) {
                PyErr_Clear(); /* the rest in Python, which meets the MemoryError itself */
            }
            if (rc <= 0) {
                break;
            }
        }
    }
    PyMem_Free(a.tokens);
    PyMem_Free(a.keys);
    return Py_BuildValue("(KKKKKKK)", (unsigned long long)done,
                         (unsigned long long)a.stored_events,
                         (unsigned long long)a.stored_blocks,
                         (unsigned long long)a.removed_events,
                         (unsigned long long)a.removed_blocks,
                         (unsigned long long)a.unknown_removals,
                         (unsigned long long)a.evicted);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)scan, METH_O, scan_doc},
    {"apply", (PyCFunction)(void (*)(void))apply, METH_FASTCALL, apply_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "heimdall_proxy.native._vllm_ingest",
    "vLLM's plain KV-event batches applied natively (see conductor.native_ingest).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__vllm_ingest(void)
{
    if (XXH_versionNumber() < XXH3_FROZEN) {
        PyErr_Format(PyExc_ImportError,
                     "libxxhash %u is older than 0.8.0, whose XXH3 the keys follow",
                     XXH_versionNumber());
        return NULL;
    }
    PyObject *maps = PyImport_ImportModule("heimdall_proxy.native._u64map");
    if (maps == NULL) {
        return NULL;
    }
    PyObject *type = PyObject_GetAttrString(maps, "U64Map");
    Py_DECREF(maps);
    if (type == NULL) {
        return NULL;
    }
    if (!PyType_Check(type) ||
        ((PyTypeObject *)type)->tp_basicsize != (Py_ssize_t)sizeof(U64Map)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_ImportError, "U64Map's layout is not this module's");
        return NULL;
    }
    U64MapType = (PyTypeObject *)type; /* kept for the process's life */
    return PyModule_Create(&module);
}
