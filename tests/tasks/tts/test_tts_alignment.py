"""The softmax cross-attention weights against the block's own output, and the guided-
attention loss against hand-computed costs."""

import math

import torch

from lavo_tasks.attention.softmax import SoftmaxAttention
from lavo_tasks.tasks.tts.alignment import guide, guided_attention_loss, recorded_cross_weights, softmax_cross_weights

from test_tts_model import tiny_model


def test_weights_reproduce_the_blocks_output():
    """weights @ values through the output projection = what the block computes (SDPA),
    CC and NC, with a padded key."""
    torch.manual_seed(0)
    x, context = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    context_mask = torch.tensor([[True] * 4, [True, True, True, False]])
    for causal in (True, False):
        block = SoftmaxAttention(16, 2, causal=causal, cross=True)
        weights = softmax_cross_weights(block, x, context, context_mask)  # [2, 2, 5, 4]
        _, v = block._keys_values(context, 0)
        expected, _ = block(x, context=context, context_mask=context_mask)
        torch.testing.assert_close(block._output(weights @ v), expected, atol=1e-5, rtol=1e-5)
        assert weights[1, :, :, 3].abs().max() == 0  # the padded key
        if causal:  # step n reads positions <= n
            assert weights[:, :, 0, 1:].abs().max() == 0 and weights[:, :, 2, 3].abs().max() == 0


def test_guide_by_hand():
    # 2 real steps of 3, 2 real positions of 2: the cost of (n, l) is 1 - exp(-(l/2 - n/2)^2 / 0.08)
    cost = guide(torch.tensor([2]), torch.tensor([2]), 3, 2)[0]
    off = 1 - math.exp(-0.25 / 0.08)
    torch.testing.assert_close(cost, torch.tensor([[0.0, off], [off, 0.0], [0.0, 0.0]]))


def test_loss_is_zero_on_the_diagonal_and_averages_real_pairs():
    steps, tokens = torch.tensor([2]), torch.tensor([2])
    diagonal = torch.eye(2)[None, None]  # [1, 1, 2, 2]
    assert guided_attention_loss([diagonal], steps, tokens) == 0
    crossed = torch.tensor([[0.0, 1.0], [1.0, 0.0]])[None, None]
    off = 1 - math.exp(-0.25 / 0.08)
    # two off-diagonal weights of 1, each costing `off`, over 4 real pairs and 1 head
    torch.testing.assert_close(guided_attention_loss([crossed, diagonal], steps, tokens),
                               torch.tensor((2 * off / 4 + 0) / 2))


def test_recorded_weights_are_one_per_layer_and_carry_gradients():
    model = tiny_model("softmax").train()
    tokens, token_lengths = torch.tensor([[3, 4, 5, 1]]), torch.tensor([4])
    mels = torch.randn(1, 6, 8)
    with recorded_cross_weights(model.decoder) as weights:
        model(tokens, token_lengths, mels, torch.tensor([2]))
    assert len(weights) == 2 and weights[0].shape == (1, 2, 2, 4)
    guided_attention_loss(weights, torch.tensor([2]), token_lengths).backward()
    assert model.decoder.layers[0].cross_attn.q_proj.weight.grad.abs().sum() > 0
    model(tokens, token_lengths, mels, torch.tensor([2]))  # the hooks are gone
    assert len(weights) == 2
