"""pcc's geometry kernels on a GPU against the PyTorch forms they replace on CUDA,
at the cab (and default) presets' shapes, with the results compared.

    python benchmarks/pcc_geometry_cost.py [--only nearest|fps] [--out FILE]

nearest: the nearest-neighbour kernel (kernels/nearest.py) at each launch setting against
the matmul form it replaced on CUDA (`nearest_by_matmul`). Per shape (batch, query points,
candidate points): the median ms of each search, and the largest amount by which a
search's squared distances exceed the smallest that any of the searches found for the
same query (the kernel settings share their fp32 arithmetic, so this compares the
searches with each other; the tests hold the kernel to a float64 search over every pair).

fps: the farthest-point-sampling kernel (kernels/fps.py) at 1-16 warps against the PyTorch
loop it replaced on CUDA (`farthest_point_sample_by_loop`). Per shape (batch, points,
samples): the median ms of a call of each (calls back to back: a loop whose launches the
host cannot issue as fast as the GPU runs them is timed at the host's pace, as in a
training step), and whether each drew the same indices as the loop in float64 (the
tests' reference).

Times: triton.testing.do_bench medians.
"""

import argparse
import contextlib
import itertools
from pathlib import Path
from unittest import mock

import torch
import triton

from lavo_tasks.kernels import nearest
from lavo_tasks.kernels import fps
from lavo_tasks.tasks.pcc.geometry import farthest_point_sample_by_loop, nearest_by_matmul, squared_distances_at

# (batch, n, m): the dense prediction against the truth (cab: 14,336 folded points plus the
# 2,048 input points; 16,384 true points; the other way has the same shape), then the
# coarse cloud (224 query points and the 128 proxies) against the truth and back
NEAREST_SHAPES = [(32, 16384, 16384), (32, 352, 16384), (32, 16384, 352)]
VARIANTS = list(itertools.product([32, 64, 128], [32, 64, 128], [4, 8]))  # BLOCK_N, BLOCK_M, warps
# (batch, points, samples): the proxies of the partial cloud, default preset (batch 16,
# data.n_input 512, model.n_proxies 64) and cab (32, 2,048, 128)
FPS_SHAPES = [(16, 512, 64), (32, 2048, 128)]


def median_ms(call) -> float:
    return triton.testing.do_bench(call, warmup=50, rep=300, return_mode="median")


def nearest_rows():
    yield "| shape (B, n, m) | search | ms | max excess over the nearest |"
    yield "|---|---|---|---|"
    for batch, n, m in NEAREST_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n + m)
        a = torch.rand(batch, n, 3, device="cuda", generator=g)
        b = torch.rand(batch, m, 3, device="cuda", generator=g)
        # each search: (its name, its launch setting or None for the matmul form)
        searches = [("matmul form", None)] + [(f"kernel {bn}x{bm}, {w} warps", (bn, bm, w)) for bn, bm, w in VARIANTS]
        found, times = {}, {}
        for name, setting in searches:
            launch = (mock.patch.multiple(nearest, BLOCK_N=setting[0], BLOCK_M=setting[1], WARPS=setting[2])
                      if setting else contextlib.nullcontext())
            with launch:
                search = nearest_by_matmul if setting is None else nearest.nearest_index
                found[name] = squared_distances_at(a, b, search(a, b))
                times[name] = median_ms(lambda: search(a, b))
        best = torch.stack(list(found.values())).min(dim=0).values
        for name, _ in searches:
            yield f"| {batch} x {n} x {m} | {name} | {times[name]:.3f} | {(found[name] - best).max().item():.2e} |"


def fps_rows():
    yield "| shape (B, N, samples) | sampler | ms | same indices as the float64 loop |"
    yield "|---|---|---|---|"
    for batch, n_points, n_samples in FPS_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n_points)
        points = torch.rand(batch, n_points, 3, device="cuda", generator=g)
        reference = farthest_point_sample_by_loop(points.double(), n_samples)
        # each sampler: (its name, the kernel's warps, or None for the PyTorch loop or the kernel's own)
        samplers = [("PyTorch loop", None), ("farthest_point_indices", None)]
        samplers += [(f"kernel, {w} warps", w) for w in (1, 2, 4, 8, 16)]
        for name, warps in samplers:
            sample = farthest_point_sample_by_loop if name == "PyTorch loop" else fps.farthest_point_indices
            with mock.patch.object(fps, "warps", lambda _, w=warps: w) if warps else contextlib.nullcontext():
                same = torch.equal(sample(points, n_samples), reference)
                ms = median_ms(lambda: sample(points, n_samples))
            yield f"| {batch} x {n_points} x {n_samples} | {name} | {ms:.3f} | {same} |"


SECTIONS = {"nearest": nearest_rows, "fps": fps_rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SECTIONS), help="one of the comparisons (default: both)")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"]
    print(lines[0], flush=True)
    for name in [args.only] if args.only else SECTIONS:
        for line in itertools.chain(["", f"{name}:", ""], SECTIONS[name]()):  # rows as they come
            lines.append(line)
            print(line, flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
