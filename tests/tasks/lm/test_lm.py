"""The LM task: perplexity, corpus, data layouts, model causality / decoding / length, module."""

import math
import os

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from compiled_step import assert_whole_compiled_run
from lavo_tasks.attention import ATTENTION_NAMES
from lavo_tasks.config import compose, site_attention, validate
from lavo_tasks.text.corpus import SPLITS, stdlib_modules, stdlib_splits
from lavo_tasks.errors import ConfigError, DataError
from lavo_tasks.metrics import Mean
from lavo_tasks.tasks import lm
from lavo_tasks.tasks.lm.data import read_text, split_files
from lavo_tasks.tasks.lm.model import LanguageModel

# Per-attention keys that fit the tiny model below (head dim 8, sequences of 8-64 tokens).
TINY_ATTENTION = {
    "softmax": [],
    "local": ["attention.window=4"],
    "lavo": ["attention.window=4", "attention.rank=4"],
    "gsa": ["attention.slots=5"],
}


TINY = ["model.d_model=16", "model.n_heads=2", "model.n_layers=2", "model.d_ff=32", "data.seq_len=8",
        "data.batch_size=8", "generate.prompt_tokens=5", "generate.max_new_tokens=6"]


def tiny_cfg(tmp_path, attention="softmax", *extra):
    cfg = compose(["task=lm", f"attention={attention}", *TINY_ATTENTION[attention], *TINY,
                   f"run.dir={tmp_path / 'run'}", *extra])
    validate(cfg)
    return cfg


# -- perplexity ------------------------------------------------------------------------

def nll_of(probabilities):
    """The NLL of tokens whose model probabilities are given, through cross-entropy on
    log-probabilities (as the module computes it)."""
    p = torch.tensor(probabilities, dtype=torch.float64)
    logits = torch.stack([p.log(), (1 - p).log()], dim=-1)  # 2-token vocabulary, target 0
    return F.cross_entropy(logits, torch.zeros(len(p), dtype=torch.long), reduction="none")


def test_perplexity_is_exp_of_token_weighted_mean_nll_hand_computed():
    """The module's perplexity: exp of lavo_tasks.metrics.Mean over the token NLLs."""
    nll = Mean()
    nll.update(nll_of([1 / 2]))  # a batch of 1 token, perplexity 2
    nll.update(nll_of([1 / 8, 1 / 8, 1 / 8]).view(3, 1))  # 3 tokens, perplexity 8
    assert nll.compute().exp().item() == pytest.approx(2 ** ((1 + 3 * 3) / 4), rel=1e-12)  # 5.657, not (2 + 8) / 2


# -- the embedded corpus ---------------------------------------------------------------

def test_stdlib_corpus_is_deterministic_english_and_split():
    first = stdlib_modules()
    stdlib_modules.cache_clear()
    assert stdlib_modules() == first  # gathered again from the files: the same documents
    splits = stdlib_splits()
    names = [m.name for split in SPLITS for m in splits[split]]
    assert sorted(names) == sorted(m.name for m in first) and len(set(names)) == len(names)
    chars = {split: sum(len(m.text) for m in splits[split]) for split in SPLITS}
    assert chars["train"] > 500_000 and chars["val"] > 20_000 and chars["test"] > 20_000
    assert sum(chars.values()) < 5_000_000
    words = " ".join(m.text for m in splits["test"]).lower().split()
    assert words.count("the") / len(words) > 0.02  # English prose, not code
    assert not any("/test/" in f"/{m.name}" for m in first)


# -- data ------------------------------------------------------------------------------

def write(path, text: str | bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)


def read_all(path):
    """Every split's documents, read with the data module's own layout and text readers."""
    return {split: [read_text(file) for file in files] for split, files in split_files(path).items()}


def byte_stream(*docs):
    ids = []
    for doc in docs:
        ids += list(doc.encode()) + [256]
    return ids


def test_pg19_layout_reads_books_in_name_order(tmp_path):
    write(tmp_path / "train" / "b.txt", "second book é")
    write(tmp_path / "train" / "a.txt", "first book")
    write(tmp_path / "train" / "notes.md", "not a book")
    write(tmp_path / "validation" / "v.txt", "valid")
    write(tmp_path / "test" / "t.txt", "test")
    docs = read_all(tmp_path)
    assert docs == {"train": ["first book", "second book é"], "val": ["valid"], "test": ["test"]}  # code's split names


def test_plain_layout_and_token_streams(tmp_path):
    train = "a b c d e f g h i j k l m n o p " * 3
    test = "0123456789" * 20
    write(tmp_path / "train.txt", train)
    write(tmp_path / "valid.txt", "validation text, long enough for a block")
    write(tmp_path / "test.txt", test)
    cfg = tiny_cfg(tmp_path, "softmax", f"data.path={tmp_path}")
    dm = lm.DataModule(cfg)
    dm.setup("fit")
    assert dm.streams["train"].tolist() == byte_stream(train)
    # test: cut to whole blocks of 8 x seq_len = 64 tokens (+1 for the last target)
    assert dm.streams["test"].tolist() == byte_stream(test)[:3 * 64 + 1]
    loaders = dm.test_dataloader()
    assert [loader.batch_size for loader in loaders] == [8, 4, 2, 1]
    for factor, loader in zip((1, 2, 4, 8), loaders):
        blocks = torch.cat(list(loader))  # [n, factor * 8 + 1]
        assert blocks.shape[1] == factor * 8 + 1
        # non-overlapping blocks whose targets cover the same tokens at every length
        assert blocks[:, 1:].flatten().tolist() == dm.streams["test"][1:].tolist()


def small_corpus(folder, valid="the lazy dog sleeps; the fox jumps. " * 3):
    write(folder / "train.txt", "the quick brown fox jumps over the lazy dog. " * 40)
    write(folder / "valid.txt", valid)
    write(folder / "test.txt", "a quick fox and a lazy dog. " * 6)
    return folder


def test_train_batches_are_random_windows_that_follow_the_global_step(tmp_path):
    cfg = tiny_cfg(tmp_path, "softmax", f"data.path={small_corpus(tmp_path / 'corpus')}")
    dm = lm.DataModule(cfg)
    dm.setup("fit")
    train = dm.streams["train"]
    stream = iter(dm.train_dataloader())
    batches = [next(stream) for _ in range(4)]
    starts = set()
    for batch in batches:
        assert batch.shape == (8, 9) and batch.dtype == torch.long
        for row in batch:  # every row is some window of the training stream
            matches = [s for s in range(len(train) - 8) if torch.equal(train[s : s + 9].long(), row)]
            assert matches
            starts.add(matches[0])
    assert len(starts) > 8  # random starts, not a fixed few

    class Attached:  # what a trainer resumed at step 3 tells the datamodule
        global_step = 3

    dm.trainer = Attached()
    assert torch.equal(next(iter(dm.train_dataloader())), batches[3])


def test_lm_splits_come_from_the_cache_and_later_runs_do_not_read_the_texts(tmp_path, monkeypatch):
    corpus = small_corpus(tmp_path / "corpus")
    cache = tmp_path / "shared_tokens"
    first = lm.DataModule(tiny_cfg(tmp_path / "run1", "softmax", f"data.path={corpus}", f"data.token_cache={cache}"))
    first.setup("fit")
    assert sorted(p.name.split("-")[0] for p in cache.glob("*.bin")) == ["test", "train", "val"]
    assert first.streams["train"].tolist() == byte_stream((corpus / "train.txt").read_text())

    def no_reading(path):
        raise AssertionError(f"{path} was read although its tokens are cached")

    monkeypatch.setattr(lm.data, "read_text", no_reading)
    second = lm.DataModule(tiny_cfg(tmp_path / "run2", "softmax", f"data.path={corpus}", f"data.token_cache={cache}"))
    second.setup("fit")
    for split in ("train", "val", "test"):
        assert torch.equal(second.streams[split].tensor, first.streams[split].tensor)


def test_lm_spec_and_a_test_stage_that_reads_only_the_test_split(tmp_path, monkeypatch):
    corpus = small_corpus(tmp_path / "corpus")
    spec = lm.DataModule(tiny_cfg(tmp_path, "softmax", f"data.path={corpus}")).spec()
    assert spec == {"vocab_size": 257, "tokenizer": "byte"}
    read, real_read = [], lm.data.read_text
    monkeypatch.setattr(lm.data, "read_text", lambda path: read.append(path.name) or real_read(path))
    dm = lm.DataModule(tiny_cfg(tmp_path / "later", "softmax", f"data.path={corpus}"))  # a cache of its own
    dm.setup("test")  # what evaluate asks for
    assert read == ["test.txt"] and set(dm.streams) == {"test"}


def test_lm_default_cache_is_in_the_run_folder_and_bad_text_names_the_file(tmp_path):
    corpus = small_corpus(tmp_path / "corpus")
    cfg = tiny_cfg(tmp_path, "softmax", f"data.path={corpus}")
    lm.DataModule(cfg).setup("fit")
    assert len(list((tmp_path / cfg.run.dir / "tokens").glob("*.bin"))) == 3
    write(corpus / "test.txt", "caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(DataError, match=r"test.txt: not UTF-8 text \(invalid byte at offset 3\)"):
        lm.DataModule(cfg).setup("fit")
    assert not [name for name in os.listdir(tmp_path / cfg.run.dir / "tokens") if name.endswith(".tmp")]


def test_a_token_cache_that_is_a_file_is_a_config_error(tmp_path):
    write(tmp_path / "tokens.bin", "not a folder")
    with pytest.raises(ConfigError, match=r"data.token_cache=.*tokens.bin: a file; it must name a folder"):
        tiny_cfg(tmp_path, "softmax", f"data.token_cache={tmp_path / 'tokens.bin'}")


def test_layout_errors_name_what_is_wrong(tmp_path):
    write(tmp_path / "train.txt", "only one file")
    with pytest.raises(DataError, match=r"expected folders train/ validation/ test/.*or files train.txt "
                                        r"valid.txt test.txt; found: train.txt"):
        read_all(tmp_path)
    pg = tmp_path / "pg"
    for folder in ("train", "validation", "test"):  # PG-19's folder names (the code's splits: train, val, test)
        (pg / folder).mkdir(parents=True)
    write(pg / "train" / "x.txt", "text")
    with pytest.raises(DataError, match=r"pg/validation: no .txt books"):
        read_all(pg)
    write(pg / "validation" / "v.txt", "ok")
    write(pg / "test" / "latin1.txt", "caf\xe9".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.txt: not UTF-8 text \(invalid byte at offset 3\)"):
        read_all(pg)
    with pytest.raises(DataError, match=r"must be a folder"):
        read_all(tmp_path / "train.txt")
    # the layout is checked with the configuration, before any work
    with pytest.raises(DataError, match=r"expected folders train/ validation/ test/"):
        tiny_cfg(tmp_path, "softmax", f"data.path={tmp_path}")


@pytest.mark.parametrize("override, message", [
    ("data.seq_len=4", r"data.seq_len=4: must be >= 8"),
    ("generate.temperature=-0.5", r"generate.temperature=-0.5: must be >= 0"),
    ("generate.max_new_tokens=0", r"generate.max_new_tokens=0: must be >= 1"),
    ("data.tokenizer=wordpiece", r"data.tokenizer='wordpiece': allowed: byte, bpe"),
])
def test_bad_lm_keys_are_named(tmp_path, override, message):  # the model sizes': tests/core/test_backbone.py
    with pytest.raises(ConfigError, match=message):
        tiny_cfg(tmp_path, "softmax", override)


def test_too_short_test_split_is_a_clear_error(tmp_path):
    write(tmp_path / "train.txt", "x" * 100)
    write(tmp_path / "valid.txt", "x" * 100)
    write(tmp_path / "test.txt", "x" * 40)
    dm = lm.DataModule(tiny_cfg(tmp_path, "softmax", f"data.path={tmp_path}"))
    with pytest.raises(DataError, match=r"the test split has 41 tokens; data.seq_len=8 needs at least 65"):
        dm.setup("fit")


# -- model -----------------------------------------------------------------------------

def tiny_model(tmp_path, attention):
    torch.manual_seed(0)
    cfg = tiny_cfg(tmp_path, attention)
    model = LanguageModel(257, cfg.model, site_attention(cfg, "attention")).double().eval()
    with torch.no_grad():  # a wider spread of logits than at init: argmax ties are not an issue
        model.embed.weight.normal_(0, 1.0)
    return model


@pytest.mark.parametrize("attention", ATTENTION_NAMES)
def test_model_is_causal_at_eight_times_the_training_length(tmp_path, attention):
    model = tiny_model(tmp_path, attention)
    tokens = torch.randint(257, (2, 64), generator=torch.Generator().manual_seed(1))  # 8 x seq_len
    with torch.no_grad():
        full, _ = model(tokens)
        assert full.shape == (2, 64, 257) and torch.isfinite(full).all()
        for t in (0, 5, 31, 63):
            cut, _ = model(tokens[:, : t + 1])
            torch.testing.assert_close(cut[:, t], full[:, t], rtol=0, atol=1e-9)
        changed = tokens.clone()
        changed[:, 40:] = (changed[:, 40:] + 1) % 257
        later, _ = model(changed)
    torch.testing.assert_close(later[:, :40], full[:, :40], rtol=0, atol=1e-9)
    assert not torch.allclose(later[:, 40:], full[:, 40:])


@pytest.mark.parametrize("attention", ATTENTION_NAMES)
def test_greedy_generation_with_decode_states_matches_full_forward(tmp_path, attention):
    model = tiny_model(tmp_path, attention)
    prompt = torch.randint(257, (2, 7), generator=torch.Generator().manual_seed(2))
    new = model.generate(prompt, 12)  # prefill + 12 decode steps through the states
    assert new.shape == (2, 12)
    with torch.no_grad():
        logits, _ = model(torch.cat([prompt, new], dim=1))
    # each generated token is the argmax of the full forward at the position before it
    assert torch.equal(logits[:, 6:-1].argmax(-1), new)


def test_generation_steps_through_the_eager_forward_of_a_compiled_model(tmp_path):
    """trainer.compile compiles the model's call in place; generating must not go through
    it: under reduce-overhead the next replay of its CUDA graphs overwrites the outputs
    (the prefill's decode state) that the following step reads. A counting backend sees
    every frame Dynamo would compile."""
    from torch._dynamo.testing import CompileCounter

    model = tiny_model(tmp_path, "lavo")
    prompt = torch.randint(257, (2, 7), generator=torch.Generator().manual_seed(2))
    eager = model.generate(prompt, 5)
    counter = CompileCounter()
    model.compile(backend=counter)
    try:
        with torch.no_grad():
            model(prompt)  # the compiled call is in place: this call compiles
        compiled = counter.frame_count
        assert compiled >= 1
        assert torch.equal(model.generate(prompt, 5), eager)
        assert counter.frame_count == compiled  # generation compiled nothing more
    finally:
        torch._dynamo.reset()


def state_bytes(state) -> int:
    """Bytes of every tensor reachable from a decode state (tuples, lists, dataclasses)."""
    if isinstance(state, torch.Tensor):
        return state.nbytes
    if isinstance(state, (tuple, list)):
        return sum(state_bytes(s) for s in state)
    if hasattr(state, "__dict__"):
        return sum(state_bytes(s) for s in vars(state).values())
    return 0


@pytest.mark.parametrize("attention", ATTENTION_NAMES)
def test_decode_state_size_is_constant_except_the_softmax_kv_cache(tmp_path, attention):
    model = tiny_model(tmp_path, attention)
    tokens = torch.randint(257, (1, 48), generator=torch.Generator().manual_seed(4))
    states = model.init_state(1)
    sizes = []
    with torch.no_grad():
        for chunk in tokens.split(16, dim=1):  # 16, 32, 48 tokens seen (window 4)
            _, states = model(chunk, states)
            sizes.append(state_bytes(states))
    assert sizes[0] > 0
    if attention in ("lavo", "gsa", "local"):
        assert sizes[0] == sizes[1] == sizes[2]
    else:  # softmax keeps a KV cache that grows with the text
        assert sizes[0] < sizes[1] < sizes[2]


def test_sampling_is_seeded_and_respects_top_k(tmp_path):
    model = tiny_model(tmp_path, "softmax")
    prompt = torch.randint(257, (1, 4), generator=torch.Generator().manual_seed(3))

    def sample(seed, top_k):
        return model.generate(prompt, 10, temperature=1.0, top_k=top_k, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(5, 0), sample(5, 0))
    assert not torch.equal(sample(5, 0), sample(6, 0))
    # top_k=1 keeps only the most likely token: the same as greedy
    assert torch.equal(sample(7, 1), model.generate(prompt, 10))


# -- the module end to end (Lightning, a few steps) ------------------------------------

def independent_ppl(model, stream: torch.Tensor, length: int) -> float:
    """exp(mean NLL) over every non-overlapping block, computed in one pass, float64."""
    n = (len(stream) - 1) // length
    x = stream[: n * length + 1].long()
    inputs, targets = x[:-1].view(n, length), x[1:].view(n, length)
    with torch.no_grad():
        logits, _ = model(inputs)
    logp = torch.log_softmax(logits.double(), dim=-1)
    return math.exp(-logp.gather(-1, targets[..., None]).mean().item())


def test_module_trains_and_reports_token_weighted_perplexities(tmp_path):
    corpus = small_corpus(tmp_path / "corpus")  # validation: 109 tokens, 13 blocks of 8
    cfg = tiny_cfg(tmp_path, "softmax", f"data.path={corpus}", "data.batch_size=4", "trainer.max_steps=30",
                    "optim.lr=0.01", "optim.warmup_steps=2")
    dm = lm.DataModule(cfg)
    dm.setup("fit")
    module = lm.Module(cfg, dm.spec())
    trainer = L.Trainer(max_steps=30, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    before = trainer.validate(module, dm, verbose=False)[0]["val_ppl"]
    trainer.fit(module, dm)
    metrics = trainer.validate(module, dm, verbose=False)[0]
    module.model.eval()
    # 13 blocks of 8 in batches of 4, 4, 4, 1: the logged value weighs every token the same
    assert metrics["val_ppl"] == pytest.approx(independent_ppl(module.model, dm.streams["val"], 8), rel=1e-4)
    assert metrics["val_loss"] == pytest.approx(math.log(metrics["val_ppl"]), rel=1e-5)
    assert metrics["val_ppl"] < 0.25 * before  # it learns

    results = trainer.test(module, dm, verbose=False)[0]
    for name, factor in [("test_ppl", 1), ("test_ppl_2x", 2), ("test_ppl_4x", 4), ("test_ppl_8x", 8)]:
        expected = independent_ppl(module.model, dm.streams["test"], factor * 8)
        assert results[name] == pytest.approx(expected, rel=1e-4), name
    generated = (tmp_path / "run" / "artifacts" / "generated.txt").read_text()
    assert generated.startswith("# prompt: the first 5 tokens of the test split\na qui\n# generated: 6 tokens")
    png = (tmp_path / "run" / "artifacts" / "ppl_vs_context.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_a_whole_run_compiled_with_cuda_graphs(tmp_path):
    """Training and validation at seq_len, the test at 1-8x it and generation: each new
    length compiles and records again, in evaluation only."""
    corpus = small_corpus(tmp_path / "corpus")
    metrics = assert_whole_compiled_run(["task=lm", "attention=lavo", *TINY_ATTENTION["lavo"], *TINY,
                                         f"data.path={corpus}", "trainer.max_steps=3", "trainer.val_check_interval=3",
                                         "trainer.enable_progress_bar=false"], tmp_path / "run")
    assert {"test_ppl", "test_ppl_8x"} <= set(metrics)
