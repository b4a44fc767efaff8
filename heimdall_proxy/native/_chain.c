/* The rolling block keys of kvcache.hashing.block_keys, in C.
 *
 * Every vLLM block the conductor ingests and every block of a prompt a prefix scorer or the
 * conductor looks up is keyed by this chain:
 *
 *     local[i] = XXH3_64(tokens of block i as little-endian u32, S)
 *     seq[0]   = local[0], or XXH3_64(parent_le64 || local[0]_le64, S) when chained on parent
 *     seq[i]   = XXH3_64(seq[i-1]_le64 || local[i]_le64, S)
 *
 * In Python each block costs a u32 conversion of its tokens, two calls into xxhash and a
 * struct pack (~0.35 us); here the same work is ~0.06 us, with no Python object per block but
 * the key itself. The hash is xxHash's own XXH3_64bits_withSeed, from the system's libxxhash
 * (0.8.0 or later: XXH3's output is frozen since, so it equals the xxhash package's); the
 * extension is optional and kvcache.hashing keeps the Python loop for machines that cannot
 * build it. tests/kvcache/test_hashing.py holds both to the same answers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_chain.h" /* the chain step and xxHash's ABI (why it is declared, not included) */

#define STACK_TOKENS 256

/* Little-endian hosts only: the Python side does not call in on a big-endian one. */
static int
list_block(PyObject *tokens, Py_ssize_t start, Py_ssize_t size, uint32_t *out)
{
    for (Py_ssize_t j = 0; j < size; j++) {
        /* an item's __index__ may run Python code that shrinks the caller's list */
        if (start + j >= PyList_GET_SIZE(tokens)) {
            PyErr_SetString(PyExc_RuntimeError, "tokens changed size");
            return -1;
        }
        PyObject *item = PyList_GET_ITEM(tokens, start + j);
        unsigned long value;
        if (PyLong_Check(item)) {
            value = PyLong_AsUnsignedLong(item);
        }
        else {
            Py_INCREF(item);
            PyObject *index = PyNumber_Index(item); /* TypeError for a non-integer */
            Py_DECREF(item);
            if (index == NULL) {
                return -1;
            }
            value = PyLong_AsUnsignedLong(index);
            Py_DECREF(index);
        }
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            return -1; /* OverflowError for a negative id */
        }
        if (value > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "token id does not fit in 32 bits");
            return -1;
        }
        out[j] = (uint32_t)value;
    }
    return 0;
}

/* A chain being computed: blocks of `size` items, `n` of them, and the key so far. */
typedef struct {
    Py_ssize_t size;
    Py_ssize_t n;
    uint64_t seed;
    int chained;      /* pair[0] holds the previous key (or the parent) */
    uint64_t pair[2]; /* previous key, this block's local hash: what seq[i] hashes */
} Chain;

/* Hash one block of `bytes` bytes into slot b of `out`: its local hash, chained on the key
 * before it when there is one. */
static int
put_key(PyObject *out, Py_ssize_t b, const void *block, size_t bytes, Chain *c)
{
    const uint64_t key = chain_step(c->pair, &c->chained, block, bytes, c->seed);
    PyObject *value = PyLong_FromUnsignedLongLong(key);
    if (value == NULL) {
        return -1;
    }
    PyList_SET_ITEM(out, b, value);
    return 0;
}

/* The five arguments of both functions (`name`): after the tokens or text, block size
 * (> 0), seed (u64), parent (None or u64) and n (>= 0) blocks; -1 with an exception set when
 * one is wrong. */
static int
chain_args(const char *name, PyObject *const *all, Py_ssize_t nargs, Chain *c)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s takes 5 arguments", name);
        return -1;
    }
    PyObject *const *args = all + 1;
    c->size = PyLong_AsSsize_t(args[0]);
    if (c->size == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* modulo 2**64, as the xxhash package takes a seed */
    PyObject *seed_index = PyNumber_Index(args[1]);
    if (seed_index == NULL) {
        return -1;
    }
    c->seed = PyLong_AsUnsignedLongLongMask(seed_index);
    Py_DECREF(seed_index);
    if (c->seed == (uint64_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    c->chained = args[2] != Py_None;
    c->pair[0] = c->pair[1] = 0;
    if (c->chained) {
        c->pair[0] = PyLong_AsUnsignedLongLong(args[2]);
        if (c->pair[0] == (uint64_t)-1 && PyErr_Occurred()) {
            return -1;
        }
    }
    c->n = PyLong_AsSsize_t(args[3]);
    if (c->n == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (c->size <= 0 || c->n < 0 || c->n > PY_SSIZE_T_MAX / c->size) {
        PyErr_SetString(PyExc_ValueError, "block_size must be > 0 and n >= 0");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(block_keys_doc,
"block_keys(tokens, block_size, seed, parent, n) -> list[int]\n\n"
"The rolling keys of the first n blocks of block_size tokens, chained from parent (None:\n"
"from the root). tokens: a list of ids in [0, 2**32), or a buffer of u32 (array('I')) of\n"
"at least n * block_size items.");

static PyObject *
block_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Chain c;
    if (chain_args("block_keys", args, nargs, &c) < 0) {
        return NULL;
    }
    PyObject *tokens = args[0];
    const Py_ssize_t block_size = c.size, n = c.n;

    Py_buffer view = {0};
    const uint32_t *from_buffer = NULL;
    int is_list = PyList_CheckExact(tokens);
    Py_ssize_t available;
    if (is_list) {
        available = PyList_GET_SIZE(tokens);
    }
    else {
        if (PyObject_GetBuffer(tokens, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            return NULL;
        }
        if (view.itemsize != 4 || view.format == NULL || strcmp(view.format, "I") != 0) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "tokens must be a list or a buffer of u32");
            return NULL;
        }
        from_buffer = (const uint32_t *)view.buf;
        available = view.len / 4;
    }
    if (available / block_size < n) {
        if (!is_list) {
            PyBuffer_Release(&view);
        }
        PyErr_SetString(PyExc_ValueError, "fewer tokens than n blocks");
        return NULL;
    }

    uint32_t stack[STACK_TOKENS];
    uint32_t *scratch = stack;
    if (is_list && block_size > STACK_TOKENS) {
        scratch = PyMem_Malloc((size_t)block_size * sizeof(uint32_t));
        if (scratch == NULL) {
            return PyErr_NoMemory();
        }
    }
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        goto done;
    }
    const size_t bytes = (size_t)block_size * sizeof(uint32_t);
    for (Py_ssize_t b = 0; b < n; b++) {
        const uint32_t *block;
        if (is_list) {
            if (list_block(tokens, b * block_size, block_size, scratch) < 0) {
                Py_CLEAR(out);
                goto done;
            }
            block = scratch;
        }
        else {
            block = from_buffer + b * block_size;
        }
        if (put_key(out, b, block, bytes, &c) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    if (scratch != stack) {
        PyMem_Free(scratch);
    }
    if (!is_list) {
        PyBuffer_Release(&view);
    }
    return out;
}

PyDoc_STRVAR(ascii_block_keys_doc,
"ascii_block_keys(text, chars_per_block, seed, parent, n) -> list[int]\n\n"
"block_keys over the first n chunks of chars_per_block characters of an ASCII str (its\n"
"characters are its UTF-8 bytes, hashed where the str holds them).");

static PyObject *
ascii_block_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Chain c;
    if (chain_args("ascii_block_keys", args, nargs, &c) < 0) {
        return NULL;
    }
    PyObject *text = args[0];
    const Py_ssize_t chars = c.size, n = c.n;
    if (!PyUnicode_Check(text)) {
        PyErr_SetString(PyExc_TypeError, "text must be a str");
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(text) < 0) {
        return NULL;
    }
#endif
    if (!PyUnicode_IS_ASCII(text)) {
        PyErr_SetString(PyExc_ValueError, "text must be ASCII");
        return NULL;
    }
    if (PyUnicode_GET_LENGTH(text) / chars < n) {
        PyErr_SetString(PyExc_ValueError, "fewer characters than n blocks");
        return NULL;
    }
    const char *data = (const char *)PyUnicode_DATA(text);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t b = 0; b < n; b++) {
        if (put_key(out, b, data + b * chars, (size_t)chars, &c) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"block_keys", (PyCFunction)(void (*)(void))block_keys, METH_FASTCALL, block_keys_doc},
    {"ascii_block_keys", (PyCFunction)(void (*)(void))ascii_block_keys, METH_FASTCALL,
     ascii_block_keys_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "heimdall_proxy.native._chain",
    "The XXH3-64 rolling block keys in C (see kvcache.hashing).",
    0,
    methods,
    NULL, /* m_slots */
    NULL, /* m_traverse */
    NULL, /* m_clear */
    NULL, /* m_free */
};

PyMODINIT_FUNC
PyInit__chain(void)
{
    if (XXH_versionNumber() < XXH3_FROZEN) {
        PyErr_Format(PyExc_ImportError,
                     "libxxhash %u is older than 0.8.0, whose XXH3 the keys follow",
                     XXH_versionNumber());
        return NULL;
    }
    return PyModuleDef_Init(&module);
}
