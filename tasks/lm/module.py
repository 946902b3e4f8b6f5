"""The LM task's LightningModule: next-token cross-entropy, perplexities, artifacts."""

import matplotlib

matplotlib.use("Agg")  # artifacts are files; no display needed
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from lavo_tasks.config import site_attention
from lavo_tasks.files import write_atomically
from lavo_tasks.metrics import Mean
from lavo_tasks.module import TaskModule
from lavo_tasks.plots import attention_label, format_metrics, readable_ylim, save_figure
from lavo_tasks.text.tokenizer import tokenizer_from_spec

from .data import TEST_LENGTH_FACTORS
from .model import LanguageModel

TEST_METRICS = tuple("test_ppl" if f == 1 else f"test_ppl_{f}x" for f in TEST_LENGTH_FACTORS)
LONGEST = TEST_LENGTH_FACTORS.index(max(TEST_LENGTH_FACTORS))  # the test loader of the longest blocks


class LMModule(TaskModule):
    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: LMDataModule.spec(), {"vocab_size", "tokenizer"}."""
        super().__init__(cfg)
        self.tokenizer = tokenizer_from_spec(spec["tokenizer"])
        self.attention = site_attention(cfg, "attention")
        self.model = LanguageModel(spec["vocab_size"], cfg.model, self.attention)
        self.prompt = None  # [P]: the test split's first tokens, taken from its first longest block
        # Mean NLL per token (perplexity = its exp), summed over the processes' shares.
        self.val_nll = Mean()
        self.test_nll = nn.ModuleList(Mean() for _ in TEST_LENGTH_FACTORS)

    def token_nll(self, batch: torch.Tensor) -> torch.Tensor:
        """batch [B, L + 1] token windows -> NLL of each next token [B, L]."""
        logits, _ = self.model(batch[:, :-1])
        return F.cross_entropy(logits.transpose(1, 2).float(), batch[:, 1:], reduction="none")

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.token_nll(batch).mean()
        self.log("train_loss", loss, prog_bar=True)
        return loss

    # -- validation: one token-weighted perplexity over the evaluated blocks
    def on_validation_epoch_start(self) -> None:
        self.val_nll.reset()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.val_nll.update(self.token_nll(batch))

    def on_validation_epoch_end(self) -> None:
        nll = self.val_nll.compute()
        self.log_dict({"val_loss": nll, "val_ppl": nll.exp()}, prog_bar=True)

    # -- test: one perplexity per length, and NLL by position within the longest blocks
    def on_test_epoch_start(self) -> None:
        for metric in self.test_nll:
            metric.reset()
        longest = max(TEST_LENGTH_FACTORS) * self.cfg.data.seq_len
        self.position_nll = torch.zeros(longest, dtype=torch.float64)
        self.position_count = 0

    def test_step(self, batch: torch.Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        nll = self.token_nll(batch)  # [B, f * seq_len]
        self.test_nll[dataloader_idx].update(nll)
        if dataloader_idx == LONGEST:
            if batch_idx == 0:  # on process 0 (ShardSampler's first share), the start of the test split
                self.prompt = batch[0, : self.cfg.generate.prompt_tokens].cpu()
            self.position_nll += nll.double().sum(0).cpu()
            self.position_count += nll.shape[0]

    def on_test_epoch_end(self) -> None:
        ppl = {name: metric.compute().exp() for name, metric in zip(TEST_METRICS, self.test_nll)}
        self.log_dict(ppl)
        reduce = self.trainer.strategy.reduce
        sums = reduce(self.position_nll.to(self.device), reduce_op="sum")
        count = reduce(torch.tensor(float(self.position_count), device=self.device), reduce_op="sum")
        if self.trainer.is_global_zero:
            self.write_generated_text()
            self.plot_ppl_vs_context({k: float(v) for k, v in ppl.items()}, (sums / count).cpu())

    # -- artifacts
    def write_generated_text(self) -> None:
        gen = self.cfg.generate
        if self.prompt is None:
            raise RuntimeError("the test saw no block of the longest length, whose start is generated.txt's prompt")
        generator = torch.Generator(self.device).manual_seed(self.cfg.seed)  # on the GPU: drawn inside the graph
        new = self.model.generate(self.prompt[None].to(self.device), gen.max_new_tokens, temperature=gen.temperature,
                                  top_k=gen.top_k, generator=generator, cuda_graph=gen.cuda_graph)[0]
        text = (
            f"# prompt: the first {len(self.prompt)} tokens of the test split\n"
            f"{self.tokenizer.decode(self.prompt.tolist())}\n"
            f"# generated: {gen.max_new_tokens} tokens, temperature {gen.temperature}, top_k {gen.top_k}, "
            f"attention {self.attention.name}, through the decode states\n"
            f"{self.tokenizer.decode(new.tolist())}\n"
        )
        write_atomically(self.artifacts_dir / "generated.txt", lambda f: f.write(text.encode("utf-8")))

    def plot_ppl_vs_context(self, ppl: dict[str, float], position_nll: torch.Tensor) -> None:
        """Left: test perplexity at each evaluation length. Right: perplexity by position
        inside the longest blocks (bins of seq_len / 4 tokens); past the dashed line the
        model sees more context than in training. The y axes span at least 10 % of their
        values (lavo_tasks.plots.readable_ylim), so a change of 0.02 does not read as a slope."""
        seq_len = self.cfg.data.seq_len
        lengths = [f * seq_len for f in TEST_LENGTH_FACTORS]
        bin_size = max(seq_len // 4, 1)
        binned = position_nll[: len(position_nll) // bin_size * bin_size].view(-1, bin_size).mean(1).exp()
        centers = (torch.arange(len(binned)) + 0.5) * bin_size

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        left.plot(lengths, list(ppl.values()), marker="o")
        left.set(xscale="log", xlabel="evaluation length (tokens)", ylabel="test perplexity",
                 title="perplexity vs evaluation length")
        left.minorticks_off()
        left.set_xticks(lengths, [str(n) for n in lengths])
        readable_ylim(left, list(ppl.values()))
        right.plot(centers, binned)
        right.axvline(seq_len, linestyle="--", color="gray", label=f"training length {seq_len}")
        right.set(xlabel="position in the block (tokens)", ylabel="perplexity",
                  title=f"perplexity by position ({lengths[-1]}-token blocks)")
        readable_ylim(right, binned.tolist())
        right.legend()
        fig.suptitle(f"LM, attention {attention_label(self.cfg)}\n{format_metrics(ppl, TEST_METRICS)}", fontsize=9)
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "ppl_vs_context.png")
        plt.close(fig)
