"""Language-modeling data: text files (or the embedded stdlib corpus) -> token streams -> windows.

Layouts of `data.path` (a folder):
- PG-19: `train/`, `validation/`, `test/`, each holding UTF-8 `.txt` books (one
  document per file, read in file-name order);
- plain: `train.txt`, `valid.txt`, `test.txt` (one document per file, e.g. WikiText).
`data.path: ""` reads the standard library's docstrings (lavo_tasks.text.corpus).

Each split is one token stream: its documents encoded and joined, each followed by the
end-of-document id, tokenized once into `data.token_cache` (default `<run.dir>/tokens`)
and memory-mapped from there (lavo_tasks.text.token_cache: a split is not held in memory, and
a run that points at the same folder with the same texts and tokenizer reuses it; the
texts are read only to train a BPE or to tokenize). Training windows start anywhere
(random starts drawn by StepBatchSampler, so a resumed run sees the same batches);
validation and test read
non-overlapping blocks. The test split is also read at 2x, 4x and 8x the training
length, over the same tokens at every length, so the perplexities compare directly.
"""

from pathlib import Path

import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from lavo_tasks.data import TaskDataModule
from lavo_tasks.text.corpus import SPLITS, stdlib_splits
from lavo_tasks.errors import DataError
from lavo_tasks.text.token_cache import MappedStream, cached_token_stream, file_source, text_source
from lavo_tasks.text.tokenizer import build_tokenizer, tokenizer_spec

TEST_LENGTH_FACTORS = (1, 2, 4, 8)
# The dataset's own names of the splits (`train` / `val` / `test` in the code).
_PG19_FOLDERS = {"train": "train", "val": "validation", "test": "test"}
_PLAIN_FILES = {"train": "train.txt", "val": "valid.txt", "test": "test.txt"}


def read_text(file: Path) -> str:
    try:
        return file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{file}: not UTF-8 text (invalid byte at offset {err.start}); books must be UTF-8") from None


def split_files(path: Path) -> dict[str, list[Path]]:
    """The text files of each split of a dataset folder in the PG-19 or the plain layout
    (only the layout is checked here, no file is read)."""
    if not path.is_dir():
        raise DataError(f"data.path={path}: must be a folder (PG-19 layout or train.txt/valid.txt/test.txt)")
    if all((path / folder).is_dir() for folder in _PG19_FOLDERS.values()):
        files = {split: sorted((path / folder).glob("*.txt")) for split, folder in _PG19_FOLDERS.items()}
        for split, books in files.items():
            if not books:
                raise DataError(f"{path / _PG19_FOLDERS[split]}: no .txt books in this PG-19 split folder")
        return files
    if all((path / name).is_file() for name in _PLAIN_FILES.values()):
        return {split: [path / name] for split, name in _PLAIN_FILES.items()}
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    found = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "") or "nothing"
    raise DataError(
        f"data.path={path}: expected folders train/ validation/ test/ of .txt books (PG-19) "
        f"or files train.txt valid.txt test.txt; found: {found}"
    )


class TokenWindows(Dataset):
    """Windows of `length + 1` tokens (inputs = [:-1], targets = [1:]) starting every
    `stride` tokens: stride 1 for training's random starts, `length` for test blocks."""

    def __init__(self, tokens: MappedStream, length: int, stride: int):
        self.tokens, self.length, self.stride = tokens, length, stride
        self.n = max((len(tokens) - length - 1) // stride + 1, 0)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.stride
        return self.tokens[start : start + self.length + 1].long()


class LMDataModule(TaskDataModule):
    """Tokenizes the splits in `setup`: `self.tokenizer`, `self.streams[split]`, and
    `self.datasets` "train" (windows at every token) and "val" (blocks); the test's
    blocks at each length come from `test_dataloader`."""

    def __init__(self, cfg: DictConfig):
        super().__init__(cfg)
        self.tokenizer = None
        self.streams: dict[str, MappedStream] = {}

    def spec(self) -> dict:
        """What the model needs: the vocabulary size and the tokenizer (to decode what it
        generates), as `lavo_tasks.text.tokenizer.tokenizer_spec` writes it. Tokenizes and checks
        every split first, so a bad book fails before training."""
        self.setup("fit")
        return {"vocab_size": self.tokenizer.vocab_size, "tokenizer": tokenizer_spec(self.tokenizer)}

    def setup(self, stage: str | None = None) -> None:
        """Tokenize (training the BPE if asked) and check the splits the stage reads, once
        each: testing reads only the test split, any other stage all three. The token
        streams come memory-mapped from the cache, tokenized there first if need be."""
        wanted = [split for split in (("test",) if stage == "test" else SPLITS) if split not in self.streams]
        if not wanted:
            return
        data = self.cfg.data
        run_dir = Path(self.cfg.run.dir)
        if data.path:
            files = split_files(Path(data.path))
            splits = {
                split: ([file_source(f) for f in paths], lambda paths=paths: map(read_text, paths), len(paths))
                for split, paths in files.items()
            }
            source = data.path
        else:
            texts = {split: [m.text for m in modules] for split, modules in stdlib_splits().items()}
            splits = {split: ([text_source(t)], lambda t=t: iter(t), len(t)) for split, t in texts.items()}
            source = "the standard-library corpus"
        if self.tokenizer is None:  # a saved <run.dir>/tokenizer.json is read, not trained again
            self.tokenizer = build_tokenizer(data, splits["train"][1](), run_dir)
        cache = Path(data.token_cache) if data.token_cache else run_dir / "tokens"
        longest = max(TEST_LENGTH_FACTORS) * data.seq_len
        need = {"train": data.seq_len + 1, "val": data.seq_len + 1, "test": longest + 1}
        for split in wanted:
            stream = cached_token_stream(split, *splits[split], self.tokenizer, cache)
            if len(stream) < need[split]:
                raise DataError(
                    f"{source}: the {split} split has {len(stream)} tokens; data.seq_len="
                    f"{data.seq_len} needs at least {need[split]} (test is also read at {max(TEST_LENGTH_FACTORS)}x seq_len)"
                )
            if split == "test":  # the same test tokens at every length: a whole number of the longest blocks
                stream = stream.head((len(stream) - 1) // longest * longest + 1)
            self.streams[split] = stream
            if split != "test":  # training windows start at every token, validation reads blocks
                self.datasets[split] = TokenWindows(stream, data.seq_len, stride=1 if split == "train" else data.seq_len)

    def test_dataloader(self) -> list[DataLoader]:
        """One loader per length factor; the batch shrinks as the blocks grow, so every
        batch holds the same number of tokens. Each process reads its own share of the
        blocks (ShardSampler; the module's metrics sum over the processes)."""
        seq_len, batch = self.cfg.data.seq_len, self.cfg.data.batch_size
        return [self.eval_loader(TokenWindows(self.streams["test"], f * seq_len, stride=f * seq_len),
                                 batch_size=max(batch // f, 1), shard=True)
                for f in TEST_LENGTH_FACTORS]
