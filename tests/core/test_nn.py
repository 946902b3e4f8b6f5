"""`lavo_tasks.nn`, the one import for models of one's own: the same classes as their
modules, and stacks from block classes / factories equal to stacks from configs."""

import functools

import pytest
import torch
from omegaconf import OmegaConf

import lavo_tasks.nn as lnn
from lavo_tasks import attention, layers, stacks
from compare import assert_near

D_MODEL, N_HEADS, D_FF = 16, 2, 32


def test_exports_are_the_library_classes():
    for name in ("SoftmaxAttention", "LocalAttention", "LavoAttention", "GatedSlotAttention", "build_attention",
                 "AttentionBlock"):
        assert getattr(lnn, name) is getattr(attention, name), name
    assert lnn.Encoder is stacks.Encoder and lnn.Decoder is stacks.Decoder
    assert lnn.TransformerDecoderLayer is layers.TransformerDecoderLayer
    assert set(lnn.__all__) <= set(dir(lnn))
    with pytest.raises(AttributeError, match="NoSuchAttention"):
        attention.NoSuchAttention  # noqa: B018


def make_decoder(self_spec, cross_spec):
    torch.manual_seed(0)
    return lnn.Decoder(d_model=D_MODEL, n_heads=N_HEADS, n_layers=2, self_attention=self_spec,
                       cross_attention=cross_spec, d_ff=D_FF, cross_causal=True).eval()


def test_factories_build_the_stack_that_configs_build():
    """partial(LavoAttention, ...) and a class at the sites give the same weights and
    outputs as the site configs {"name": ..., ...} (as a dict and as a DictConfig)."""
    by_class = make_decoder(functools.partial(lnn.LavoAttention, window=4, rank=4, backend="torch"),
                            lnn.GatedSlotAttention)
    by_dict = make_decoder({"name": "lavo", "window": 4, "rank": 4, "backend": "torch"}, {"name": "gsa"})
    by_config = make_decoder(OmegaConf.create({"name": "lavo", "window": 4, "rank": 4, "backend": "torch"}),
                             OmegaConf.create({"name": "gsa"}))
    assert isinstance(by_class.layers[1].cross_attn, lnn.GatedSlotAttention) and by_class.layers[0].self_attn.rank == 4
    x, memory = torch.randn(2, 7, D_MODEL), torch.randn(2, 5, D_MODEL)
    with torch.no_grad():
        y = by_class(x, memory)
        for other in (by_dict, by_config):
            for (key, a), (_, b) in zip(by_class.state_dict().items(), other.state_dict().items(), strict=True):
                assert torch.equal(a, b), key
            assert_near(other(x, memory), y)


def test_stack_arguments_are_named():
    for stack, sites in ((lnn.Encoder, {"attention": lnn.SoftmaxAttention}),
                         (lnn.Decoder, {"self_attention": lnn.SoftmaxAttention})):
        for bad, message in [(dict(n_layers=0), "n_layers=0: must be an integer >= 1"),
                             (dict(n_heads=3), f"n_heads=3: must be >= 1 and divide d_model={D_MODEL}"),
                             (dict(d_ff=2.5), "d_ff=2.5: must be an integer >= 1")]:
            arguments = {"d_model": D_MODEL, "n_heads": N_HEADS, "n_layers": 2, "d_ff": D_FF, **sites, **bad}
            with pytest.raises(ValueError) as err:
                stack(**arguments)
            assert type(err.value) is ValueError and str(err.value) == message
    with pytest.raises(ValueError, match=r"^rank=9: must be an integer between 1 and the head dim 8 "):
        lnn.Decoder(d_model=D_MODEL, n_heads=N_HEADS, n_layers=1, d_ff=D_FF,
                    self_attention=functools.partial(lnn.LavoAttention, rank=9))
