"""Generation over decode states: token generation (greedy, sampling, beam search),
continuous frame generation (TTS), and `reorder` for beam search.

A decode state (of a block, a layer, a stack, a whole model) is a value: nested tuples,
NamedTuples, lists and dicts of tensors whose first dimension is the batch, with plain
ints, floats, bools, strings or None beside them (positions and counts, the same for
every row). Nothing in it is changed in place, so a state handed to a step is still
valid afterwards and can be reordered, copied or dropped freely.

The model enters as a step function, so the same loops serve a decoder-only LM and an
encoder-decoder (whose state holds the memory, read once at init_state):

    token step:  step(tokens [B, t] long, state) -> (logits [B, t, V], new state)
    frame step:  step(x [B, 1, F_in], state) -> (y [B, 1, F_out], stop_logit [B, 1], new state)
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

_PLAIN = (int, float, bool, str, type(None))


def reorder(state, index: Tensor):
    """The state whose row i is row index[i] of `state` (index: long [N]): index_select(0,
    index) on every tensor of the nested containers; plain values pass through.

    Beam search calls it to follow the surviving hypotheses, and to expand a batch of B
    rows to B * beam (index = arange(B).repeat_interleave(beam)). A tensor broadcast over
    the batch (stride 0 in dim 0, all rows one) stays a broadcast view of N rows.
    """
    if isinstance(state, Tensor):
        index = index.to(state.device)
        if state.dim() and state.stride(0) == 0:
            return state[:1].expand(len(index), *state.shape[1:])
        return state.index_select(0, index)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a NamedTuple
        return type(state)(*(reorder(part, index) for part in state))
    if isinstance(state, (tuple, list)):
        return type(state)(reorder(part, index) for part in state)
    if isinstance(state, dict):
        return {key: reorder(part, index) for key, part in state.items()}
    if isinstance(state, _PLAIN):
        return state
    raise TypeError(f"reorder: a decode state holds tensors in tuples, lists and dicts; got {type(state).__name__}")


# --------------------------------------------------------------------------------------
# Tokens


@dataclass
class Generated:
    tokens: Tensor  # [B, L] generated tokens (prefix excluded), pad_id after each sequence's eos
    lengths: Tensor  # [B] number of generated tokens including eos
    scores: Tensor  # [B] sum of log-probs (beam search: divided by length ** length_penalty)


@torch.no_grad()
def generate(step: Callable, state, prefix: Tensor, *, max_len: int, min_len: int = 0, eos_id: int | None = None,
             pad_id: int = 0, beam: int = 1, length_penalty: float = 1.0, no_repeat_ngram: int = 0,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
             max_positions: int | None = None) -> Generated:
    """Continue prefix [B, P] (P >= 1, e.g. [BOS]) by up to max_len tokens.

    `state` is the state before the prefix (the model's init_state); the prefix goes
    through `step` once, then each new token once. A sequence ends at eos_id (which
    counts in its length) or after max_len tokens; eos is not allowed before min_len
    tokens. no_repeat_ngram = n > 0: no n-gram occurs twice in prefix + generated.

    beam = 1: temperature 0 takes the most likely token (greedy); temperature > 0 samples
    from softmax(logits / temperature), among the top_k most likely tokens (0: all) and
    the smallest set of them whose probability reaches top_p, drawing with `generator`
    (on its own device; None: the global RNG). top_k and top_p apply to sampling only.
    beam > 1: beam search (no sampling): each step keeps the `beam` best continuing
    hypotheses; one ending in eos and scoring above the beam-th best continuing one is
    set aside with score sum / length ** length_penalty; a sequence is done when beam
    hypotheses were set aside, or at max_len (the live ones are scored then too), and
    returns the best one. Scores are sums of the log-probs of the tokens under
    log_softmax(logits), after the min_len and n-gram bans, without the temperature.

    max_positions: the most positions the model takes (prefix + generated), if limited.
    """
    _check_arguments(prefix, max_len=max_len, min_len=min_len, eos_id=eos_id, beam=beam,
                     no_repeat_ngram=no_repeat_ngram, temperature=temperature, top_k=top_k, top_p=top_p,
                     max_positions=max_positions)
    if beam > 1:
        return beam_search(step, state, prefix, beam=beam, max_len=max_len, min_len=min_len, eos_id=eos_id,
                           pad_id=pad_id, length_penalty=length_penalty, no_repeat_ngram=no_repeat_ngram,
                           max_positions=max_positions)
    logits, state = step(prefix, state)
    return _greedy_or_sample(step, state, logits[:, -1], prefix, _Rules(min_len, eos_id, no_repeat_ngram),
                             max_len=max_len, pad_id=pad_id, temperature=temperature, top_k=top_k, top_p=top_p,
                             generator=generator)


def _check_arguments(prefix, *, max_len, min_len, eos_id, beam, no_repeat_ngram, temperature, top_k, top_p,
                     max_positions):
    def integer(value):
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(prefix, Tensor) or prefix.dim() != 2 or prefix.shape[1] < 1 or prefix.dtype != torch.long:
        raise ValueError(f"prefix: expected a long tensor [batch, P] with P >= 1 (e.g. [BOS]), got "
                         f"{getattr(prefix, 'dtype', type(prefix).__name__)} {tuple(getattr(prefix, 'shape', ()))}")
    if not integer(max_len) or max_len < 1:
        raise ValueError(f"max_len={max_len!r}: must be an integer >= 1")
    if not integer(min_len) or not 0 <= min_len <= max_len:
        raise ValueError(f"min_len={min_len!r}: must be an integer between 0 and max_len={max_len}")
    if eos_id is not None and not integer(eos_id):
        raise ValueError(f"eos_id={eos_id!r}: must be a token id or None")
    if not integer(beam) or beam < 1:
        raise ValueError(f"beam={beam!r}: must be an integer >= 1")
    if not integer(no_repeat_ngram) or no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram={no_repeat_ngram!r}: must be an integer >= 0 (0: off)")
    if not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature={temperature!r}: must be >= 0 (0: greedy)")
    if beam > 1 and temperature > 0:
        raise ValueError(f"temperature={temperature!r}: beam search (beam={beam}) does not sample; use temperature=0")
    if not integer(top_k) or top_k < 0:
        raise ValueError(f"top_k={top_k!r}: must be an integer >= 0 (0: all tokens)")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r}: must be in (0, 1]")
    if max_positions is not None and prefix.shape[1] + max_len > max_positions:
        raise ValueError(f"prefix: {prefix.shape[1]} tokens + max_len={max_len} exceed the model's "
                         f"max_positions={max_positions}")


@dataclass(frozen=True)
class _Rules:
    """The tokens a hypothesis may not take next: eos before min_len generated tokens, and
    any token that would repeat an n-gram (n = no_repeat_ngram > 0) of its history."""

    min_len: int
    eos_id: int | None
    no_repeat_ngram: int

    def apply(self, logits: Tensor, history: Tensor, generated: int) -> Tensor:
        """logits [N, V] for the token after history [N, L] (prefix + the `generated`
        tokens so far) -> the logits with the banned tokens at -inf (a new tensor)."""
        logits = logits.clone()
        if self.eos_id is not None and generated < self.min_len:
            logits[:, self.eos_id] = float("-inf")
        n = self.no_repeat_ngram
        if n and history.shape[1] >= n:
            grams = history.unfold(1, n, 1)  # [N, L - n + 1, n]: every n-gram of the history
            tail = history[:, history.shape[1] - (n - 1):]  # [N, n - 1]: what the next token extends
            repeats = (grams[:, :, :-1] == tail[:, None, :]).all(-1)  # [N, L - n + 1]
            rows, starts = repeats.nonzero(as_tuple=True)
            logits[rows, grams[rows, starts, -1]] = float("-inf")
        return logits


def _scores_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _greedy_or_sample(step, state, last, prefix, rules: _Rules, *, max_len, pad_id, temperature, top_k, top_p,
                      generator) -> Generated:
    batch = prefix.shape[0]
    history, new = prefix, []
    scores = torch.zeros(batch, dtype=_scores_dtype(last), device=prefix.device)
    lengths = torch.zeros(batch, dtype=torch.long, device=prefix.device)
    ended = torch.zeros(batch, dtype=torch.bool, device=prefix.device)
    for i in range(max_len):
        logits = rules.apply(last.to(scores.dtype), history, i)  # [B, V]
        token = logits.argmax(-1) if temperature == 0 else _sample(logits, temperature, top_k, top_p, generator)
        logprob = F.log_softmax(logits, dim=-1).gather(1, token[:, None])[:, 0]
        scores = scores + torch.where(ended, 0.0, logprob)
        lengths = lengths + ~ended
        new.append(token.masked_fill(ended, pad_id))  # an ended row's tokens are still fed, never kept
        history = torch.cat([history, token[:, None]], dim=1)
        if rules.eos_id is not None:
            ended = ended | (token == rules.eos_id)
        if i + 1 == max_len or bool(ended.all()):
            break
        logits, state = step(token[:, None], state)
        last = logits[:, -1]
    return Generated(torch.stack(new, dim=1), lengths, scores)


def _sample(logits: Tensor, temperature: float, top_k: int, top_p: float, generator) -> Tensor:
    """One token per row of logits [B, V] (float) -> [B]."""
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = F.softmax(ordered, dim=-1)
        before = probs.cumsum(-1) - probs  # the mass of the more likely tokens
        drop = (before >= top_p).scatter(1, order, before >= top_p)  # back in token order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    device = generator.device if generator is not None else probs.device
    return torch.multinomial(probs.to(device), 1, generator=generator)[:, 0].to(logits.device)


@torch.no_grad()
def beam_search(step: Callable, state, prefix: Tensor, *, beam: int, max_len: int, min_len: int = 0,
                eos_id: int | None = None, pad_id: int = 0, length_penalty: float = 1.0, no_repeat_ngram: int = 0,
                max_positions: int | None = None) -> Generated:
    """`generate`'s beam search (the rules: there), for any beam >= 1 (beam 1 chooses as
    greedy decoding does). The prefix is fed once, then its state is copied to the beam."""
    _check_arguments(prefix, max_len=max_len, min_len=min_len, eos_id=eos_id, beam=beam,
                     no_repeat_ngram=no_repeat_ngram, temperature=0.0, top_k=0, top_p=1.0,
                     max_positions=max_positions)
    rules = _Rules(min_len, eos_id, no_repeat_ngram)
    logits, state = step(prefix, state)
    last = logits[:, -1]
    batch, start, k = prefix.shape[0], prefix.shape[1], beam
    device = prefix.device
    rows = torch.arange(batch, device=device)
    expand = rows.repeat_interleave(k)  # B rows -> B * beam hypotheses, beam by beam
    state, last, history = reorder(state, expand), last[expand], prefix[expand]
    beam_scores = torch.full((batch, k), float("-inf"), dtype=_scores_dtype(last), device=device)
    beam_scores[:, 0] = 0.0  # one live hypothesis (the prefix) at the start
    kept: list[list[tuple[float, Tensor]]] = [[] for _ in range(batch)]  # (score, tokens) set aside
    done = [False] * batch
    for i in range(max_len):
        logprobs = F.log_softmax(rules.apply(last.to(beam_scores.dtype), history, i), dim=-1)  # [B * beam, V]
        vocab = logprobs.shape[1]
        candidates = (beam_scores.reshape(-1, 1) + logprobs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)  # [B, 2 beam], best first
        source, token = top_index // vocab, top_index % vocab
        is_eos = token == rules.eos_id if rules.eos_id is not None else torch.zeros_like(token, dtype=torch.bool)
        # at most beam candidates end in eos (one a hypothesis), so beam of the 2 beam continue
        continuing_above = (~is_eos).cumsum(1) - (~is_eos).long()
        ending = (is_eos & (continuing_above < k) & top_scores.isfinite()).tolist()
        for b in range(batch):
            for j in range(2 * k):
                if ending[b][j] and not done[b]:
                    tokens = torch.cat([history[b * k + source[b, j], start:], token[b, j : j + 1]])
                    kept[b].append((top_scores[b, j].item() / (i + 1) ** length_penalty, tokens))
                    done[b] = len(kept[b]) == k
        chosen = (~is_eos & (continuing_above < k)).nonzero()[:, 1].view(batch, k)  # beam columns a row
        beam_scores = top_scores.gather(1, chosen)
        parents = (source.gather(1, chosen) + rows[:, None] * k).view(-1)  # [B * beam]
        tokens = token.gather(1, chosen).view(-1, 1)
        history = torch.cat([history[parents], tokens], dim=1)
        if i + 1 == max_len:
            for b in range(batch):
                if not done[b]:
                    for j in range(k):
                        score = beam_scores[b, j].item() / max_len**length_penalty
                        kept[b].append((score, history[b * k + j, start:]))
            break
        if all(done):
            break
        state = reorder(state, parents)
        logits, state = step(tokens, state)
        last = logits[:, -1]
    best = [max(hypotheses, key=lambda h: h[0]) for hypotheses in kept]  # the first of equal scores
    lengths = torch.tensor([len(tokens) for _, tokens in best], device=device)
    out = torch.full((batch, int(lengths.max())), pad_id, dtype=torch.long, device=device)
    for b, (_, tokens) in enumerate(best):
        out[b, : len(tokens)] = tokens
    scores = torch.tensor([score for score, _ in best], dtype=beam_scores.dtype, device=device)
    return Generated(out, lengths, scores)


# --------------------------------------------------------------------------------------
# Frames


@dataclass
class Frames:
    frames: Tensor  # [B, N, F_out]
    stop_probs: Tensor  # [B, N]
    lengths: Tensor  # [B] steps up to and including the first with stop prob >= threshold (N if never)


@torch.no_grad()
def generate_frames(step: Callable, state, start: Tensor, *, max_steps: int, stop_threshold: float = 0.5,
                    feedback: Callable[[Tensor], Tensor] = lambda y: y) -> Frames:
    """Run step from start [B, 1, F_in] until every row's stop probability
    (sigmoid(stop_logit)) reached stop_threshold, or for max_steps steps; each next input
    is feedback(y) (TTS with r frames a step feeds y's last frame). A row that stopped
    keeps running with the others; its frames after `lengths` are whatever the model
    gave and are meant to be cut."""
    if not isinstance(start, Tensor) or start.dim() != 3 or start.shape[1] != 1:
        raise ValueError(f"start: expected [batch, 1, features], got {tuple(getattr(start, 'shape', ()))}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps={max_steps!r}: must be an integer >= 1")
    if not isinstance(stop_threshold, (int, float)) or not 0 < stop_threshold <= 1:
        raise ValueError(f"stop_threshold={stop_threshold!r}: must be in (0, 1]")
    batch = start.shape[0]
    lengths = torch.zeros(batch, dtype=torch.long, device=start.device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=start.device)
    frames, stop_probs, x = [], [], start
    for n in range(max_steps):
        y, stop_logit, state = step(x, state)
        prob = torch.sigmoid(stop_logit.float())[:, 0]  # [B]
        frames.append(y[:, 0])
        stop_probs.append(prob)
        now = ~stopped & (prob >= stop_threshold)
        lengths = torch.where(now, n + 1, lengths)
        stopped = stopped | now
        if bool(stopped.all()):
            break
        x = feedback(y)
    lengths = torch.where(stopped, lengths, len(frames))
    return Frames(torch.stack(frames, dim=1), torch.stack(stop_probs, dim=1), lengths)


__all__ = ["Frames", "Generated", "beam_search", "generate", "generate_frames", "reorder"]
