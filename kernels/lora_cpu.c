/* One projection's LoRA on the CPU, every token of the step in one call.
 *
 * y[t, col_s:col_s + out_s] += scale[slot t] * (x[t] @ A_s[slot t, :r].T) @ B_s[slot t, :r]
 *
 * for every active token t and fused slice s, where r is the rank of t's slot. Tokens come
 * sorted by (rank, slot), so a static split over them hands each thread a contiguous run
 * of adapters, and each adapter's rows are read from memory once a call (a slot's later
 * tokens find them in cache). Built and loaded by kernels/lora_native.py; float32 only,
 * rows contiguous (stride 1 along the width).
 *
 * Blocking four tokens of one slot (each row of A and B loaded once for the four) and
 * software prefetch of the next slot's rows were both measured no faster at decode shapes.
 */
#include <stdint.h>

/* The per-slice description, 8 int64 each (see lora_native.py: _SLICE_FIELDS). */
enum { A_PTR, A_SLOT, A_ROW, B_PTR, B_SLOT, B_ROW, OUT, COL, FIELDS };

void lora_apply_rows(int64_t num_active, const int64_t *order, const int32_t *slots,
                     const int32_t *ranks, const float *scales, const float *x, int64_t x_row,
                     int64_t in_dim, float *y, int64_t y_row, int64_t num_slices,
                     const int64_t *meta, int32_t num_threads)
{
    /* Each token's row of y is written by the one thread that has the token. */
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t i = 0; i < num_active; ++i) {
        const int64_t slot = slots[i], rank = ranks[i];
        const float scale = scales[slot];
        const float *xt = x + order[i] * x_row;
        float *yt = y + order[i] * y_row;
        float t[rank > 0 ? rank : 1]; /* the token's rank-space row, one slice at a time */
        for (int64_t s = 0; s < num_slices; ++s) {
            const int64_t *m = meta + s * FIELDS;
            const float *a = (const float *)(intptr_t)m[A_PTR] + slot * m[A_SLOT];
            const float *b = (const float *)(intptr_t)m[B_PTR] + slot * m[B_SLOT];
            for (int64_t j = 0; j < rank; ++j) {
                const float *aj = a + j * m[A_ROW];
                float acc = 0.0f;
                for (int64_t k = 0; k < in_dim; ++k)
                    acc += aj[k] * xt[k];
                t[j] = acc * scale;
            }
            float *ys = yt + m[COL];
            for (int64_t j = 0; j < rank; ++j) {
                const float *bj = b + j * m[B_ROW];
                const float tj = t[j];
                for (int64_t c = 0; c < m[OUT]; ++c)
                    ys[c] += tj * bj[c];
            }
        }
    }
}
