"""Check and time LAVO's basis inverse (I - S)^-1 (kernels/lavo/cayley.py) on a GPU.

    python benchmarks/skew_inverse_check.py [--old FILE]

For head dims 1-128 and 3, 96 and 2,000 skew-symmetric matrices (entries ~3): the
largest error against float64 `torch.linalg.inv`, relative to the inverse's largest
entry, against 16 · cond(I - S) · 2^-24 (the kernel's fp32 elimination); canaries on
either side of the output (nothing written outside it); the same bits over 50 repeats (a
race between the rows of a program shows as differing bits). Then `do_bench` medians at
head dims 64 and 128 for 48, 96 and 1,000 matrices: the kernel at its own launch, every
num_warps x ROW_BLOCK beside it, `torch.linalg.inv_ex`, and with `--old FILE` the
`_unit_skew_inverse_kernel(s_ptr, w_ptr, D, BD)` of another version of cayley.py (e.g.
`git show f3d7d91:kernels/lavo/cayley.py > old.py`, with its relative imports made
absolute), in the same process. Prints FAILURES: N last.
"""

import argparse
import importlib.util

import torch
from triton.testing import do_bench

from lavo_tasks.kernels.common import tile_width
from lavo_tasks.kernels.lavo import cayley
from lavo_tasks.kernels.lavo.cayley import PIVOT_BLOCK, ROW_BLOCK, _unit_skew_inverse_kernel, unit_skew_inverse

DIMS = (1, 5, 16, 17, 31, 33, 40, 64, 65, 100, 127, 128)


def launch(s, w, num_warps, rows):
    d = s.shape[-1]
    _unit_skew_inverse_kernel[(s.shape[0],)](s, w, d, BD=tile_width(d), B=PIVOT_BLOCK, RB=rows, num_warps=num_warps)


def skew(n, d, scale, seed):
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(n, d, d, generator=g).tril(-1) * scale
    return (low - low.transpose(1, 2)).contiguous().cuda()


def check(d, n):
    """The accuracy, canary and determinism checks of one case; True if all hold."""
    s = skew(n, d, 3.0, d * 7 + n)
    canary = torch.full(((n + 2) * d * d,), 777.0, device="cuda")
    w = canary[d * d:(n + 1) * d * d].view(n, d, d)
    w.copy_(unit_skew_inverse(s))  # the op's own launch, then the same launch in place below
    first = w.clone()
    eye = torch.eye(d, dtype=torch.float64, device="cuda")
    want = torch.linalg.inv(eye - s.double())
    err = ((w.double() - want).abs().max() / want.abs().max()).item()
    bound = 16 * torch.linalg.cond(eye - s.double()).max().item() * 2**-24
    kept = bool((canary[:d * d] == 777).all() and (canary[(n + 1) * d * d:] == 777).all())
    same = True
    for _ in range(50):
        w.fill_(float("nan"))
        w.copy_(unit_skew_inverse(s))
        same &= torch.equal(w, first)
    ok = err < bound and kept and same
    print(f"d={d:3d} n={n:4d} err={err:.1e} bound={bound:.1e} canary={kept} deterministic={same} "
          f"{'OK' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", help="another version of kernels/lavo/cayley.py to time beside this one")
    args = parser.parse_args()
    old = None
    if args.old:
        spec = importlib.util.spec_from_file_location("old_cayley", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    failures = sum(not check(d, n) for d in DIMS for n in (3, 96, 2000))
    for d in (64, 128):
        for n in (48, 96, 1000):
            s = skew(n, d, 1.0, 1)
            w = torch.empty_like(s)
            eye = torch.eye(d, device="cuda")
            line = [f"d={d} n={n}: kernel {do_bench(lambda: unit_skew_inverse(s)) * 1e3:.1f} us",
                    f"torch.linalg.inv_ex {do_bench(lambda: torch.linalg.inv_ex(eye - s)) * 1e3:.1f} us"]
            if old is not None:
                bd = tile_width(d)
                old_ms = do_bench(lambda: old._unit_skew_inverse_kernel[(n,)](s, w, d, BD=bd, num_warps=4 if bd <= 64 else 8))
                line.append(f"old kernel {old_ms * 1e3:.1f} us")
            for num_warps in (1, 2, 4, 8, 16):
                for rows in (16, 32, 64):
                    ms = do_bench(lambda: launch(s, w, num_warps, rows))
                    line.append(f"num_warps={num_warps} ROW_BLOCK={rows} {ms * 1e3:.1f} us")
            print("\n  ".join(line), flush=True)
    print("FAILURES:", failures)


if __name__ == "__main__":
    assert cayley.MAX_DIM >= max(DIMS)
    main()
