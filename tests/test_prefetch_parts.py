"""The one-token kernels ask for a block (or a K-quant tile) ahead a part at a time, a line or two
with each chunk they load (pyx/simd_quants.h lq_pf_part, pyx/simd_kquants.h kq_rp_pf_slice):
the parts must ask for every line of the weights they will stream, none twice within a block.
A C harness records the prefetch requests (the builtin replaced by a recorder) over a run of
blocks laid out as the repacked weights are (one after another from a 64-byte boundary)."""
import subprocess

import pytest

from c_harness import build_c_harness

HARNESS = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static void rec_pf(const void *p);
#define __builtin_prefetch(p, ...) rec_pf((const void *)(p))
#include "simd_quants.h"
#include "simd_kquants.h"
static uintptr_t seen[1 << 16];
static int nseen = 0;
static void rec_pf(const void *p) { if (nseen < (1 << 16)) seen[nseen++] = (uintptr_t)p; }
int main(int argc, char **argv) {
    /* lq BB N NBLK: blocks of BB bytes, N parts each; kq TB: one tile of TB bytes in 32 slices */
    static uint8_t buf[1 << 20] __attribute__((aligned(64)));
    const uintptr_t base = (uintptr_t)buf;
    if (argv[1][0] == 'l') {
        const int64_t bb = atoll(argv[2]); const int n = atoi(argv[3]), nblk = atoi(argv[4]);
        for (int b = 0; b < nblk; b++) {
            nseen = 0;
            for (int c = 0; c < n; c++) lq_pf_part(buf + b * bb, bb, c, n, 1);
            printf("%d", b);
            for (int i = 0; i < nseen; i++) printf(" %ld", (long)(seen[i] - base));
            printf("\n");
        }
    } else {
        const int64_t tb = atoll(argv[2]);
        simd_pf_dist = 64 * 1024;  /* the slices of the tile 64 KB ahead, reported from it */
        for (int j = 0; j < 32; j++) kq_rp_pf_slice(buf, tb, j);
        for (int i = 0; i < nseen; i++) printf("%ld\n", (long)(seen[i] - base) - 64 * 1024);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return build_c_harness(tmp_path_factory.mktemp("pf"), HARNESS, [], "h_pf_parts")


def _run(exe, *args):
    out = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[:2000]
    return out.stdout


@pytest.mark.parametrize("bb,n", [(288, 4), (320, 4), (352, 4), (384, 4), (544, 8), (320, 8)])
def test_block_parts_ask_for_each_line_of_the_block(harness, bb, n):
    # bb: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 16-row blocks; consecutive blocks straddle lines
    asked = set()
    for line in _run(harness, "l", bb, n, 40).splitlines():
        b, *addrs = map(int, line.split())
        lines = [a // 64 for a in addrs]
        assert len(lines) == len(set(lines)), f"block {b} asks for a line twice: {lines}"
        want = set(range(b * bb // 64, ((b + 1) * bb - 1) // 64 + 1))
        assert set(lines) == want, f"block {b}: asked {sorted(lines)}, its lines {sorted(want)}"
        asked |= set(lines)
    assert asked == set(range(0, (40 * bb - 1) // 64 + 1))


@pytest.mark.parametrize("tb", [2368, 2880, 3392])
def test_tile_slices_ask_for_each_line_once(harness, tb):
    # tb: a repacked Q4_K / Q5_K / Q6_K 16-row tile (whole lines)
    offs = [int(v) for v in _run(harness, "k", tb).split()]
    assert all(o % 64 == 0 for o in offs)
    assert sorted(offs) == list(range(0, tb, 64))
