/* Attention of a step's queries (decodes, verifications, prefill chunks) over the paged KV
 * cache on the CPU, every sequence of the step in one call.
 *
 * For sequence s with n queries and a context of ctx tokens, query i sits at position
 * p = ctx - n + i and, for each of its heads h (reading KV head h / group),
 *
 *     out[first + i, h] = softmax(q[first + i, h] . K[w..p] * scale) V[w..p]
 *
 * (each score q . k * scale first capped to softcap * tanh(score / softcap) where softcap > 0,
 * Gemma 2's logit soft-cap) with w = 0, or w = p - window + 1 (at least 0) where a sliding
 * window is given (window > 0):
 * the query sees its own position and the window - 1 before it. Keys below every query's
 * window are never read, nor their block table entries.
 *
 * where key j lives in slot j % block_size of block table[s, j / block_size]. The keys are
 * read where they lie, a block at a time, with the softmax kept online (running max and sum,
 * Milakov and Gimelshein, 2018): no padded copy of the contexts, no mask, and nothing past a
 * query's position is ever read. Built and loaded by kernels/attention_native.py, which
 * checks what it is given; float32 only, the last dimension of every operand contiguous.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Each sequence's span, 3 int64 (see attention_native.py). */
enum { FIRST, COUNT, CONTEXT, SPAN };

/* e^x for x <= 0 (a score less the running max), within 2 ulp of expf, in plain arithmetic
 * the compiler vectorises: libm's expf is one call per score, and it was most of the
 * kernel's time. Range reduction x = k ln2 + r, |r| <= ln2 / 2 (ln2 split in two for
 * exactness), then Cephes' degree-6 polynomial for e^r and 2^k put into the exponent.
 * Below -87.3 the result is 0 or subnormal in expf too; here it is 0. NaN stays NaN. */
static inline float exp_nonpositive(float x)
{
    const float clamped = x >= -87.0f ? x : -87.0f; /* NaN too: no undefined conversion */
    const float k = __builtin_floorf(clamped * 1.44269504088896341f + 0.5f);
    const float r = (clamped - k * 0.693359375f) - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = { .i = ((int32_t)k + 127) << 23 };
    const float e = x < -87.0f ? 0.0f : p * scale.f;
    return x != x ? x : e;
}

/* Queries of one sequence attended together: their accumulators stay small and in cache
 * however long a prompt is, and each block of keys is read once for all of them. */
enum { QUERY_CHUNK = 32 };

int32_t paged_attention_cpu(int64_t num_seqs, const int64_t *spans, const int64_t *table,
                            int64_t table_row, const float *q, int64_t q_token, int64_t q_head,
                            const float *k_cache, const float *v_cache, int64_t block_size,
                            int64_t num_kv_heads, int64_t head_dim, int64_t num_heads,
                            float scale, int64_t window, float softcap, float *out,
                            int64_t out_token,
                            int64_t out_head, int32_t num_threads)
{
    const int64_t group = num_heads / num_kv_heads;
    const int64_t key_stride = num_kv_heads * head_dim; /* from one cached token to the next */
    const int64_t block_stride = block_size * key_stride;
    const int64_t most_rows = QUERY_CHUNK * group;
    int32_t failed = 0;
    /* One (sequence, KV head) per iteration: its rows of out are written by that thread only. */
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(num_threads) if (num_threads > 1)
    for (int64_t s = 0; s < num_seqs; ++s) {
        for (int64_t kh = 0; kh < num_kv_heads; ++kh) {
            const int64_t first = spans[s * SPAN + FIRST], n = spans[s * SPAN + COUNT];
            const int64_t ctx = spans[s * SPAN + CONTEXT];
            /* acc [rows, head_dim], then each row's running max and sum, then a block's scores */
            float *acc = malloc(sizeof(float) * (most_rows * (head_dim + 2) + block_size));
            if (acc == NULL) {
#pragma omp atomic write
                failed = 1;
                continue;
            }
            float *top = acc + most_rows * head_dim, *sum = top + most_rows, *p = sum + most_rows;
            for (int64_t lo = 0; lo < n; lo += QUERY_CHUNK) {
                const int64_t hi = lo + QUERY_CHUNK < n ? lo + QUERY_CHUNK : n;
                const int64_t rows = (hi - lo) * group;
                for (int64_t r = 0; r < rows; ++r) {
                    top[r] = -INFINITY;
                    sum[r] = 0.0f;
                }
                for (int64_t e = 0; e < rows * head_dim; ++e)
                    acc[e] = 0.0f;
                const int64_t seen = ctx - n + hi; /* keys the chunk's last query sees */
                /* the first key the chunk's first query sees, and the block holding it */
                int64_t low = window > 0 ? ctx - n + lo - window + 1 : 0;
                low = low > 0 ? low : 0;
                for (int64_t start = low / block_size * block_size; start < seen;
                     start += block_size) {
                    const int64_t offset = table[s * table_row + start / block_size] * block_stride;
                    const float *kb = k_cache + offset + kh * head_dim;
                    const float *vb = v_cache + offset + kh * head_dim;
                    for (int64_t i = lo; i < hi; ++i) {
                        int64_t keys = ctx - n + i - start + 1; /* keys up to the query's position */
                        if (keys <= 0)
                            continue;
                        if (keys > block_size)
                            keys = block_size;
                        /* the block's first key in the query's window */
                        int64_t from = window > 0 ? ctx - n + i - window + 1 - start : 0;
                        from = from > 0 ? from : 0;
                        if (from >= keys)
                            continue;
                        for (int64_t g = 0; g < group; ++g) {
                            const int64_t r = (i - lo) * group + g;
                            const float *qr = q + (first + i) * q_token + (kh * group + g) * q_head;
                            float most = -INFINITY;
                            for (int64_t j = from; j < keys; ++j) {
                                const float *kj = kb + j * key_stride;
                                float dot = 0.0f;
                                for (int64_t d = 0; d < head_dim; ++d)
                                    dot += qr[d] * kj[d];
                                p[j] = dot * scale;
                                if (softcap > 0.0f)
                                    p[j] = softcap * tanhf(p[j] / softcap);
                                most = p[j] > most ? p[j] : most;
                            }
                            const float next = top[r] > most ? top[r] : most;
                            const float shrink = exp_nonpositive(top[r] - next); /* first: 0 */
                            float total = 0.0f;
                            for (int64_t j = from; j < keys; ++j) {
                                p[j] = exp_nonpositive(p[j] - next);
                                total += p[j];
                            }
                            sum[r] = sum[r] * shrink + total;
                            top[r] = next;
                            float *ar = acc + r * head_dim;
                            for (int64_t d = 0; d < head_dim; ++d)
                                ar[d] *= shrink;
                            for (int64_t j = from; j < keys; ++j) {
                                const float *vj = vb + j * key_stride, pj = p[j];
                                for (int64_t d = 0; d < head_dim; ++d)
                                    ar[d] += pj * vj[d];
                            }
                        }
                    }
                }
                for (int64_t i = lo; i < hi; ++i)
                    for (int64_t g = 0; g < group; ++g) {
                        const int64_t r = (i - lo) * group + g;
                        float *o = out + (first + i) * out_token + (kh * group + g) * out_head;
                        const float *ar = acc + r * head_dim, inv = 1.0f / sum[r];
                        for (int64_t d = 0; d < head_dim; ++d)
                            o[d] = ar[d] * inv;
                    }
            }
            free(acc);
        }
    }
    return failed;
}
