/* The kernels of _patch_attention.c for one element type: included once per type, with
 *   T     the element type (float, double)
 *   NAME  a macro that suffixes a function name with the type (forward_f32, ...)
 *   EXP, LOG  the type's exp and log
 * defined by the includer. Layouts and the maths are in _patch_attention.c's header comment.
 */

/* x' = R(s) x for each channel pair (x1, x2) of one head: (x1 c - x2 s, x1 s + x2 c); the same products as
 * layers.rotate_rows' complex multiply, so that the two paths round alike. */
static void NAME(rotate)(const T *x, const T *c, const T *s, int half, T *out) {
    for (int i = 0; i < half; i++) {
        T a = x[2 * i], b = x[2 * i + 1];
        out[2 * i] = a * c[i] - b * s[i];
        out[2 * i + 1] = a * s[i] + b * c[i];
    }
}

/* The gradient through `rotate`: R(s)^T g, written into one head's slice of a dqkv row. */
static void NAME(unrotate)(const T *g, const T *c, const T *s, int half, T *out) {
    for (int i = 0; i < half; i++) {
        T a = g[2 * i], b = g[2 * i + 1];
        out[2 * i] = a * c[i] + b * s[i];
        out[2 * i + 1] = b * c[i] - a * s[i];
    }
}

static T NAME(dot)(const T *a, const T *b, int n) {
    T acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int d = 0; d < n; d++) acc += a[d] * b[d];
    return acc;
}

/* Each patch's q and k rotated to their slots, in a scratch of 2 * longest * Dh. */
static void NAME(load_qk)(const T *qkv, int64_t first, int64_t len, int h, int D, int Dh, const T *cosv,
                          const T *sinv, T *q, T *k) {
    const int half = Dh / 2;
    for (int64_t i = 0; i < len; i++) {
        const T *row = qkv + (first + i) * 3 * D + (int64_t)h * Dh;
        NAME(rotate)(row, cosv + i * half, sinv + i * half, half, q + i * Dh);
        NAME(rotate)(row + D, cosv + i * half, sinv + i * half, half, k + i * Dh);
    }
}

/* probs: each patch's softmax weights, (H, len, len) per patch in patch order (causal: 0 above the diagonal);
 * the backward reads them instead of recomputing a dot product and an exp per pair. */
static void NAME(forward)(const T *qkv, const int64_t *lens, int64_t M, const T *cosv, const T *sinv, int H,
                          int Dh, int causal, T scale, int64_t longest, T *y, T *probs, T *scratch) {
    const int D = H * Dh;
    T *q = scratch, *k = scratch + longest * Dh;
    int64_t first = 0;
    for (int64_t m = 0; m < M; first += lens[m], m++) {
        const int64_t len = lens[m];
        for (int h = 0; h < H; h++, probs += len * len) {
            NAME(load_qk)(qkv, first, len, h, D, Dh, cosv, sinv, q, k);
            for (int64_t i = 0; i < len; i++) {
                const int64_t last = causal ? i : len - 1;
                T *p = probs + i * len;
                T top = -INFINITY;
                for (int64_t j = 0; j <= last; j++) {
                    p[j] = NAME(dot)(q + i * Dh, k + j * Dh, Dh) * scale;
                    if (p[j] > top) top = p[j];
                }
                T sum = 0;
                for (int64_t j = 0; j <= last; j++) {
                    p[j] = EXP(p[j] - top);
                    sum += p[j];
                }
                const T inv = 1 / sum;
                for (int64_t j = 0; j <= last; j++) p[j] *= inv;
                for (int64_t j = last + 1; j < len; j++) p[j] = 0;
                T *out = y + (first + i) * D + (int64_t)h * Dh;
                for (int d = 0; d < Dh; d++) out[d] = 0;
                for (int64_t j = 0; j <= last; j++) {
                    const T *v = qkv + (first + j) * 3 * D + 2 * D + (int64_t)h * Dh;
                    const T w = p[j];
#pragma omp simd
                    for (int d = 0; d < Dh; d++) out[d] += w * v[d];
                }
            }
        }
    }
}

/* Flash attention's backward over one patch at a time, from the forward's weights P:
 * delta_i = dy_i . y_i, dS_ij = P_ij (dy_i . v_j - delta_i). */
static void NAME(backward)(const T *qkv, const T *y, const T *probs, const T *dy, const int64_t *lens, int64_t M,
                           const T *cosv, const T *sinv, int H, int Dh, int causal, T scale, int64_t longest,
                           T *dqkv, T *scratch) {
    const int D = H * Dh, half = Dh / 2;
    T *q = scratch, *k = q + longest * Dh, *dq = k + longest * Dh, *dk = dq + longest * Dh,
      *dv = dk + longest * Dh, *delta = dv + longest * Dh;
    int64_t first = 0;
    for (int64_t m = 0; m < M; first += lens[m], m++) {
        const int64_t len = lens[m];
        for (int h = 0; h < H; h++, probs += len * len) {
            NAME(load_qk)(qkv, first, len, h, D, Dh, cosv, sinv, q, k);
            for (int64_t i = 0; i < len * Dh; i++) dq[i] = dk[i] = dv[i] = 0;
            for (int64_t i = 0; i < len; i++) {
                const int64_t at = (first + i) * D + (int64_t)h * Dh;
                delta[i] = NAME(dot)(dy + at, y + at, Dh);
            }
            for (int64_t i = 0; i < len; i++) {
                const int64_t last = causal ? i : len - 1;
                const T *g = dy + (first + i) * D + (int64_t)h * Dh;
                for (int64_t j = 0; j <= last; j++) {
                    const T *v = qkv + (first + j) * 3 * D + 2 * D + (int64_t)h * Dh;
                    const T pij = probs[i * len + j];
                    const T ds = pij * (NAME(dot)(g, v, Dh) - delta[i]) * scale;
                    T *dvj = dv + j * Dh, *dqi = dq + i * Dh, *dkj = dk + j * Dh;
                    const T *qi = q + i * Dh, *kj = k + j * Dh;
#pragma omp simd
                    for (int d = 0; d < Dh; d++) {
                        dvj[d] += pij * g[d];
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                    }
                }
            }
            for (int64_t i = 0; i < len; i++) {
                T *row = dqkv + (first + i) * 3 * D + (int64_t)h * Dh;
                NAME(unrotate)(dq + i * Dh, cosv + i * half, sinv + i * half, half, row);
                NAME(unrotate)(dk + i * Dh, cosv + i * half, sinv + i * half, half, row + D);
                for (int d = 0; d < Dh; d++) row[2 * D + d] = dv[i * Dh + d];
            }
        }
    }
}
