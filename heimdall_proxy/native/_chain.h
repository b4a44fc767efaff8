/* The rolling block key step of the hashing standard (kvcache.hashing), shared by
 * native/_chain.c (keys for Python) and native/_vllm_ingest.c (keys written straight
 * into the conductor's maps), so the arithmetic is written once:
 *
 *     local[i] = XXH3_64(block i's bytes, S)
 *     seq[0]   = local[0], or XXH3_64(parent_le64 || local[0]_le64, S) when chained on parent
 *     seq[i]   = XXH3_64(seq[i-1]_le64 || local[i]_le64, S)
 *
 * xxHash's stable ABI (xxhash.h) is declared here so that building needs only the runtime
 * library, which every Debian-based system ships (apt depends on it). XXH3's output was
 * frozen in 0.8.0: 0.7.x exports the same symbol with other answers (inputs of 0-3 and over
 * 240 bytes), so a module using it refuses to load on an older library (kvcache.hashing
 * then checks known answers too, and falls back to its Python loop). Little-endian hosts
 * only: the u64 pair is hashed as it lies in memory. */
#ifndef HEIMDALL_CHAIN_H
#define HEIMDALL_CHAIN_H
#include <stddef.h>
#include <stdint.h>

uint64_t XXH3_64bits_withSeed(const void *input, size_t length, uint64_t seed);
unsigned XXH_versionNumber(void);
#define XXH3_FROZEN 800 /* 0.8.0 */

/* The key of the next block (`bytes` bytes at `block`): its local hash, chained on pair[0]
 * (the previous key, or the parent) when *chained. Leaves the key in pair[0], *chained set. */
static inline uint64_t
chain_step(uint64_t pair[2], int *chained, const void *block, size_t bytes, uint64_t seed)
{
    uint64_t key = XXH3_64bits_withSeed(block, bytes, seed);
    if (*chained) {
        pair[1] = key;
        key = XXH3_64bits_withSeed(pair, 2 * sizeof(uint64_t), seed);
    }
    *chained = 1;
    pair[0] = key;
    return key;
}

#endif /* HEIMDALL_CHAIN_H */
