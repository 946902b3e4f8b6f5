"""The small attention blocks and inputs that the block, layer, stack and generation tests share."""

import importlib.resources

import torch
from omegaconf import OmegaConf

from lavo_tasks.attention import ATTENTION_NAMES, PATTERN_NAMES, block_class, build_attention

D_MODEL, N_HEADS = 16, 2  # head dim 8
# Small settings for the generic tests (on top of each attention's YAML defaults).
SMALL = {"local": {"window": 4}, "lavo": {"window": 4, "rank": 4}, "gsa": {"slots": 5}}


def rope_reference(u: torch.Tensor, position: int) -> torch.Tensor:
    """One vector u [d] rotated to `position`, in float64: channels (i, i + d//2) as the
    complex number u_i + 1j u_{i+d/2}, multiplied by exp(1j * position * 10000 ** (-i / (d/2)))."""
    half = u.shape[0] // 2
    z = torch.complex(u[:half].double(), u[half : 2 * half].double())
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    z = z * torch.exp(1j * position * freq)
    return torch.cat([z.real, z.imag, u[2 * half :].double()])


def attention_cfg(name: str, **overrides):
    """The attention's installed YAML defaults with SMALL and `overrides` on top."""
    path = importlib.resources.files("lavo_tasks.configs") / "attention" / f"{name}.yaml"
    cfg = OmegaConf.load(str(path)).attention
    return OmegaConf.merge(cfg, SMALL.get(name, {}), overrides)


def make_block(name: str, pattern: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_attention(
        attention_cfg(name, **overrides), D_MODEL, n_heads=N_HEADS, causal=pattern[0] == "C", cross=pattern[1] == "C"
    )


def padding_mask(length: int) -> torch.Tensor:
    """Batch 0: all real; batch 1: the last 3 are padding; batch 2: the first 2 are."""
    mask = torch.ones(3, length, dtype=torch.bool)
    mask[1, length - 3 :] = False
    mask[2, :2] = False
    return mask


def patterns_of(name: str) -> frozenset:
    """The block's patterns; a block that does not even import is given every pattern,
    so that its tests fail (with the import error) rather than vanish."""
    try:
        return block_class(name).patterns
    except ImportError:
        return frozenset(PATTERN_NAMES)


def supported(patterns):
    """(name, pattern) for every registered attention and each of `patterns` it can run."""
    return [(name, p) for name in ATTENTION_NAMES for p in sorted(patterns_of(name)) if p in patterns]


def unsupported():
    return [(name, p) for name in ATTENTION_NAMES for p in PATTERN_NAMES if p not in patterns_of(name)]
