"""Greedy decoding's argmax found by the decode step's head as it writes the logits
(pyx/simd_argmax.h): np.argmax's answer (the first maximum) whatever the work items' cuts of
the vocabulary, the threads that fold them, ties, and the rows it flags for the caller's np.argmax
(a NaN, or nothing above -inf), on this build and compiled with AVX2 only and as plain C."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from c_harness import build_c_harness

from llmcore import _kernels

pytestmark = pytest.mark.skipif(not _kernels.ENABLED, reason="LLMCORE_NO_KERNELS=1: no fused step")


def _cases(rng):
    """(logits rows, cuts) pairs: small integers (many ties), a vocabulary that is not a
    multiple of 16, pieces of 1..40 rows, rows of -inf, a row whose maximum is in its last
    piece's tail, NaNs."""
    for V in (5, 16, 17, 100, 263, 1000):
        y = rng.integers(-3, 4, size=(6, V)).astype(np.float32)
        y[1] = -np.inf
        y[2, -1] = 10.0
        y[3, V // 2] = 7.0
        y[3, V - 1] = 7.0
        y[4, V // 3] = np.nan
        for step in (1, 3, 16, 40, V):
            cuts = np.unique(np.r_[np.arange(0, V, step), V]).astype(np.int64)
            yield y, cuts
        cuts = np.unique(np.r_[0, np.sort(rng.integers(1, V, 4)), V]).astype(np.int64) if V > 1 else np.array([0, V])
        yield y, cuts


def _expected(y):
    """np.argmax's rows, -1 where a row holds a NaN or only -inf (the kernel's "ask
    np.argmax")."""
    e = np.argmax(y, axis=1)
    return np.where(np.isnan(y).any(axis=1) | (y == -np.inf).all(axis=1), -1, e)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_argmax_pieces_is_np_argmax(n_threads):
    step = _kernels.load("step")
    rng = np.random.default_rng(0)
    for y, cuts in _cases(rng):
        got = step._argmax_pieces(np.ascontiguousarray(y), cuts, n_threads)
        np.testing.assert_array_equal(got, _expected(y), err_msg=f"V={y.shape[1]} cuts={cuts[:8]}")


# argv: V, then reads rows (6 x V floats) and cuts from stdin; prints each row's argmax
HARNESS = r"""
#include "simd_argmax.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    const int V = atoi(argv[1]), R = 6, nth = atoi(argv[2]);
    float *y = malloc(sizeof(float) * R * V);
    for (int i = 0; i < R * V; i++) { char w[64]; if (scanf("%63s", w) != 1) return 2; y[i] = strtof(w, NULL); }
    int nc; if (scanf("%d", &nc) != 1) return 2;
    long long *cuts = malloc(sizeof(long long) * nc);
    for (int i = 0; i < nc; i++) if (scanf("%lld", &cuts[i]) != 1) return 2;
    amax_lanes *a = malloc(sizeof(amax_lanes) * R * nth);
    for (int i = 0; i < R * nth; i++) amax_init(&a[i]);
    for (int j = 0; j + 1 < nc; j++)
        for (int t = 0; t < R; t++) amax_update(&a[(j % nth) * R + t], y + (long)t * V, cuts[j], cuts[j + 1]);
    for (int t = 0; t < R; t++) {
        for (int h = 1; h < nth; h++) amax_merge(&a[t], &a[h * R + t]);
        printf("%lld\n", (long long)amax_row(&a[t]));
    }
    return 0;
}
"""


@pytest.mark.parametrize("flags", [["-mavx2", "-mfma", "-mf16c"], []], ids=["avx2", "portable"])
def test_argmax_other_builds(tmp_path, flags):
    exe = build_c_harness(tmp_path, HARNESS, flags, "h_argmax")
    rng = np.random.default_rng(1)
    n = 0
    for y, cuts in _cases(rng):
        for nth in (1, 2):
            data = " ".join(repr(float(v)) for v in y.ravel()) + f"\n{len(cuts)}\n" + " ".join(map(str, cuts))
            out = subprocess.run([str(exe), str(y.shape[1]), str(nth)], input=data, capture_output=True, text=True)
            assert out.returncode == 0, out.stderr[:2000]
            got = np.array(out.stdout.split(), dtype=np.int64)
            np.testing.assert_array_equal(got, _expected(y), err_msg=f"V={y.shape[1]} cuts={cuts[:8]} threads={nth}")
            n += 1
    assert n > 40
