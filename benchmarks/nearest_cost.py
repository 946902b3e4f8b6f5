"""The nearest-neighbour search of pcc's Chamfer distance on a GPU: the Triton kernel
(kernels/nearest.py) at each launch setting against the matmul form it replaced on CUDA
(`nearest_by_matmul`), at the cab preset's shapes, with the found distances compared.

    python benchmarks/nearest_cost.py [--out FILE]

Per shape (batch, query points, candidate points): the median ms of each search
(triton.testing.do_bench), and the largest amount by which a search's squared distances
exceed the smallest that any of the searches found for the same query (the kernel
settings share their fp32 arithmetic, so this compares the searches with each other; the
tests hold the kernel to a float64 search over every pair).
"""

import argparse
import itertools
from pathlib import Path

import torch
import triton

from lavo_tasks.kernels import nearest
from lavo_tasks.tasks.pcc.geometry import gather_points, nearest_by_matmul

# (batch, n, m): the dense prediction against the truth (cab: 14,336 folded points plus the
# 2,048 input points; 16,384 true points; the other way has the same shape), then the
# coarse cloud (224 query points and the 128 proxies) against the truth and back
SHAPES = [(32, 16384, 16384), (32, 352, 16384), (32, 16384, 352)]
VARIANTS = list(itertools.product([32, 64, 128], [32, 64, 128], [4, 8]))  # BLOCK_N, BLOCK_M, warps


def kernel_search(block_n: int, block_m: int, warps: int):
    def search(a, b):
        out = torch.empty(a.shape[:2], dtype=torch.long, device=a.device)
        grid = (triton.cdiv(a.shape[1], block_n), a.shape[0])
        nearest._nearest_kernel[grid](a, b, out, a.shape[1], b.shape[1], BLOCK_N=block_n, BLOCK_M=block_m,
                                      WHILE_LOOPS=False, num_warps=warps)
        return out
    return search


def found_distances(a, b, index):
    return (a - gather_points(b, index)).square().sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", "",
             "| shape (B, n, m) | search | ms | max excess over the nearest |", "|---|---|---|---|"]
    for batch, n, m in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n + m)
        a = torch.rand(batch, n, 3, device="cuda", generator=g)
        b = torch.rand(batch, m, 3, device="cuda", generator=g)
        searches = {"matmul form": nearest_by_matmul}
        searches.update({f"kernel {bn}x{bm}, {w} warps": kernel_search(bn, bm, w) for bn, bm, w in VARIANTS})
        found = {name: found_distances(a, b, search(a, b)) for name, search in searches.items()}
        best = torch.stack(list(found.values())).min(dim=0).values
        for name, search in searches.items():
            ms = triton.testing.do_bench(lambda s=search: s(a, b), warmup=50, rep=300, return_mode="median")
            excess = (found[name] - best).max().item()
            lines.append(f"| {batch} x {n} x {m} | {name} | {ms:.3f} | {excess:.2e} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
