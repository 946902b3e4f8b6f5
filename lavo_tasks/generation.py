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

Each token (frame) after the first is one call of a search's `advance`, which works on
buffers of fixed shape and never reads a value back to the host: the state is held in
static buffers (`static_state`: its ints become 0-dim tensors on the device, a state
with `with_room` gets buffers for the whole generation, softmax's KV cache), the choice
of the next token, the scores and the set-aside hypotheses live in tensors, and the end
is read from a device flag every `check_every` tokens. On CUDA, `advance` is captured
once as a CUDA graph and each token is one replay (`cuda_graph`, default on CUDA): each
step's new state is copied into the static buffers. Otherwise it runs eagerly, the same
operations, the new state taken as a value (so a state that grows still decodes).
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import ConfigError

_PLAIN = (int, float, bool, str, type(None))
CHECK_EVERY = 16  # tokens between two reads of the end flag on CUDA (each read waits for the GPU)


def reorder(state, index: Tensor):
    """The state whose row i is row index[i] of `state` (index: long [N]): index_select(0,
    index) on every tensor of the nested containers; plain values and 0-dim tensors (a
    position on the device, the same for every row) pass through.

    Beam search calls it to follow the surviving hypotheses, and to expand a batch of B
    rows to B * beam (index = arange(B).repeat_interleave(beam)). A tensor broadcast over
    the batch (stride 0 in dim 0, all rows one), or of one row, becomes a broadcast view
    of N rows (a beam search over one sequence never copies what its hypotheses share).
    """
    if isinstance(state, Tensor):
        if state.dim() == 0:
            return state
        index = index.to(state.device)
        if state.shape[0] == 1 or state.stride(0) == 0:  # every row the same: a view, no copy
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
# Static states and the loop


def _map(fn, state):
    """fn applied to every leaf (tensor or plain value) of a state's containers."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*(_map(fn, part) for part in state))
    if isinstance(state, (tuple, list)):
        return type(state)(_map(fn, part) for part in state)
    if isinstance(state, dict):
        return {key: _map(fn, part) for key, part in state.items()}
    return fn(state)


def _leaves(state) -> list:
    out = []
    _map(out.append, state)
    return out


def check_batch(state, rows: int, argument: str) -> None:
    """ValueError naming `argument` unless every tensor of `state` with a batch dimension
    has `rows` rows (a 0-dim tensor has none; a tensor broadcast over the batch, stride 0
    in dim 0, serves any batch)."""
    for leaf in _leaves(state):
        if isinstance(leaf, Tensor) and leaf.dim() > 0 and leaf.stride(0) != 0 and leaf.shape[0] != rows:
            raise ValueError(f"{argument}: {rows} rows, but the decode state holds a batch of {leaf.shape[0]} "
                             f"(a tensor of shape {tuple(leaf.shape)}); make the state for {rows} rows")


def check_room(state, positions: int, what: str) -> None:
    """ValueError starting with `what` (the arguments that ask for the room) unless every
    static cache in `state` (a part written in place, with IN_PLACE = True) has room for
    `positions` more positions. Checked before the first step, which would otherwise write
    past the buffers; growing caches get their room later (static_state)."""
    if getattr(state, "IN_PLACE", False) and hasattr(state, "with_room"):
        try:
            state.with_room(positions)
        except ValueError as error:
            raise ValueError(f"{what}: {error}") from None
    elif isinstance(state, (tuple, list, dict)):
        for part in state.values() if isinstance(state, dict) else state:
            check_room(part, positions, what)


def static_state(state, *, room: int, device):
    """`state` for a loop of fixed-shape steps: a part with a `with_room(room)` method (a
    growing cache) is replaced by its fixed-size form for `room` more positions, and every
    int (not bool) becomes a 0-dim long tensor on `device`. The tensors are the same
    objects (no copy)."""

    def convert(part):
        if hasattr(part, "with_room") and not isinstance(part, Tensor):
            part = part.with_room(room)
        if isinstance(part, tuple) and hasattr(part, "_fields"):
            return type(part)(*(convert(p) for p in part))
        if isinstance(part, (tuple, list)):
            return type(part)(convert(p) for p in part)
        if isinstance(part, dict):
            return {key: convert(p) for key, p in part.items()}
        if isinstance(part, int) and not isinstance(part, bool):
            return torch.tensor(part, dtype=torch.long, device=device)
        return part

    return convert(state)


def own_buffers(static, step: Callable, parents: Tensor | None = None) -> tuple[object, list[bool], bool]:
    """Run one step (`step(state) -> new state`) on `static` (reordered by `parents`
    first, if given) to see which tensors a step changes: those it replaces or writes
    in place (the tensors of a part whose type says IN_PLACE = True, a static KV cache).
    Returns (`static` with every replaced tensor cloned, so that copying the
    steps' results into it never writes into a tensor the caller still holds; a flag a
    leaf, True where the step changes it; whether every replaced tensor kept its shape,
    which a CUDA graph needs). The rest (a cross-attention source, a basis) is read by
    every step and never changes: beam search never reorders it, since a beam's
    hypotheses share it (their rows were equal at the expansion and stay so)."""
    passed = static if parents is None else reorder(static, parents)
    after = _leaves(step(passed))
    replaced = [isinstance(p, Tensor) and p is not n for p, n in zip(_leaves(passed), after, strict=True)]
    written = _written_in_place(static)
    fixed = all(not r or p.shape == n.shape for r, p, n in zip(replaced, _leaves(passed), after, strict=True))
    flags = iter(replaced)
    owned = _map(lambda leaf: leaf.clone() if next(flags) else leaf, static)
    return owned, [r or w for r, w in zip(replaced, written, strict=True)], fixed


def _written_in_place(state, inside: bool = False) -> list[bool]:
    """A flag a leaf (in `_leaves` order): True for the tensors of a part whose type has
    IN_PLACE = True (a step writes into them rather than returning new ones)."""
    inside = inside or getattr(type(state), "IN_PLACE", False)
    if isinstance(state, (tuple, list)):
        return [flag for part in state for flag in _written_in_place(part, inside)]
    if isinstance(state, dict):
        return [flag for part in state.values() for flag in _written_in_place(part, inside)]
    return [inside and isinstance(state, Tensor)]


def reorder_changing(state, index: Tensor, changing: list[bool]):
    """`reorder(state, index)` on the leaves flagged in `changing` only."""
    flags = iter(changing)
    return _map(lambda leaf: reorder(leaf, index) if next(flags) else leaf, state)


def _keep(search, new) -> None:
    """The step's new state as the search's state: copied into its buffers when they are
    captured (search.in_place), else taken as it is (a value; eager decoding also serves
    states that grow, such as a step that recomputes its whole prefix)."""
    if search.in_place:
        _store(search.state, new)
    else:
        search.state = new


def _store(static, new) -> None:
    """Copy the step's new state into the static buffers, in place (a tensor the step
    returned as it was is skipped; plain values must not change)."""
    for old, value in zip(_leaves(static), _leaves(new), strict=True):
        if isinstance(old, Tensor):
            if value is not old:
                if value.shape != old.shape:
                    raise ValueError(f"decode state: a step changed a tensor's shape {tuple(old.shape)} -> "
                                     f"{tuple(value.shape)}; a growing state needs a with_room method")
                old.copy_(value)
        elif value != old:
            raise ValueError(f"decode state: a step changed the plain value {old!r} -> {value!r}; "
                             "a captured decode needs positions as ints (they become device tensors)")


def use_cuda_graph(cuda_graph: bool | None, device: torch.device) -> bool:
    """The `cuda_graph` argument resolved: None -> whether `device` is CUDA; True on
    another device is an error naming the argument."""
    if cuda_graph is None:
        return device.type == "cuda"
    if not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph={cuda_graph!r}: must be true, false or None (None: true on CUDA)")
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph=True: CUDA graphs need a CUDA device, the inputs are on {device.type}")
    return cuda_graph


def check_cuda_graph_key(key: str, value, accelerator: str) -> None:
    """A task's cuda_graph key (`key` names it, e.g. decode.cuda_graph): null (true on
    CUDA), true or false; true needs a CUDA GPU here and trainer.accelerator not cpu.
    ConfigError naming the key, before any work."""
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: must be true, false or null (null: true on CUDA)")
    if value and (accelerator == "cpu" or not torch.cuda.is_available()):
        where = "trainer.accelerator=cpu" if accelerator == "cpu" else "no CUDA GPU here"
        raise ConfigError(f"{key}=true: CUDA graphs need a CUDA GPU ({where}); use null or false")


def _notice(message: str) -> None:
    print(f"lavo_tasks.generation: {message}", file=sys.stderr)


class _Captured:
    """`advance` captured once as a CUDA graph: `__call__` replays it. `warm` (one model
    step whose results are dropped, on the current buffers) runs first on a side stream,
    so lazy work (Triton compilation, library handles) is done before the capture. A
    CUDA generator that `advance` draws from is registered with the graph."""

    def __init__(self, advance: Callable, warm: Callable, generator: torch.Generator | None):
        rng = RngStates(generator)
        try:
            self._capture(advance, warm, generator)
        except Exception:
            rng.restore()  # the eager decode that follows draws what it would have drawn without the attempt
            raise

    def _capture(self, advance: Callable, warm: Callable, generator: torch.Generator | None) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                warm()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        if generator is not None:
            self.graph.register_generator_state(generator)
        # autocast's cache of cast weights would hold tensors freed after the capture
        autocast = torch.is_autocast_enabled("cuda")
        dtype = torch.get_autocast_dtype("cuda")
        with torch.cuda.graph(self.graph), torch.autocast("cuda", dtype=dtype, enabled=autocast, cache_enabled=False):
            advance()

    def __call__(self) -> None:
        self.graph.replay()


class RngStates:
    """The states of the CUDA random generators a capture may draw from or register (the
    default one of the current device, and `generator`), to be put back when it fails.

    A capture that fails leaves each generator it registered marked as capturing (the
    capture's end, which clears the mark, is never reached), so every later draw in the
    process raises "Offset increment outside graph capture". Setting the seed and offset
    back does not clear the mark; swapping in a copy of the state taken before the
    capture (`graphsafe_set_state`) does."""

    def __init__(self, generator: torch.Generator | None):
        default = torch.cuda.default_generators[torch.cuda.current_device()]
        self.saved = [(g, g.clone_state()) for g in (default, generator) if g is not None]

    def restore(self) -> None:
        for g, state in self.saved:
            g.graphsafe_set_state(state)


def _run(search, steps: int, *, captured: bool, check_every: int, generator=None) -> None:
    """Call search.advance() up to `steps` times, stopping once search.done() (a 0-dim
    bool tensor) reads true; it is read before every check_every-th call. A capture that
    fails falls back to eager calls with a one-line notice."""
    call = search.advance
    if captured and steps > 0 and not search.fixed_shape:
        _notice("cuda_graph: the decode state changes shape from step to step (a state without with_room); "
                "decoding eagerly")
    elif captured and steps > 0:
        search.in_place = True
        try:
            call = _Captured(search.advance, search.warm, generator)
        except Exception as error:  # noqa: BLE001 - any failure to capture means: decode eagerly
            _notice(f"cuda_graph: the decode step could not be captured ({type(error).__name__}: "
                    f"{str(error).splitlines()[0] if str(error) else ''}); decoding eagerly")
            torch.cuda.synchronize()
            search.in_place = False
    for n in range(steps):
        if n % check_every == 0 and bool(search.done()):
            break
        call()


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
             max_positions: int | None = None, cuda_graph: bool | None = None) -> Generated:
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
    cuda_graph: each token after the first as one CUDA-graph replay (None: on CUDA; true
    on a CPU is an error); sampling with a generator not on CUDA decodes eagerly.
    """
    _check_arguments(prefix, max_len=max_len, min_len=min_len, eos_id=eos_id, beam=beam,
                     no_repeat_ngram=no_repeat_ngram, temperature=temperature, top_k=top_k, top_p=top_p,
                     max_positions=max_positions)
    captured = use_cuda_graph(cuda_graph, prefix.device)
    if beam > 1:  # beam_search checks the state's batch itself
        return beam_search(step, state, prefix, beam=beam, max_len=max_len, min_len=min_len, eos_id=eos_id,
                           pad_id=pad_id, length_penalty=length_penalty, no_repeat_ngram=no_repeat_ngram,
                           max_positions=max_positions, cuda_graph=captured)
    check_batch(state, prefix.shape[0], "prefix")
    check_room(state, prefix.shape[1] + max_len, f"prefix of {prefix.shape[1]} and max_len={max_len}")
    if captured and temperature > 0 and generator is not None and generator.device.type != "cuda":
        _notice(f"cuda_graph: sampling with a generator on {generator.device.type} cannot be captured; "
                "decoding eagerly")
        captured = False
    logits, state = step(prefix, state)
    rules = _Rules(min_len, eos_id, no_repeat_ngram)
    search = _GreedyOrSample(step, state, logits[:, -1], prefix, rules, max_len=max_len, pad_id=pad_id,
                             temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    search.choose()
    _run(search, max_len - 1, captured=captured, check_every=_check_every(prefix.device),
         generator=generator if temperature > 0 else None)
    return search.result()


def _check_every(device: torch.device) -> int:
    return CHECK_EVERY if device.type == "cuda" else 1


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

    def apply(self, logits: Tensor, history: Tensor, length: Tensor, generated: Tensor) -> Tensor:
        """logits [N, V] for the token after the first `length` columns of history [N, W]
        (prefix + the `generated` tokens so far; both 0-dim long tensors, the columns
        after `length` are ignored) -> the logits with the banned tokens at -inf (a new
        tensor). Shapes never depend on the values, so a CUDA graph can hold it."""
        logits = logits.clone()
        if self.eos_id is not None and self.min_len > 0:
            logits[:, self.eos_id].masked_fill_(generated < self.min_len, float("-inf"))
        n = self.no_repeat_ngram
        if n and history.shape[1] >= n:
            grams = history.unfold(1, n, 1)  # [N, W - n + 1, n]: every n-gram of the buffer
            starts = torch.arange(grams.shape[1], device=history.device)
            tail_at = (length - (n - 1) + torch.arange(n - 1, device=history.device)).clamp(min=0)  # [n - 1]
            tail = history[:, tail_at]  # [N, n - 1]: what the next token extends
            repeats = (grams[:, :, :-1] == tail[:, None, :]).all(-1) & (starts <= length - n)  # [N, W - n + 1]
            hits = torch.zeros_like(logits).scatter_add_(1, grams[:, :, -1], repeats.to(logits.dtype))  # [N, V]
            logits.masked_fill_(hits > 0, float("-inf"))
        return logits


def _scores_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


class _TokenSearch:
    """What greedy decoding and beam search share: the static state fed one token a row
    at a time (`token` [N, 1]), the logits it gave (`last` [N, V], in the scores' dtype),
    the history buffer [N, P + max_len] (prefix, then the tokens chosen so far) and the
    count of tokens chosen (0-dim). `parents` [N]: the rows of the state each next token
    continues (None: row i continues row i)."""

    parents: Tensor | None = None

    def __init__(self, step, state, last: Tensor, prefix: Tensor, rules: "_Rules", *, max_len: int, pad_id: int):
        rows, self.start = prefix.shape
        device = prefix.device
        self.step, self.rules, self.max_len, self.pad_id = step, rules, max_len, pad_id
        self.last = last.to(_scores_dtype(last)).clone()
        self.history = torch.full((rows, self.start + max_len), pad_id, dtype=torch.long, device=device)
        self.history[:, : self.start] = prefix
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.token = torch.zeros(rows, 1, dtype=torch.long, device=device)
        state = static_state(state, room=max_len, device=device)
        # the probe step runs on the state itself (no parents: a reorder would copy it all)
        self.state, self.changing, self.fixed_shape = own_buffers(state, lambda s: self.step(self.token, s)[1])
        self.in_place = False

    def _step(self):
        state = self.state if self.parents is None else reorder_changing(self.state, self.parents, self.changing)
        return self.step(self.token, state)

    def warm(self) -> None:
        self._step()

    def feed(self) -> None:
        """The model step on the last chosen tokens, its state stored in the buffers."""
        logits, new = self._step()
        if logits.shape[0] != self.last.shape[0]:  # a shape on the host: no wait for the GPU
            raise ValueError(f"step: gave logits for {logits.shape[0]} rows in a generation of "
                             f"{self.last.shape[0]} (batch x beam); the batch must not change mid-generation")
        self.last.copy_(logits[:, -1])
        _keep(self, new)

    def advance(self) -> None:
        self.feed()
        self.choose()

    def allowed_logits(self) -> Tensor:
        return self.rules.apply(self.last, self.history, self.start + self.count, self.count)

    def write_history(self, token: Tensor) -> None:
        """token [N] into column start + count of the history."""
        self.history.scatter_(1, (self.start + self.count).expand(len(token), 1), token[:, None])


class _GreedyOrSample(_TokenSearch):
    def __init__(self, step, state, last, prefix, rules, *, max_len, pad_id, temperature, top_k, top_p, generator):
        super().__init__(step, state, last, prefix, rules, max_len=max_len, pad_id=pad_id)
        self.temperature, self.top_k, self.top_p, self.generator = temperature, top_k, top_p, generator
        rows, device = prefix.shape[0], prefix.device
        self.scores = torch.zeros(rows, dtype=self.last.dtype, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self.ended = torch.zeros(rows, dtype=torch.bool, device=device)
        self.tokens = torch.full((rows, max_len), pad_id, dtype=torch.long, device=device)

    def choose(self) -> None:
        """The next token of every row from `last`; an ended row's token is fed, never kept."""
        logits = self.allowed_logits()  # [N, V]
        if self.temperature == 0:
            token = logits.argmax(-1)
        else:
            token = _sample(logits, self.temperature, self.top_k, self.top_p, self.generator)
        logprob = F.log_softmax(logits, dim=-1).gather(1, token[:, None])[:, 0]
        self.scores.add_(torch.where(self.ended, 0.0, logprob))
        self.lengths.add_((~self.ended).long())
        column = self.count.expand(len(token), 1)
        self.tokens.scatter_(1, column, token.masked_fill(self.ended, self.pad_id)[:, None])
        self.write_history(token)
        if self.rules.eos_id is not None:
            self.ended.logical_or_(token == self.rules.eos_id)
        self.token.copy_(token[:, None])
        self.count.add_(1)

    def done(self) -> Tensor:
        return self.ended.all()

    def result(self) -> Generated:
        # the loop ran until every row ended or max_len: as many columns as the longest row
        return Generated(self.tokens[:, : int(self.lengths.max())], self.lengths, self.scores)


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
                max_positions: int | None = None, cuda_graph: bool | None = None) -> Generated:
    """`generate`'s beam search (the rules: there), for any beam >= 1 (beam 1 chooses as
    greedy decoding does). The prefix is fed once, then its state is copied to the beam."""
    _check_arguments(prefix, max_len=max_len, min_len=min_len, eos_id=eos_id, beam=beam,
                     no_repeat_ngram=no_repeat_ngram, temperature=0.0, top_k=0, top_p=1.0,
                     max_positions=max_positions)
    captured = use_cuda_graph(cuda_graph, prefix.device)
    check_batch(state, prefix.shape[0], "prefix")
    check_room(state, prefix.shape[1] + max_len, f"prefix of {prefix.shape[1]} and max_len={max_len}")
    logits, state = step(prefix, state)
    expand = torch.arange(prefix.shape[0], device=prefix.device).repeat_interleave(beam)  # B -> B * beam rows
    rules = _Rules(min_len, eos_id, no_repeat_ngram)
    search = _Beam(step, reorder(state, expand), logits[expand, -1], prefix[expand], rules, beam=beam,
                   max_len=max_len, pad_id=pad_id, length_penalty=length_penalty)
    search.choose()
    _run(search, max_len - 1, captured=captured, check_every=_check_every(prefix.device))
    return search.result()


class _Beam(_TokenSearch):
    """Beam search over B sequences of `beam` hypotheses each (rows b * beam + j), with
    the hypotheses set aside held on the device: up to 2 beam a sequence (beam ended in
    eos, then at max_len the beam live ones), slot 2 beam a bin for the candidates not
    kept."""

    def __init__(self, step, state, last, prefix, rules, *, beam, max_len, pad_id, length_penalty):
        rows, device = prefix.shape[0], prefix.device
        self.parents = torch.arange(rows, device=device)
        super().__init__(step, state, last, prefix, rules, max_len=max_len, pad_id=pad_id)
        self.beam, self.batch, self.length_penalty = beam, rows // beam, length_penalty
        k, batch = beam, self.batch
        self.beam_scores = torch.full((batch, k), float("-inf"), dtype=self.last.dtype, device=device)
        self.beam_scores[:, 0] = 0.0  # one live hypothesis (the prefix) at the start
        self.first_row = torch.arange(batch, device=device)[:, None] * k  # [B, 1]
        self.kept_scores = torch.full((batch, 2 * k + 1), float("-inf"), dtype=torch.float64, device=device)
        self.kept_tokens = torch.full((batch, 2 * k + 1, max_len), pad_id, dtype=torch.long, device=device)
        self.kept_lengths = torch.zeros(batch, 2 * k + 1, dtype=torch.long, device=device)
        self.n_kept = torch.zeros(batch, dtype=torch.long, device=device)
        self.columns = torch.arange(max_len, device=device)
        self.order = torch.arange(2 * k, 0, -1, device=device)  # 2 beam .. 1: earlier candidates first

    def _set_aside(self, keep: Tensor, scores: Tensor, tokens: Tensor, lengths: Tensor) -> None:
        """Append the candidates where keep [B, C] to each sequence's set-aside ones, in
        order (scores [B, C] float64, tokens [B, C, max_len], lengths [B, C] long)."""
        slot = self.n_kept[:, None] + keep.long().cumsum(1) - keep.long()
        slot = torch.where(keep, slot, 2 * self.beam)  # the rest into the bin
        self.kept_scores.scatter_(1, slot, scores)
        self.kept_lengths.scatter_(1, slot, lengths)
        self.kept_tokens.scatter_(1, slot[..., None].expand(-1, -1, self.max_len), tokens)
        self.n_kept.add_(keep.sum(1))

    def choose(self) -> None:
        k, batch, i = self.beam, self.batch, self.count
        logprobs = F.log_softmax(self.allowed_logits(), dim=-1)  # [B * beam, V]
        vocab = logprobs.shape[1]
        candidates = (self.beam_scores.reshape(-1, 1) + logprobs).view(batch, k * vocab)
        top_scores, top_index = candidates.topk(2 * k, dim=1)  # [B, 2 beam], best first
        source, token = top_index // vocab, top_index % vocab
        eos_id = self.rules.eos_id
        is_eos = token == eos_id if eos_id is not None else torch.zeros_like(token, dtype=torch.bool)
        # at most beam candidates end in eos (one a hypothesis), so beam of the 2 beam continue
        continuing_above = (~is_eos).cumsum(1) - (~is_eos).long()
        ending = is_eos & (continuing_above < k) & top_scores.isfinite()
        keep = ending & (self.n_kept[:, None] + ending.long().cumsum(1) - ending.long() < k)
        # each candidate's tokens: its parent's generated ones, then its own at column i
        parent_rows = (source + self.first_row).view(-1)
        tokens = self.history[parent_rows, self.start :].view(batch, 2 * k, self.max_len)
        tokens = torch.where(self.columns < i, tokens, self.pad_id)
        tokens = torch.where(self.columns == i, token[..., None], tokens)
        self._set_aside(keep, top_scores.double() / (i + 1).double() ** self.length_penalty, tokens,
                        (i + 1).expand(batch, 2 * k))
        continuing = ~is_eos & (continuing_above < k)  # exactly beam a row
        chosen = torch.where(continuing, self.order, 0).topk(k, dim=1).indices  # their columns, in order
        self.beam_scores.copy_(top_scores.gather(1, chosen))
        self.parents.copy_((source.gather(1, chosen) + self.first_row).view(-1))
        self.token.copy_(token.gather(1, chosen).view(-1, 1))
        self.history.copy_(self.history[self.parents])
        self.write_history(self.token[:, 0])
        self.count.add_(1)

    def done(self) -> Tensor:
        return (self.n_kept >= self.beam).all()

    def result(self) -> Generated:
        k, batch = self.beam, self.batch
        # a sequence not done ran to max_len: its live hypotheses are scored too
        live = (self.n_kept < k)[:, None].expand(batch, k)
        tokens = self.history[:, self.start :].view(batch, k, self.max_len)
        self._set_aside(live, self.beam_scores.double() / float(self.max_len) ** self.length_penalty, tokens,
                        torch.full((batch, k), self.max_len, device=tokens.device))
        best = self.kept_scores[:, : 2 * k].argmax(1)  # the first of equal scores
        lengths = self.kept_lengths.gather(1, best[:, None])[:, 0]
        out = self.kept_tokens[torch.arange(batch, device=best.device), best, : int(lengths.max())]
        scores = self.kept_scores.gather(1, best[:, None])[:, 0].to(self.beam_scores.dtype)
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
                    feedback: Callable[[Tensor], Tensor] = lambda y: y, cuda_graph: bool | None = None) -> Frames:
    """Run step from start [B, 1, F_in] until every row's stop probability
    (sigmoid(stop_logit)) reached stop_threshold, or for max_steps steps; each next input
    is feedback(y) (TTS with r frames a step feeds y's last frame). A row that stopped
    keeps running with the others; its frames after `lengths` are whatever the model
    gave and are meant to be cut. cuda_graph: as in `generate`."""
    if not isinstance(start, Tensor) or start.dim() != 3 or start.shape[1] != 1:
        raise ValueError(f"start: expected [batch, 1, features], got {tuple(getattr(start, 'shape', ()))}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ValueError(f"max_steps={max_steps!r}: must be an integer >= 1")
    if not isinstance(stop_threshold, (int, float)) or not 0 < stop_threshold <= 1:
        raise ValueError(f"stop_threshold={stop_threshold!r}: must be in (0, 1]")
    captured = use_cuda_graph(cuda_graph, start.device)
    check_batch(state, start.shape[0], "start")
    check_room(state, max_steps, f"max_steps={max_steps}")
    search = _FrameSearch(step, state, start, max_steps=max_steps, stop_threshold=stop_threshold, feedback=feedback)
    search.advance()
    _run(search, max_steps - 1, captured=captured, check_every=_check_every(start.device))
    return search.result()


class _FrameSearch:
    """The frame loop on fixed buffers: the input x [B, 1, F_in], the frames and stop
    probabilities of every step [B, max_steps, ...] (made at the first step, which gives
    their width), and the count of steps run (0-dim)."""

    def __init__(self, step, state, start, *, max_steps, stop_threshold, feedback):
        batch, device = start.shape[0], start.device
        self.step, self.max_steps, self.stop_threshold, self.feedback = step, max_steps, stop_threshold, feedback
        self.x = start.clone()
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        state = static_state(state, room=max_steps, device=device)
        self.state, _, self.fixed_shape = own_buffers(state, lambda s: step(self.x, s)[2])
        self.in_place = False
        self.frames = self.stop_probs = None

    def warm(self) -> None:
        self.step(self.x, self.state)

    def advance(self) -> None:
        y, stop_logit, new = self.step(self.x, self.state)
        _keep(self, new)
        if self.frames is None:
            self.frames = y.new_zeros(y.shape[0], self.max_steps, y.shape[2])
            self.stop_probs = torch.zeros(y.shape[0], self.max_steps, device=y.device)
        prob = torch.sigmoid(stop_logit.float())[:, 0]  # [B]
        at = self.count.reshape(1)
        self.frames.index_copy_(1, at, y.to(self.frames.dtype))
        self.stop_probs.index_copy_(1, at, prob[:, None])
        now = ~self.stopped & (prob >= self.stop_threshold)
        self.lengths.copy_(torch.where(now, self.count + 1, self.lengths))
        self.stopped.logical_or_(now)
        self.x.copy_(self.feedback(y))
        self.count.add_(1)

    def done(self) -> Tensor:
        return self.stopped.all()

    def result(self) -> Frames:
        steps = int(self.count)  # every step run is kept; the loop stopped when all rows had
        if bool(self.stopped.all()):
            steps = int(self.lengths.max())  # the steps after the last row stopped were never wanted
        lengths = torch.where(self.stopped, self.lengths, steps)
        return Frames(self.frames[:, :steps], self.stop_probs[:, :steps], lengths)


__all__ = ["Frames", "Generated", "beam_search", "check_batch", "check_cuda_graph_key", "generate", "generate_frames",
           "own_buffers", "reorder", "reorder_changing", "static_state", "use_cuda_graph"]
