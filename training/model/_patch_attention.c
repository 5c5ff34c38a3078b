/* Attention within short patches, on packed rows: the CPU kernel behind training/model/patch_attention.py.
 *
 * The packed local models (packing.py) hold the real symbols of M patches as N rows. On CPU the
 * torch path runs one SDPA call per patch length present (up to S per layer), each over a block of
 * tiny patches, plus the row permutations, the RoPE products and the block concatenations around
 * them; at 4.3 symbols per patch those cost more than the attention's own arithmetic. Here one
 * call walks the patches in row order, and each patch's scores, softmax and weighted values stay
 * in a scratch of its own length: no permutation, no PAD, no block copies, RoPE applied on load.
 *
 * Layouts (row-major, contiguous; T = float or double):
 *   qkv   (N, 3, H, Dh)  the fused projection's rows: q, k, v of each head, before RoPE
 *   lens  (M,) int64     patch m's rows are the lens[m] rows after those of patches < m; sum = N
 *   cos, sin (L, Dh/2)   RoPE's factors at slots 0..L-1, L >= the longest patch
 *   y     (N, H, Dh)     softmax(q k^T * scale) v of each head, causal or over the whole patch
 *   probs (P,)           the softmax weights, patch by patch (H, len, len) each: P = H * sum len^2
 *   dqkv  (N, 3, H, Dh)  the gradient of the loss with respect to qkv (RoPE's rotation undone)
 *
 * A call is single-threaded and releases the GIL: patch_attention.py splits the patches into runs, one
 * per torch thread, and calls once per run (each patch whole, so the split changes no bit). At the
 * local models' sizes it is ~10% of a training step (`hbpe bench train`). Every length and size is
 * checked against the buffers before any is read, so a wrong call raises ValueError, never reads out
 * of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NAME(f) f##_f32
#define T float
#define EXP expf
#define LOG logf
#include "_patch_attention_impl.h"
#undef NAME
#undef T
#undef EXP
#undef LOG

#define NAME(f) f##_f64
#define T double
#define EXP exp
#define LOG log
#include "_patch_attention_impl.h"
#undef NAME
#undef T
#undef EXP
#undef LOG

/* The kernels read T through these pointers: a buffer not on a multiple of T's size (a numpy or torch view
 * at a byte offset) would be undefined behaviour, so it is refused like a wrong length. */
static int check_aligned(const Py_buffer *b, int itemsize, const char *what) {
    if ((uintptr_t)b->buf % (uintptr_t)itemsize) {
        PyErr_Format(PyExc_ValueError, "%s is not aligned to its %d-byte items: pass a fresh (copied) array", what,
                     itemsize);
        return -1;
    }
    return 0;
}

static int check_len(const Py_buffer *b, Py_ssize_t want, int itemsize, const char *what) {
    if (b->len != want) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %zd", what, b->len, want);
        return -1;
    }
    return check_aligned(b, itemsize, what);
}

/* The shapes shared by both directions: N rows, M patches, the longest patch and the weights' length
 * heads * sum len^2; -1 with an error set. *copy: the patch lengths the kernel reads, a private copy of lens
 * (the caller frees it): an output buffer that overlaps lens could otherwise change them once checked. */
static int check_shapes(const Py_buffer *qkv, const Py_buffer *lens, const Py_buffer *cosv, const Py_buffer *sinv,
                        int heads, int head_dim, int itemsize, int64_t *N, int64_t *M, int64_t *longest,
                        int64_t *pairs, int64_t **copy) {
    if (itemsize != 4 && itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "itemsize must be 4 (float32) or 8 (float64), got %d", itemsize);
        return -1;
    }
    if (heads < 1 || head_dim < 2 || head_dim % 2) {
        PyErr_Format(PyExc_ValueError, "heads >= 1 and an even head_dim >= 2 needed, got %d, %d", heads, head_dim);
        return -1;
    }
    if ((int64_t)heads * head_dim > INT_MAX / 3) {  /* the kernels index a row's 3 * heads * head_dim in int */
        PyErr_Format(PyExc_ValueError, "heads * head_dim = %lld is past %d", (long long)heads * head_dim, INT_MAX / 3);
        return -1;
    }
    if (check_aligned(qkv, itemsize, "qkv") || check_aligned(cosv, itemsize, "cos") ||
        check_aligned(sinv, itemsize, "sin"))
        return -1;
    const int64_t row = 3 * (int64_t)heads * head_dim * itemsize;
    if (qkv->len % row || lens->len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "qkv is not whole rows of 3 * heads * head_dim, or lens not int64");
        return -1;
    }
    *N = qkv->len / row;
    *M = lens->len / (Py_ssize_t)sizeof(int64_t);
    int64_t *l = *copy = malloc(*M ? (size_t)lens->len : 1);
    if (!l) {
        PyErr_NoMemory();
        return -1;
    }
    if (*M) memcpy(l, lens->buf, (size_t)lens->len);
    int64_t total = 0, top = 0;
    uint64_t squares = 0;  /* <= N * top, checked below before it is used; unsigned: no overflow on the way */
    for (int64_t m = 0; m < *M && total <= *N; m++) {
        if (l[m] < 0 || l[m] > *N) {
            PyErr_Format(PyExc_ValueError, "patch %lld has length %lld", (long long)m, (long long)l[m]);
            return -1;
        }
        total += l[m];  /* <= 2 N: the loop stops once it passes N */
        squares += (uint64_t)l[m] * (uint64_t)l[m];
        if (l[m] > top) top = l[m];
    }
    if (total != *N) {
        PyErr_Format(PyExc_ValueError, "patch lengths sum to %lld, qkv has %lld rows", (long long)total,
                     (long long)*N);
        return -1;
    }
    if (top && *N > PY_SSIZE_T_MAX / itemsize / heads / top) {  /* heads * sum len^2 * itemsize bytes of weights */
        PyErr_Format(PyExc_ValueError, "%lld rows in patches of up to %lld: the softmax weights overflow",
                     (long long)*N, (long long)top);
        return -1;
    }
    const int64_t table = top * (head_dim / 2) * itemsize;
    if (cosv->len < table || sinv->len < table || cosv->len != sinv->len) {
        PyErr_Format(PyExc_ValueError, "RoPE tables of %zd / %zd bytes are short of %lld slots", cosv->len,
                     sinv->len, (long long)top);
        return -1;
    }
    *longest = top;
    *pairs = (int64_t)squares * heads;
    return 0;
}

static PyObject *forward(PyObject *self, PyObject *args) {
    Py_buffer qkv, lens, cosv, sinv, y, probs;
    int heads, head_dim, causal, itemsize;
    double scale;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*iipdi", &qkv, &lens, &cosv, &sinv, &y, &probs, &heads, &head_dim,
                          &causal, &scale, &itemsize))
        return NULL;
    PyObject *result = NULL;
    void *scratch = NULL;
    int64_t N, M, longest, pairs, *l = NULL;
    if (check_shapes(&qkv, &lens, &cosv, &sinv, heads, head_dim, itemsize, &N, &M, &longest, &pairs, &l) ||
        check_len(&y, N * heads * head_dim * itemsize, itemsize, "y") ||
        check_len(&probs, pairs * itemsize, itemsize, "probs"))
        goto done;
    scratch = malloc((size_t)((2 * longest * head_dim + 1) * itemsize));
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    if (itemsize == 4)
        forward_f32(qkv.buf, l, M, cosv.buf, sinv.buf, heads, head_dim, causal, (float)scale, longest, y.buf,
                    probs.buf, scratch);
    else
        forward_f64(qkv.buf, l, M, cosv.buf, sinv.buf, heads, head_dim, causal, scale, longest, y.buf,
                    probs.buf, scratch);
    Py_END_ALLOW_THREADS;
    free(scratch);
    result = Py_NewRef(Py_None);
done:
    free(l);
    PyBuffer_Release(&qkv);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&cosv);
    PyBuffer_Release(&sinv);
    PyBuffer_Release(&y);
    PyBuffer_Release(&probs);
    return result;
}

static PyObject *backward(PyObject *self, PyObject *args) {
    Py_buffer qkv, y, probs, dy, lens, cosv, sinv, dqkv;
    int heads, head_dim, causal, itemsize;
    double scale;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*w*iipdi", &qkv, &y, &probs, &dy, &lens, &cosv, &sinv, &dqkv, &heads,
                          &head_dim, &causal, &scale, &itemsize))
        return NULL;
    PyObject *result = NULL;
    void *scratch = NULL;
    int64_t N, M, longest, pairs, *l = NULL;
    if (check_shapes(&qkv, &lens, &cosv, &sinv, heads, head_dim, itemsize, &N, &M, &longest, &pairs, &l) ||
        check_len(&y, N * heads * head_dim * itemsize, itemsize, "y") ||
        check_len(&dy, N * heads * head_dim * itemsize, itemsize, "dy") ||
        check_len(&probs, pairs * itemsize, itemsize, "probs") || check_len(&dqkv, qkv.len, itemsize, "dqkv"))
        goto done;
    scratch = malloc((size_t)((5 * longest * head_dim + longest + 1) * itemsize));
    if (!scratch) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    if (itemsize == 4)
        backward_f32(qkv.buf, y.buf, probs.buf, dy.buf, l, M, cosv.buf, sinv.buf, heads, head_dim, causal,
                     (float)scale, longest, dqkv.buf, scratch);
    else
        backward_f64(qkv.buf, y.buf, probs.buf, dy.buf, l, M, cosv.buf, sinv.buf, heads, head_dim, causal,
                     scale, longest, dqkv.buf, scratch);
    Py_END_ALLOW_THREADS;
    free(scratch);
    result = Py_NewRef(Py_None);
done:
    free(l);
    PyBuffer_Release(&qkv);
    PyBuffer_Release(&y);
    PyBuffer_Release(&probs);
    PyBuffer_Release(&dy);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&cosv);
    PyBuffer_Release(&sinv);
    PyBuffer_Release(&dqkv);
    return result;
}

static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS,
     "forward(qkv, lens, cos, sin, y, probs, heads, head_dim, causal, scale, itemsize): y and probs, in place"},
    {"backward", backward, METH_VARARGS,
     "backward(qkv, y, probs, dy, lens, cos, sin, dqkv, heads, head_dim, causal, scale, itemsize): dqkv, in place"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_patch_attention",
                                    "Attention within short packed patches (see patch_attention.py).", -1, methods};

PyMODINIT_FUNC PyInit__patch_attention(void) { return PyModule_Create(&module); }
