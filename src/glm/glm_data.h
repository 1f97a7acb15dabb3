/*
 * glm_data.h — the data order and the synthetic corpus of the GLM-4.5
 * model module (DESIGN §10) as pure functions of their counters, so that
 * any tool (the command, the bindings, a test) recomputes the sequences of
 * a step. The command's file readers (src/cli/train_data.c) call them.
 *
 * Order: with L = seq_len, sequence i of the data is tokens [i*L, i*L+L+1)
 * (L+1 tokens: the model reads the first L, predicts the last L), i in
 * [0, S) with S = floor((N - 1) / L) whole sequences (S >= 1 required).
 * Global sequence g (step s uses g = s*B .. s*B+B-1 for the global batch
 * B) is data sequence
 *     g mod S                     without --shuffle;
 *     perm_e(g mod S), e = g / S  with --shuffle,
 * where perm_e is the Fisher-Yates permutation of epoch e: p = identity;
 * for i = S-1 down to 1: j = mulhi(r3(seed, 4, e, i), i + 1), swap p[i],
 * p[j]; then perm_e(k) = p[k].
 *
 * The counter-based generator (no state: a pure function of its counters):
 *     mix(x)  = splitmix64's output function of x + 0x9E3779B97F4A7C15
 *               (z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
 *                z *= 0x94D049BB133111EB; z ^= z >> 31)
 *     r(seed, d, i)     = mix(mix(mix(seed) ^ d) ^ i)
 *     r3(seed, d, a, b) = mix(r(seed, d, a) ^ b)
 *     mulhi(x, n)       = (x * n) >> 64 in 128-bit integers (in [0, n))
 *
 * Synthetic corpus (vocabulary V): K = min(8, V - 1) distinct offsets
 * o_0..o_{K-1}, the first K distinct values of 1 + mulhi(r(seed, 1, c),
 * V - 1), c = 0, 1, ...; token 0 = mulhi(r(seed, 2, 0), V); token t+1 =
 * (token t + o_k) mod V with k = min(clz64(r(seed, 3, t)), K - 1) (clz64(0)
 * = 64). So P(k) = 2^-(k+1) for k < K-1 and P(K-1) = 2^-(K-1): given the
 * previous token the next one has entropy
 *     H = sum_{k<K-1} (k+1) 2^-(k+1) + (K-1) 2^-(K-1)   bits
 * (exact in binary; 1.984375 bits for K = 8), and since every prediction
 * of a sequence follows at least one token, H (in nats: H ln 2) is the
 * lowest expected loss: a run's loss goes toward it.
 */
#ifndef BX_GLM_DATA_H
#define BX_GLM_DATA_H

#include <stdint.h>

/* The synthetic corpus' length in tokens. */
#define GLM_SYNTH_TOKENS (((int64_t)1 << 20) + 1)

/* r(seed, d, i) and r3(seed, d, a, b) above. */
uint64_t glm_rand(uint64_t seed, uint64_t domain, uint64_t i);
uint64_t glm_rand3(uint64_t seed, uint64_t domain, uint64_t a, uint64_t b);
/* (x * n) >> 64: a uniform integer in [0, n) from a 64-bit draw. */
uint64_t glm_mulhi(uint64_t x, uint64_t n);

/* The permutation of epoch e of S sequences (--shuffle): perm[k] = perm_e(k). */
void glm_epoch_perm(uint64_t seed, int64_t e, int64_t S, int64_t *perm);

/* The first n tokens of the synthetic corpus of vocabulary V (V >= 2) into
 * out[n]. */
void glm_synth_tokens(uint64_t seed, int64_t V, int32_t *out, int64_t n);
/* Its entropy rate H in bits (exact in binary: 1.984375 for V >= 9). */
double glm_synth_entropy_bits(int64_t V);

#endif /* BX_GLM_DATA_H */
