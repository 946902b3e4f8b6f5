"""Multi-query associative recall sequences (Zoology's MQAR construction, Arora et al. 2023).

One sequence is `seq_len + 1` tokens z; the model reads z[:-1] and is scored on the next
token z[1:] at the queried positions only:

    z = k_1 v_1 k_2 v_2 ... k_N v_N | query region of seq_len + 1 - 2N tokens

- token 0 is the blank (never a key or a value); keys are distinct tokens of the lower
  half [1, V // 2), values distinct tokens of the upper half [V // 2, V), V = vocab_size;
- the query region is cut into slots of two tokens; Q of them, drawn uniformly, hold a
  query `k_i v_i` of Q distinct pairs drawn among the N; the other tokens are blanks
  (Zoology fills them with random tokens, which the loss never reads either);
- the target at a query key's position is its value; every other target is IGNORE.

Sequences are drawn in batches from a torch.Generator: training batch k from
`lavo_tasks.data.step_generator(seed, k)` (a fresh batch every step, so a resumed run
sees the batches an uninterrupted one would), validation and test sets from seeds of
their own derived from `seed`. A run writes its validation and test sets to
`<run.dir>/mqar_set.pt`; `data.path` naming such a file evaluates on exactly those
sequences (training still draws from the seed).
"""

from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lavo_tasks.data import ShardSampler, process_rank, step_generator
from lavo_tasks.errors import ConfigError, DataError

BLANK = 0
IGNORE = -100  # the target of a position that is not scored (F.cross_entropy's ignore_index)
SET_FILE = "mqar_set.pt"
SET_KEYS = ("vocab_size", "seq_len", "num_kv_pairs", "num_queries")  # what a saved set must agree on
# The seeds of the evaluation sets: seed * 1_000_003 + step is the training batches' rule,
# so offsets far beyond any step count keep them apart.
_EVAL_SEED_OFFSET = {"val": 10**12, "test": 2 * 10**12}


def key_range(vocab_size: int) -> tuple[int, int]:
    """[low, high) of the key tokens: the lower half of the vocabulary without the blank."""
    return 1, vocab_size // 2


def value_range(vocab_size: int) -> tuple[int, int]:
    """[low, high) of the value tokens: the upper half of the vocabulary."""
    return vocab_size // 2, vocab_size


def query_slots(seq_len: int, num_kv_pairs: int) -> int:
    """The two-token slots of the query region (z has seq_len + 1 tokens)."""
    return (seq_len + 1 - 2 * num_kv_pairs) // 2


def _draw_distinct(low: int, high: int, batch: int, count: int, g: torch.Generator) -> torch.Tensor:
    """[batch, count] of distinct integers of [low, high) per row, uniformly."""
    return torch.rand(batch, high - low, generator=g).argsort(dim=1)[:, :count] + low


def make_sequences(batch: int, vocab_size: int, seq_len: int, num_kv_pairs: int, num_queries: int,
                   g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` MQAR sequences -> (inputs [batch, seq_len], targets [batch, seq_len])."""
    n, q = num_kv_pairs, num_queries
    keys = _draw_distinct(*key_range(vocab_size), batch, n, g)  # [B, N]
    values = _draw_distinct(*value_range(vocab_size), batch, n, g)  # [B, N]
    z = torch.full((batch, seq_len + 1), BLANK, dtype=torch.long)
    z[:, 0:2 * n:2], z[:, 1:2 * n:2] = keys, values
    asked = _draw_distinct(0, n, batch, q, g)  # [B, Q]: which pairs are queried
    slots = _draw_distinct(0, query_slots(seq_len, n), batch, q, g)  # [B, Q]: where
    where = 2 * n + 2 * slots  # [B, Q]: position of each query key in z
    z.scatter_(1, where, keys.gather(1, asked))
    z.scatter_(1, where + 1, values.gather(1, asked))
    targets = torch.full((batch, seq_len), IGNORE, dtype=torch.long)
    targets.scatter_(1, where, values.gather(1, asked))  # the input at `where` is the key; its target the value
    return z[:, :-1], targets


def sizes(data: DictConfig) -> tuple[int, int, int, int]:
    return data.vocab_size, data.seq_len, data.num_kv_pairs, data.num_queries


def check_sizes(data: DictConfig) -> None:
    """ConfigError naming the first of the construction's keys that cannot hold together."""
    vocab, seq_len, n, q = sizes(data)
    low, high = key_range(max(vocab, 0))
    if vocab < 4:
        raise ConfigError(f"data.vocab_size={vocab}: must be >= 4 (the blank, keys, values)")
    if not 1 <= n <= high - low:
        raise ConfigError(f"data.num_kv_pairs={n}: must be in [1, {high - low}]: keys are distinct tokens of "
                          f"[{low}, {high}) (data.vocab_size={vocab}: the lower half without the blank 0)")
    if not 1 <= q <= n:
        raise ConfigError(f"data.num_queries={q}: must be in [1, data.num_kv_pairs={n}] (each pair is asked once at most)")
    need = 2 * n + 2 * q - 1
    if seq_len < need:
        raise ConfigError(f"data.seq_len={seq_len}: must be >= 2 * num_kv_pairs + 2 * num_queries - 1 = {need} "
                          f"({n} pairs, then {q} queries of a key and its value)")


def read_saved_set(path: Path) -> dict:
    """The saved set at `path`: {"vocab_size", "seq_len", "num_kv_pairs", "num_queries": int,
    "val", "test": (inputs, targets)}; DataError naming the file when it is not one."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many kinds for a file that is not its format
        raise DataError(f"data.path={path}: not an MQAR set written by task=mqar ({type(err).__name__})") from None
    missing = [k for k in (*SET_KEYS, "val", "test") if not isinstance(saved, dict) or k not in saved]
    if missing:
        raise DataError(f"data.path={path}: not an MQAR set written by task=mqar (no {missing[0]!r})")
    return saved


def check_saved_set(data: DictConfig) -> None:
    """ConfigError naming the first key on which the saved set at data.path disagrees with the config."""
    saved = read_saved_set(Path(data.path))
    for key, value in zip(SET_KEYS, sizes(data)):
        if int(saved[key]) != value:
            raise ConfigError(f"data.{key}={value}: the saved set data.path={data.path} was made with "
                              f"data.{key}={int(saved[key])}; set data.{key}={int(saved[key])} or data.path=\"\"")


def eval_set(data: DictConfig, seed: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation or test sequences of this seed and these sizes."""
    count = data.val_size if split == "val" else data.test_size
    g = torch.Generator().manual_seed(seed + _EVAL_SEED_OFFSET[split])
    return make_sequences(count, *sizes(data), g)


class TrainBatches(IterableDataset):
    """An endless stream of training batches (inputs, targets), batch k drawn from
    step_generator(seed, k). Under DDP each process takes its own rows of the
    world_size * batch_size drawn for the step. With data.num_workers > 0, worker w of W
    makes steps start + w, start + w + W, ... (the DataLoader takes them in turn, so the
    order is that of one process)."""

    def __init__(self, data: DictConfig, seed: int, start_step: int):
        self.data, self.seed, self.start_step = data, seed, start_step

    def __iter__(self):
        rank, world = process_rank(None, None, "TrainBatches")
        worker = torch.utils.data.get_worker_info()
        first, stride = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        size = self.data.batch_size
        step = self.start_step + first
        while True:
            inputs, targets = make_sequences(world * size, *sizes(self.data), step_generator(self.seed, step))
            rows = slice(rank * size, (rank + 1) * size)
            yield inputs[rows], targets[rows]
            step += stride


class MQARDataModule(L.LightningDataModule):
    def __init__(self, cfg: DictConfig):
        super().__init__()
        self.cfg = cfg
        self.sets: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def spec(self) -> dict:
        """What the model needs: the vocabulary size (and the evaluation sets, made and checked)."""
        self.setup("fit")
        return {"vocab_size": self.cfg.data.vocab_size}

    def setup(self, stage: str | None = None) -> None:
        """The validation and test sets: from data.path, or drawn from the seed and written
        to <run.dir>/mqar_set.pt for exact reuse."""
        if self.sets:
            return
        data = self.cfg.data
        if data.path:
            check_saved_set(data)
            saved = read_saved_set(Path(data.path))
            self.sets = {split: tuple(saved[split]) for split in ("val", "test")}
            return
        self.sets = {split: eval_set(data, self.cfg.seed, split) for split in ("val", "test")}
        out = Path(self.cfg.run.dir) / SET_FILE
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**dict(zip(SET_KEYS, sizes(data))), **self.sets}, out)

    def train_dataloader(self) -> DataLoader:
        start_step = self.trainer.global_step if self.trainer is not None else 0
        return DataLoader(TrainBatches(self.cfg.data, self.cfg.seed, start_step), batch_size=None,
                          num_workers=self.cfg.data.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def _loader(self, split: str) -> DataLoader:
        """Each process reads its own contiguous share of the set (ShardSampler)."""
        dataset = TensorDataset(*self.sets[split])
        return DataLoader(dataset, batch_size=self.cfg.data.batch_size, sampler=ShardSampler(len(dataset)),
                          num_workers=self.cfg.data.num_workers)
