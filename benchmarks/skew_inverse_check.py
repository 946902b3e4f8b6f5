"""Check and time LAVO's basis inverse (I - S)^-1 (kernels/lavo/cayley.py) on a GPU.

    python benchmarks/skew_inverse_check.py [--old FILE]

For head dims 1-128 and 3, 96 and 2,000 skew-symmetric matrices (entries ~3), the kernel
launched as the op launches it, straight into a buffer with canaries on either side: the
largest error against float64 `torch.linalg.inv`, relative to the inverse's largest
entry, against 16 · cond(I - S) · 2^-24 (the kernel's fp32 elimination); the canaries
untouched (nothing written outside the output); the same bits over 50 repeats into a
NaN-filled output (a race between the rows of a program shows as differing bits). Then
`do_bench` medians of the launch alone at head dims 64 and 128 for 48, 96 and 1,000
matrices: the op's warps and row block, every num_warps x row block beside it,
`torch.linalg.inv_ex`, and with `--old FILE` the `_unit_skew_inverse_kernel(s_ptr, w_ptr,
D, BD)` of another version of cayley.py (e.g. `git show f3d7d91:kernels/lavo/cayley.py >
old.py`, its relative imports made absolute), in the same process. The old file is loaded
after the checks: it registers the same custom op name, which then runs its kernel.
Prints FAILURES: N last.
"""

import argparse
import importlib.util

import torch
from triton.testing import do_bench

from lavo_tasks.kernels.common import tile_width
from lavo_tasks.kernels.lavo import cayley
from lavo_tasks.kernels.lavo.cayley import launch_inverse

DIMS = (1, 5, 16, 17, 31, 33, 40, 64, 65, 100, 127, 128)


def skew(n, d, scale, seed):
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(n, d, d, generator=g).tril(-1) * scale
    return (low - low.transpose(1, 2)).contiguous().cuda()


def check(d, n):
    """The accuracy, canary and determinism checks of one case; True if all hold."""
    s = skew(n, d, 3.0, d * 7 + n)
    canary = torch.full(((n + 2) * d * d,), 777.0, device="cuda")
    w = canary[d * d:(n + 1) * d * d].view(n, d, d)
    launch_inverse(s, w)
    first = w.clone()
    eye = torch.eye(d, dtype=torch.float64, device="cuda")
    want = torch.linalg.inv(eye - s.double())
    err = ((w.double() - want).abs().max() / want.abs().max()).item()
    bound = 16 * torch.linalg.cond(eye - s.double()).max().item() * 2**-24
    kept = bool((canary[:d * d] == 777).all() and (canary[(n + 1) * d * d:] == 777).all())
    same = True
    for _ in range(50):
        w.fill_(float("nan"))
        launch_inverse(s, w)
        same &= torch.equal(w, first)
    ok = err < bound and kept and same
    print(f"d={d:3d} n={n:4d} err={err:.1e} bound={bound:.1e} canary={kept} deterministic={same} "
          f"{'OK' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", help="another version of kernels/lavo/cayley.py to time beside this one")
    args = parser.parse_args()
    failures = sum(not check(d, n) for d in DIMS for n in (3, 96, 2000))
    old = None
    if args.old:  # after the checks: it re-registers lavo_tasks::unit_skew_inverse
        spec = importlib.util.spec_from_file_location("old_cayley", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    for d in (64, 128):
        for n in (48, 96, 1000):
            s = skew(n, d, 1.0, 1)
            w = torch.empty_like(s)
            eye = torch.eye(d, device="cuda")
            line = [f"d={d} n={n}: kernel {do_bench(lambda: launch_inverse(s, w)) * 1e3:.1f} us",
                    f"torch.linalg.inv_ex {do_bench(lambda: torch.linalg.inv_ex(eye - s)) * 1e3:.1f} us"]
            if old is not None:
                bd = tile_width(d)
                old_ms = do_bench(lambda: old._unit_skew_inverse_kernel[(n,)](s, w, d, BD=bd, num_warps=4 if bd <= 64 else 8))
                line.append(f"old kernel {old_ms * 1e3:.1f} us")
            for num_warps in (1, 2, 4, 8, 16):
                for rows in (16, 32, 64):
                    ms = do_bench(lambda: launch_inverse(s, w, num_warps=num_warps, rows=rows))
                    line.append(f"num_warps={num_warps} rows={rows} {ms * 1e3:.1f} us")
            print("\n  ".join(line), flush=True)
    print("FAILURES:", failures)


if __name__ == "__main__":
    assert cayley.MAX_DIM >= max(DIMS)
    main()
