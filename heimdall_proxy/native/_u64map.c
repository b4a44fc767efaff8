/* U64Map: a hash map from u64 to u64 that keeps the order keys were first written in.
 *
 * The conductor's two big maps hold one entry per block: the index (our key -> the bitmask
 * of the sources holding it, per namespace and medium) and each publisher's engine-hash map
 * (the engine's hash -> our key). As dicts of ints every entry also costs two long-lived int
 * objects (~130 bytes a block with the dict's own slots), and at millions of blocks writing
 * them is mostly cache and page misses: at 64 x 100,000 vLLM blocks the two dict updates
 * took ~0.8 us of the ~1.8 us each block cost.
 *
 * The layout is CPython's dict's, without objects: entries (key, value) are appended in an
 * array, in the order they were first written, and an index of 8-byte slots (the entry's
 * position and 32 bits of the key's hash) is probed linearly. A new key thus costs one
 * random write in a table of 8-byte slots and one write at the end of the entries; its key
 * is read back only when the hash bits match. Deleting frees the index slot (shifting back
 * the probe run after it, so there are no tombstones) and marks the entry dead; dead entries
 * are squeezed out, order kept, when the entries array fills. `evict_oldest` deletes from
 * the front of it, with the count kvcache.index.keys.evict_oldest gives for a dict.
 *
 * Reads are lenient like dict.get: a key that is no int in [0, 2**64) is simply absent.
 * Writes are strict: such a key or value raises OverflowError (TypeError for a non-int);
 * conductor.engine_map then moves the map to a DictMap, which takes any int, and writes
 * again (every write method is idempotent). A MemoryError leaves the map as it was before
 * the chunk of keys being written. tests/conductor/test_u64map.py holds it to a dict.
 */
#define PY_SSIZE_T_CLEAN
#include "_u64map.h"

/* ---- sequences of u64: a list or tuple of ints, or a buffer of 8-byte unsigned ---------- */

typedef struct {
    PyObject *fast;
    Py_buffer view;
    int is_buffer;
    Py_ssize_t n;
} Seq;

static int
seq_open(PyObject *obj, Seq *s, const char *what)
{
    s->fast = NULL;
    s->is_buffer = 0;
    if (PyObject_CheckBuffer(obj)) {
        if (PyObject_GetBuffer(obj, &s->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            return -1;
        }
        const char *f = s->view.format ? s->view.format : "B";
        if (s->view.itemsize != 8 || (strcmp(f, "Q") != 0 && strcmp(f, "L") != 0)) {
            PyBuffer_Release(&s->view);
            PyErr_Format(PyExc_TypeError, "%s: a buffer must hold u64 ('Q')", what);
            return -1;
        }
        s->is_buffer = 1;
        s->n = s->view.len / 8;
        return 0;
    }
    s->fast = PySequence_Fast(obj, what);
    if (s->fast == NULL) {
        return -1;
    }
    s->n = PySequence_Fast_GET_SIZE(s->fast);
    return 0;
}

static void
seq_close(Seq *s)
{
    if (s->is_buffer) {
        PyBuffer_Release(&s->view);
    }
    Py_XDECREF(s->fast);
}

/* An int in [0, 2**64): 0 and *out set; -1 with OverflowError or TypeError otherwise. */
static int
as_u64(PyObject *obj, uint64_t *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "an int is required, not %.100s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1; /* OverflowError: negative or wider than 64 bits */
    }
    *out = (uint64_t)v;
    return 0;
}

static int
seq_get(const Seq *s, Py_ssize_t i, uint64_t *out)
{
    if (s->is_buffer) {
        memcpy(out, (const char *)s->view.buf + 8 * i, 8);
        return 0;
    }
    return as_u64(PySequence_Fast_GET_ITEM(s->fast, i), out);
}

/* A key to look up: 1 and *out set, 0 when it cannot be in the map (no error left). */
static int
lookup_key(PyObject *obj, uint64_t *out)
{
    if (as_u64(obj, out) == 0) {
        return 1;
    }
    PyErr_Clear();
    return 0;
}

/* ---- the type ------------------------------------------------------------------------- */

static PyObject *
U64Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "U64Map() takes no arguments");
        return NULL;
    }
    U64Map *m = (U64Map *)type->tp_alloc(type, 0);
    return (PyObject *)m; /* zeroed: empty, no tables */
}

static void
release(U64Map *m)
{
    free(m->index);
    PyMem_RawFree(m->entries);
    PyMem_RawFree(m->dead);
    m->index = NULL;
    m->entries = NULL;
    m->dead = NULL;
    m->cap = m->used = m->nentries = m->entries_cap = m->first = 0;
}

static void
U64Map_dealloc(U64Map *m)
{
    release(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static Py_ssize_t
U64Map_len(U64Map *m)
{
    return (Py_ssize_t)m->used;
}

static int
U64Map_contains(U64Map *m, PyObject *key)
{
    uint64_t k;
    return lookup_key(key, &k) && find(m, k) != NULL;
}

static PyObject *
U64Map_subscript(U64Map *m, PyObject *key)
{
    uint64_t k;
    const Entry *s = lookup_key(key, &k) ? find(m, k) : NULL;
    if (s == NULL) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(s->value);
}

PyDoc_STRVAR(get_doc, "get(key, default=None) -> int | default\n\nAs dict.get.");

static PyObject *
U64Map_get(U64Map *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get takes a key and an optional default");
        return NULL;
    }
    uint64_t k;
    const Entry *s = lookup_key(args[0], &k) ? find(m, k) : NULL;
    if (s != NULL) {
        return PyLong_FromUnsignedLongLong(s->value);
    }
    PyObject *dflt = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(dflt);
    return dflt;
}

PyDoc_STRVAR(get_many_doc,
             "get_many(keys, default) -> list\n\n"
             "[get(key, default) for key in keys], the slots of a chunk of keys fetched from\n"
             "memory together first (a query's walk reads hundreds of keys at a time).");

static PyObject *
U64Map_get_many(U64Map *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get_many takes keys and a default");
        return NULL;
    }
    Seq keys;
    if (seq_open(args[0], &keys, "get_many: keys") < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(keys.n);
    if (out == NULL) {
        seq_close(&keys);
        return NULL;
    }
    uint64_t ks[32];
    int present[32];
    for (Py_ssize_t start = 0; start < keys.n; start += 32) {
        const Py_ssize_t len = keys.n - start < 32 ? keys.n - start : 32;
        for (Py_ssize_t i = 0; i < len; i++) {
            present[i] = keys.is_buffer
                             ? (seq_get(&keys, start + i, &ks[i]), 1)
                             : lookup_key(PySequence_Fast_GET_ITEM(keys.fast, start + i), &ks[i]);
            if (present[i] && m->cap) {
                __builtin_prefetch(&m->index[hash32(ks[i]) & (m->cap - 1)], 0);
            }
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            const Entry *e = present[i] ? find(m, ks[i]) : NULL;
            PyObject *v = e != NULL ? PyLong_FromUnsignedLongLong(e->value) : args[1];
            if (v == NULL) {
                Py_DECREF(out);
                seq_close(&keys);
                return NULL;
            }
            if (e == NULL) {
                Py_INCREF(v);
            }
            PyList_SET_ITEM(out, start + i, v);
        }
    }
    seq_close(&keys);
    return out;
}

/* Keys are written a chunk at a time: the chunk's slots are fetched from memory together
 * first (a table of millions of keys misses the cache on nearly every probe, and misses
 * issued together overlap), then written in order. */
#define CHUNK 32

/* map[keys[i]] = values[i] (values given) or map[keys[i]] |= bit, for i < n. */
static int
write_many(U64Map *m, const Seq *keys, const Seq *values, uint64_t bit, Py_ssize_t n)
{
    uint64_t ks[CHUNK], vs[CHUNK];
    for (Py_ssize_t start = 0; start < n; start += CHUNK) {
        const Py_ssize_t len = n - start < CHUNK ? n - start : CHUNK;
        for (Py_ssize_t i = 0; i < len; i++) {
            if (seq_get(keys, start + i, &ks[i]) < 0 ||
                (values != NULL && seq_get(values, start + i, &vs[i]) < 0)) {
                return -1;
            }
        }
        if (room(m, (size_t)len) < 0) {
            return -1;
        }
        const size_t mask = m->cap - 1;
        for (Py_ssize_t i = 0; i < len; i++) {
            __builtin_prefetch(&m->index[hash32(ks[i]) & mask], 1);
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            Entry *s = upsert(m, ks[i]);
            if (s == NULL) {
                return -1;
            }
            if (values != NULL) {
                s->value = vs[i];
            }
            else {
                s->value |= bit;
            }
        }
    }
    return 0;
}

PyDoc_STRVAR(set_many_doc,
             "set_many(keys, values) -> None\n\n"
             "map[keys[i]] = values[i] for i < min(len(keys), len(values)); a new key is\n"
             "ordered after every key already held.");

static PyObject *
U64Map_set_many(U64Map *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_many takes keys and values");
        return NULL;
    }
    Seq keys, values;
    if (seq_open(args[0], &keys, "set_many: keys") < 0) {
        return NULL;
    }
    if (seq_open(args[1], &values, "set_many: values") < 0) {
        seq_close(&keys);
        return NULL;
    }
    const int rc = write_many(m, &keys, &values, 0, keys.n < values.n ? keys.n : values.n);
    seq_close(&keys);
    seq_close(&values);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The bit argument of or_bits, unset_bits and drop_bits: a non-zero u64. */
static int
bit_arg(PyObject *obj, uint64_t *bit)
{
    if (as_u64(obj, bit) < 0) {
        return -1;
    }
    if (*bit == 0) {
        PyErr_SetString(PyExc_ValueError, "the bit must not be 0");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(or_bits_doc,
             "or_bits(keys, bit) -> None\n\n"
             "map[key] |= bit for each key (a new key is added with bit, after the others).");

static PyObject *
U64Map_or_bits(U64Map *m, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t bit;
    Seq keys;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "or_bits takes keys and a bit");
        return NULL;
    }
    if (bit_arg(args[1], &bit) < 0 || seq_open(args[0], &keys, "or_bits: keys") < 0) {
        return NULL;
    }
    const int rc = write_many(m, &keys, NULL, bit, keys.n);
    seq_close(&keys);
    if (rc < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(unset_bits_doc,
             "unset_bits(keys, bit) -> int\n\n"
             "Clear bit on each key that has it, deleting a key left at 0; how many had it.\n"
             "Keys that are no u64 are absent.");

static PyObject *
U64Map_unset_bits(U64Map *m, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t bit;
    Seq keys;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unset_bits takes keys and a bit");
        return NULL;
    }
    if (bit_arg(args[1], &bit) < 0 || seq_open(args[0], &keys, "unset_bits: keys") < 0) {
        return NULL;
    }
    Py_ssize_t n = 0;
    uint64_t ks[CHUNK];
    for (Py_ssize_t start = 0; start < keys.n; start += CHUNK) {
        Py_ssize_t len = 0; /* the chunk's keys that can be in the map */
        for (Py_ssize_t i = start; i < keys.n && i < start + CHUNK; i++) {
            if (keys.is_buffer) {
                seq_get(&keys, i, &ks[len++]);
            }
            else if (lookup_key(PySequence_Fast_GET_ITEM(keys.fast, i), &ks[len])) {
                len++;
            }
        }
        if (m->cap == 0) {
            break;
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            __builtin_prefetch(&m->index[hash32(ks[i]) & (m->cap - 1)], 0);
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            size_t slot;
            const Py_ssize_t pos = lookup(m, ks[i], &slot);
            if (pos < 0 || !(m->entries[pos].value & bit)) {
                continue;
            }
            n++;
            m->entries[pos].value &= ~bit;
            if (m->entries[pos].value == 0) {
                delete_at(m, (size_t)pos, slot);
            }
        }
    }
    seq_close(&keys);
    return PyLong_FromSsize_t(n);
}

PyDoc_STRVAR(drop_bits_doc,
             "drop_bits(bit) -> int\n\n"
             "unset_bits over every key: a pass over the entries, then the keys left at 0\n"
             "deleted one by one, or (more than a quarter of them) the entries squeezed and\n"
             "the index rebuilt once. How many keys had the bit.");

static PyObject *
U64Map_drop_bits(U64Map *m, PyObject *arg)
{
    uint64_t bit;
    if (bit_arg(arg, &bit) < 0) {
        return NULL;
    }
    /* a pass over the entries (in order, no probe) finds the keys with the bit and those it
     * leaves at 0; few of those: each is deleted from the index; many: the entries are
     * squeezed and a fitting index built over them, once */
    size_t n = 0, emptied = 0;
    for (size_t pos = m->first; pos < m->nentries; pos++) {
        const uint64_t v = m->entries[pos].value;
        if (!m->dead[pos] && (v & bit)) {
            n++;
            emptied += (v & ~bit) == 0;
        }
    }
    const int rebuild = emptied * 4 > m->used;
    uint64_t *index = NULL;
    if (rebuild) {
        index = new_index(fitting(m->used - emptied)); /* first: nothing is changed yet */
        if (index == NULL) {
            return PyErr_NoMemory();
        }
    }
    for (size_t pos = m->first; n && pos < m->nentries; pos++) {
        Entry *e = &m->entries[pos];
        if (m->dead[pos] || !(e->value & bit)) {
            continue;
        }
        e->value &= ~bit;
        if (e->value != 0) {
            continue;
        }
        if (rebuild) {
            m->dead[pos] = 1;
            m->used--;
        }
        else {
            size_t slot;
            if (lookup(m, e->key, &slot) >= 0) {
                delete_at(m, pos, slot);
            }
        }
    }
    if (rebuild) {
        squeeze(m);
        install(m, index, fitting(m->used));
        if (m->used * 4 < m->entries_cap && resize_entries(m, m->used + 16) < 0) {
            PyErr_Clear(); /* the memory is not given back; the map is whole */
        }
    }
    return PyLong_FromSize_t(n);
}

PyDoc_STRVAR(evict_oldest_doc,
             "evict_oldest(max_keys) -> int\n\n"
             "As kvcache.index.keys.evict_oldest: past max_keys, delete the oldest-written\n"
             "keys beyond it and max(1, max_keys // 64) more; how many (0 within bounds).");

static PyObject *
U64Map_evict_oldest(U64Map *m, PyObject *arg)
{
    Py_ssize_t max_keys = PyLong_AsSsize_t(arg);
    if (max_keys == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (max_keys < 0) {
        PyErr_SetString(PyExc_ValueError, "max_keys must be >= 0");
        return NULL;
    }
    return PyLong_FromSize_t(evict_oldest(m, (size_t)max_keys));
}

/* Calls f(key, value) for the live entries in order; -1 stops with an error. */
typedef int (*visit_fn)(PyObject *list, uint64_t key, uint64_t value);

static PyObject *
ordered(U64Map *m, visit_fn f)
{
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (size_t pos = m->first; pos < m->nentries; pos++) {
        const Entry e = m->entries[pos];
        if (!m->dead[pos] && f(out, e.key, e.value) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static int
append_key(PyObject *list, uint64_t key, uint64_t value)
{
    (void)value;
    PyObject *k = PyLong_FromUnsignedLongLong(key);
    int rc = k == NULL ? -1 : PyList_Append(list, k);
    Py_XDECREF(k);
    return rc;
}

static int
append_item(PyObject *list, uint64_t key, uint64_t value)
{
    PyObject *item = Py_BuildValue("(KK)", (unsigned long long)key, (unsigned long long)value);
    int rc = item == NULL ? -1 : PyList_Append(list, item);
    Py_XDECREF(item);
    return rc;
}

static PyObject *
U64Map_keys(U64Map *m, PyObject *unused)
{
    (void)unused;
    return ordered(m, append_key);
}

static PyObject *
U64Map_items(U64Map *m, PyObject *unused)
{
    (void)unused;
    return ordered(m, append_item);
}

static PyObject *
U64Map_iter(U64Map *m)
{
    PyObject *keys = ordered(m, append_key);
    if (keys == NULL) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return it;
}

static PyObject *
U64Map_clear(U64Map *m, PyObject *unused)
{
    (void)unused;
    release(m);
    Py_RETURN_NONE;
}

/* Pickling (ingest workers hand their maps to tests): the pairs in order, set back. */
static PyObject *
U64Map_reduce(U64Map *m, PyObject *unused)
{
    (void)unused;
    PyObject *items = ordered(m, append_item);
    if (items == NULL) {
        return NULL;
    }
    return Py_BuildValue("(O()N)", (PyObject *)Py_TYPE(m), items);
}

static PyObject *
U64Map_setstate(U64Map *m, PyObject *items)
{
    PyObject *fast = PySequence_Fast(items, "__setstate__ takes (key, value) pairs");
    if (fast == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        uint64_t k, v;
        Entry *s;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "__setstate__ takes (key, value) pairs");
            Py_DECREF(fast);
            return NULL;
        }
        if (as_u64(PyTuple_GET_ITEM(pair, 0), &k) < 0 ||
            as_u64(PyTuple_GET_ITEM(pair, 1), &v) < 0 || (s = upsert(m, k)) == NULL) {
            Py_DECREF(fast);
            return NULL;
        }
        s->value = v;
    }
    Py_DECREF(fast);
    Py_RETURN_NONE;
}

/* Whether `dict` holds the same pairs as `m`. */
static int
equals_dict(const U64Map *m, PyObject *dict)
{
    if ((size_t)PyDict_GET_SIZE(dict) != m->used) {
        return 0;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        uint64_t k, v;
        const Entry *s = lookup_key(key, &k) ? find(m, k) : NULL;
        if (s == NULL || !lookup_key(value, &v) || v != s->value) {
            return 0;
        }
    }
    return 1;
}

/* Equal to a U64Map or a dict with the same pairs (the order aside, as dicts compare). */
static PyObject *
U64Map_richcompare(PyObject *a, PyObject *b, int op)
{
    if (op != Py_EQ && op != Py_NE) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    const U64Map *x = (const U64Map *)a;
    int equal;
    if (PyDict_Check(b)) {
        equal = equals_dict(x, b);
    }
    else if (Py_TYPE(b) == Py_TYPE(a)) {
        const U64Map *y = (const U64Map *)b;
        equal = x->used == y->used;
        for (size_t pos = x->first; equal && pos < x->nentries; pos++) {
            if (!x->dead[pos]) {
                const Entry *t = find(y, x->entries[pos].key);
                equal = t != NULL && t->value == x->entries[pos].value;
            }
        }
    }
    else {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (equal == (op == Py_EQ)) {
        Py_RETURN_TRUE;
    }
    Py_RETURN_FALSE;
}

static PyObject *
U64Map_repr(U64Map *m)
{
    return PyUnicode_FromFormat("U64Map(<%zu keys>)", m->used);
}

static PyObject *
U64Map_sizeof(U64Map *m, PyObject *unused)
{
    (void)unused;
    return PyLong_FromSize_t(sizeof(U64Map) + m->cap * sizeof(uint64_t) +
                             m->entries_cap * (sizeof(Entry) + 1));
}

static PyMethodDef U64Map_methods[] = {
    {"__sizeof__", (PyCFunction)U64Map_sizeof, METH_NOARGS, "The map's memory, in bytes."},
    {"__reduce__", (PyCFunction)U64Map_reduce, METH_NOARGS, NULL},
    {"__setstate__", (PyCFunction)U64Map_setstate, METH_O, NULL},
    {"get", (PyCFunction)(void (*)(void))U64Map_get, METH_FASTCALL, get_doc},
    {"get_many", (PyCFunction)(void (*)(void))U64Map_get_many, METH_FASTCALL, get_many_doc},
    {"set_many", (PyCFunction)(void (*)(void))U64Map_set_many, METH_FASTCALL, set_many_doc},
    {"or_bits", (PyCFunction)(void (*)(void))U64Map_or_bits, METH_FASTCALL, or_bits_doc},
    {"unset_bits", (PyCFunction)(void (*)(void))U64Map_unset_bits, METH_FASTCALL,
     unset_bits_doc},
    {"drop_bits", (PyCFunction)U64Map_drop_bits, METH_O, drop_bits_doc},
    {"evict_oldest", (PyCFunction)U64Map_evict_oldest, METH_O, evict_oldest_doc},
    {"keys", (PyCFunction)U64Map_keys, METH_NOARGS, "The keys, oldest-written first."},
    {"items", (PyCFunction)U64Map_items, METH_NOARGS,
     "(key, value) pairs, oldest-written first."},
    {"clear", (PyCFunction)U64Map_clear, METH_NOARGS, "Remove every key; free the table."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods U64Map_as_sequence = {
    .sq_contains = (objobjproc)U64Map_contains,
};

static PyMappingMethods U64Map_as_mapping = {
    .mp_length = (lenfunc)U64Map_len,
    .mp_subscript = (binaryfunc)U64Map_subscript,
};

static PyTypeObject U64MapType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "heimdall_proxy.native._u64map.U64Map",
    .tp_doc = PyDoc_STR("A map from u64 to u64 in first-written order (see the module)."),
    .tp_basicsize = sizeof(U64Map),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = U64Map_new,
    .tp_dealloc = (destructor)U64Map_dealloc,
    .tp_as_sequence = &U64Map_as_sequence,
    .tp_as_mapping = &U64Map_as_mapping,
    .tp_iter = (getiterfunc)U64Map_iter,
    .tp_richcompare = U64Map_richcompare,
    .tp_repr = (reprfunc)U64Map_repr,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_methods = U64Map_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "heimdall_proxy.native._u64map",
    "U64Map, the conductor's native map from u64 to u64 (see conductor.tables).",
    -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__u64map(void)
{
    if (PyType_Ready(&U64MapType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&U64MapType);
    if (PyModule_AddObject(m, "U64Map", (PyObject *)&U64MapType) < 0) {
        Py_DECREF(&U64MapType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
