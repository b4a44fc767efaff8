/* The core of U64Map (see _u64map.c for what it is and why): the layout and the operations
 * that keep it, shared by the type (_u64map.c) and by the native vLLM ingest
 * (_vllm_ingest.c), which writes the same maps. Everything is static inline: each
 * extension compiles its own copy of the same code over the same layout. */
#ifndef HEIMDALL_U64MAP_H
#define HEIMDALL_U64MAP_H
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    uint64_t key;
    uint64_t value;
} Entry;

/* entries hold at most this many (a slot keeps a position + 1 in 32 bits) */
#define MAX_ENTRIES ((size_t)UINT32_MAX - 1)

typedef struct {
    PyObject_HEAD
    uint64_t *index; /* cap slots: 0 free, else hash32 << 32 | (position + 1) */
    size_t cap;      /* 0 or a power of two (homes are in its first 2**32 slots) */
    Entry *entries;  /* first-written order */
    uint8_t *dead;   /* per entry: deleted */
    size_t nentries, entries_cap;
    size_t first; /* every entry before it is dead */
    size_t used;  /* live entries (= index slots in use) */
} U64Map;

static inline uint32_t
hash32(uint64_t key)
{
    /* murmur3's finaliser: engine hashes in tests and some engines are small integers */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ULL;
    key ^= key >> 33;
    return (uint32_t)key;
}

static inline uint64_t
slot_of(uint32_t h, size_t pos)
{
    return (uint64_t)h << 32 | (uint64_t)(pos + 1);
}

static inline uint32_t
slot_hash(uint64_t slot)
{
    return (uint32_t)(slot >> 32);
}

static inline size_t
slot_pos(uint64_t slot)
{
    return (size_t)(uint32_t)slot - 1;
}

/* The position of `key` among the entries, and its index slot in *slot; -1 if absent. */
static inline Py_ssize_t
lookup(const U64Map *m, uint64_t key, size_t *slot)
{
    if (m->cap == 0) {
        return -1;
    }
    const uint32_t h = hash32(key);
    const size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const uint64_t s = m->index[i];
        if (s == 0) {
            return -1;
        }
        if (slot_hash(s) == h && m->entries[slot_pos(s)].key == key) {
            *slot = i;
            return (Py_ssize_t)slot_pos(s);
        }
    }
}

static inline Entry *
find(const U64Map *m, uint64_t key)
{
    size_t slot;
    const Py_ssize_t pos = lookup(m, key, &slot);
    return pos < 0 ? NULL : &m->entries[pos];
}

#define HUGE_PAGE ((size_t)2 << 20)

/* A zeroed index of `cap` slots. A big one is aligned to 2 MiB and asks for huge pages
 * (where the kernel gives them on request): a probe lands anywhere in it, and with 4 KiB
 * pages nearly every one also missed the TLB. Zeroed by writing, not by calloc's lazily
 * mapped zero pages, which the first probe reads and the first write then faults on again. */
static inline uint64_t *
new_index(size_t cap)
{
    const size_t bytes = cap * sizeof(uint64_t);
    void *p = NULL;
    if (bytes >= 2 * HUGE_PAGE) {
        if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) {
            p = NULL;
        }
#ifdef MADV_HUGEPAGE
        else {
            (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: refused is fine */
        }
#endif
    }
    else {
        p = malloc(bytes);
    }
    if (p != NULL) {
        memset(p, 0, bytes);
    }
    return p;
}

/* Put the live entries in `index` (zeroed, `cap` slots: a power of two, more than used) and
 * make it the map's. Cannot fail: callers allocate first, then change the map. */
static inline void
install(U64Map *m, uint64_t *index, size_t cap)
{
    const size_t mask = cap - 1;
    for (size_t pos = m->first; pos < m->nentries; pos++) {
        if (m->dead[pos]) {
            continue;
        }
        const uint32_t h = hash32(m->entries[pos].key);
        size_t i = h & mask;
        while (index[i] != 0) {
            i = (i + 1) & mask;
        }
        index[i] = slot_of(h, pos);
    }
    free(m->index);
    m->index = index;
    m->cap = cap;
}

/* The smallest index that holds `used` keys at a load of at most 3/4. */
static inline size_t
fitting(size_t used)
{
    size_t cap = 16;
    while (cap * 3 < used * 4) {
        cap *= 2;
    }
    return cap;
}

/* Move the live entries to the front, in order (the index must be rebuilt after). */
static inline void
squeeze(U64Map *m)
{
    size_t out = 0;
    for (size_t pos = m->first; pos < m->nentries; pos++) {
        if (!m->dead[pos]) {
            m->entries[out] = m->entries[pos];
            m->dead[out++] = 0;
        }
    }
    m->nentries = out;
    m->first = 0;
}

/* Entries (and their dead bytes) for `cap`, at least nentries. On a failed realloc the
 * map stays whole: entries_cap never exceeds what both arrays hold. */
static inline int
resize_entries(U64Map *m, size_t cap)
{
    size_t held = m->entries_cap, dead_held = m->entries_cap;
    Entry *entries = PyMem_RawRealloc(m->entries, cap * sizeof(Entry));
    if (entries != NULL) {
        m->entries = entries;
        held = cap;
    }
    uint8_t *dead = PyMem_RawRealloc(m->dead, cap);
    if (dead != NULL) {
        m->dead = dead;
        dead_held = cap;
    }
    m->entries_cap = held < dead_held ? held : dead_held;
    if (entries == NULL || dead == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Room for `extra` more keys with no move in between: the entries squeezed (when a quarter
 * or more are dead, or positions would pass MAX_ENTRIES) or grown, the index grown to keep
 * its load at most 3/4. On MemoryError the map is as it was (allocations come first). */
static inline int
room(U64Map *m, size_t extra)
{
    if (m->used + extra > MAX_ENTRIES) {
        PyErr_SetString(PyExc_OverflowError, "U64Map holds at most 2**32 - 2 keys");
        return -1;
    }
    const int full = m->nentries + extra > m->entries_cap;
    const int squeeze_now =
        m->nentries + extra > MAX_ENTRIES ||
        (full && (m->nentries - m->used) * 4 >= m->nentries && m->used + extra <= m->entries_cap);
    size_t cap = m->cap ? m->cap : 16;
    while ((m->used + extra) * 4 > cap * 3) {
        cap *= 2;
    }
    if (squeeze_now || cap != m->cap) {
        uint64_t *index = new_index(cap);
        if (index == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (squeeze_now) {
            squeeze(m);
        }
        install(m, index, cap);
    }
    if (m->nentries + extra > m->entries_cap) {
        size_t want = m->entries_cap ? 2 * m->entries_cap : 16;
        while (want < m->nentries + extra) {
            want *= 2;
        }
        if (want > MAX_ENTRIES) {
            want = MAX_ENTRIES; /* >= nentries + extra: checked above */
        }
        return resize_entries(m, want);
    }
    return 0;
}

/* The entry of `key`, added (value 0, after every other) when absent; NULL on error. */
static inline Entry *
upsert(U64Map *m, uint64_t key)
{
    if (room(m, 1) < 0) {
        return NULL;
    }
    const uint32_t h = hash32(key);
    const size_t mask = m->cap - 1;
    size_t i = h & mask;
    for (;; i = (i + 1) & mask) {
        const uint64_t s = m->index[i];
        if (s == 0) {
            break;
        }
        if (slot_hash(s) == h && m->entries[slot_pos(s)].key == key) {
            return &m->entries[slot_pos(s)];
        }
    }
    const size_t pos = m->nentries++;
    m->entries[pos] = (Entry){key, 0};
    m->dead[pos] = 0;
    m->index[i] = slot_of(h, pos);
    m->used++;
    return &m->entries[pos];
}

/* Delete the entry at `pos`, whose index slot is `slot`: the slot is freed and the probe
 * run after it shifted back, so that no probe stops short. */
static inline void
delete_at(U64Map *m, size_t pos, size_t slot)
{
    const size_t mask = m->cap - 1;
    size_t hole = slot;
    for (size_t j = (hole + 1) & mask;; j = (j + 1) & mask) {
        const uint64_t s = m->index[j];
        if (s == 0) {
            break;
        }
        /* s may fill the hole if the hole lies between its home and j */
        if (((j - (slot_hash(s) & mask)) & mask) >= ((j - hole) & mask)) {
            m->index[hole] = s;
            hole = j;
        }
    }
    m->index[hole] = 0;
    m->dead[pos] = 1;
    if (--m->used == 0) {
        m->nentries = m->first = 0; /* all dead: start the array over */
    }
    else {
        while (m->dead[m->first]) {
            m->first++;
        }
    }
}

/* kvcache.index.keys.evict_oldest's count: past max_keys, the keys beyond it and
 * max(1, max_keys // 64) more, oldest-written first; how many were deleted. */
static inline size_t
evict_oldest(U64Map *m, size_t max_keys)
{
    if (m->used <= max_keys) {
        return 0;
    }
    const size_t extra = max_keys / 64 > 1 ? max_keys / 64 : 1;
    size_t want = m->used - max_keys + extra;
    if (want > m->used) {
        want = m->used;
    }
    size_t n = 0;
    while (n < want) {
        const size_t pos = m->first; /* live: delete_at moves it past the dead */
        size_t slot;
        if (lookup(m, m->entries[pos].key, &slot) < 0) {
            break; /* cannot happen: a live entry is indexed */
        }
        delete_at(m, pos, slot);
        n++;
    }
    return n;
}

#endif /* HEIMDALL_U64MAP_H */
