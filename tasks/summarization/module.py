"""Training and evaluation of the summarizer.

Loss: cross-entropy over the target tokens with label smoothing `loss.label_smoothing`
(CAB: 0.1). Validation logs `val_loss`, the plain NLL per target token (no smoothing),
which best.ckpt follows. Test: `test_loss` (the same NLL over the test split), the
summaries generated through the decode states (`decode.*`: greedy at beam 1, else beam
search), `test_rouge1`, `test_rouge2`, `test_rougeL` against the untruncated
references, the same ROUGE of the lead baseline on the same examples
(`test_lead_rouge1/2/L`), and the mean lengths in tokens of the generated summaries
(`test_generated_len`, the end token included when one was generated) and of the
references as trained (`test_reference_len`: truncated to data.max_target_len, the end token
included). Artifacts: `summaries.csv` (every test example) and
`summaries.md` (the first TABLE_ROWS) with a source excerpt, the reference, the lead
and the generated summary.

The test metrics are torchmetrics sums (lavo_tasks.metrics, metrics.Rouge), added up
over the processes: with several devices each process decodes its share of the test
examples (the loader shards them) and every process gets the metrics of the whole
split. The tables gather the rows of every process onto the first.
"""

import csv
import io

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig

from lavo_tasks.backbone import encoder_decoder_args
from lavo_tasks.files import write_atomically
from lavo_tasks.generation import generate
from lavo_tasks.metrics import Mean, SumRatio
from lavo_tasks.module import TaskModule
from lavo_tasks.plots import attention_label
from lavo_tasks.text.tokenizer import tokenizer_from_spec

from .metrics import Rouge, lead
from .model import Summarizer

TABLE_ROWS = 20
IGNORED = -100  # the target id of padding, which the loss skips
SOURCE_EXCERPT_CHARS = 300


class SummarizationModule(TaskModule):
    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: SummarizationDataModule.spec() (vocabulary size, end id, tokenizer)."""
        super().__init__(cfg)
        self.tokenizer = tokenizer_from_spec(spec["tokenizer"])
        self.eos_id = spec["eos_id"]
        self.model = Summarizer(spec["vocab_size"], **encoder_decoder_args(cfg), cross_causal=cfg.model.cross_causal)
        stemming = cfg.metrics.rouge_stemming
        self.val_nll, self.test_nll = SumRatio(), SumRatio()  # NLL summed over tokens / tokens
        self.rouge, self.lead_rouge = Rouge(stemming), Rouge(stemming)
        self.generated_len, self.reference_len = Mean(), Mean()  # tokens per example

    def token_losses(self, batch: dict, label_smoothing: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(the summed cross-entropy of the real target tokens, their count), two 0-dim
        tensors. Padding is ignored by its target rather than dropped by a boolean mask:
        selecting by a mask waits for the GPU (the selection's size) and gives a compiled
        model a shape that depends on the data."""
        logits = self.model(batch["source"], batch["decoder_input"], batch["source_mask"], batch["target_mask"])
        mask = batch["target_mask"]
        target = batch["target"].masked_fill(~mask, IGNORED)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORED,
                                 label_smoothing=label_smoothing, reduction="none")  # [B * T], 0 at padding
        return losses.sum(), mask.sum()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        total, count = self.token_losses(batch, self.cfg.loss.label_smoothing)
        loss = total / count
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["source"]))
        return loss

    # -- validation: the NLL per target token over the evaluated batches
    def on_validation_epoch_start(self) -> None:
        self.val_nll.reset()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_nll.update(*self.token_losses(batch))

    def on_validation_epoch_end(self) -> None:
        self.log("val_loss", float(self.val_nll.compute()), prog_bar=True)

    # -- test: NLL, generated summaries, ROUGE of the model and of the lead baseline
    def on_test_epoch_start(self) -> None:
        for metric in (self.test_nll, self.rouge, self.lead_rouge, self.generated_len, self.reference_len):
            metric.reset()
        self.rows = []

    @torch.no_grad()
    def summarize(self, source: torch.Tensor, source_mask: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        """The generated summaries of source [B, S] as text, and their lengths [B] in tokens."""
        d = self.cfg.decode
        prefix = torch.full((len(source), 1), self.eos_id, dtype=torch.long, device=source.device)
        positions = prefix.shape[1] + d.max_len
        state = self.model.init_state(source, source_mask, positions=positions)
        out = generate(self.model.step, state, prefix, max_len=d.max_len, max_positions=positions,
                       min_len=d.min_len, eos_id=self.eos_id, pad_id=self.eos_id, beam=d.beam,
                       length_penalty=d.length_penalty, no_repeat_ngram=d.no_repeat_ngram, cuda_graph=d.cuda_graph)
        texts = []
        for tokens, length in zip(out.tokens.tolist(), out.lengths.tolist()):
            tokens = tokens[:length]
            if tokens and tokens[-1] == self.eos_id:
                tokens = tokens[:-1]
            texts.append(self.tokenizer.decode(tokens))
        return texts, out.lengths

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self.test_nll.update(*self.token_losses(batch))
        generated, lengths = self.summarize(batch["source"], batch["source_mask"])
        references = batch["reference"]
        leads = [lead(source, reference) for source, reference in zip(batch["source_text"], references)]
        self.rouge.update(generated, references)
        self.lead_rouge.update(leads, references)
        self.generated_len.update(lengths)
        self.reference_len.update(batch["target_mask"].sum(dim=1))
        for source, reference, lead_text, summary in zip(batch["source_text"], references, leads, generated):
            self.rows.append((source[:SOURCE_EXCERPT_CHARS], reference, lead_text, summary))

    def on_test_epoch_end(self) -> None:
        metrics = {"test_loss": self.test_nll.compute(), "test_generated_len": self.generated_len.compute(),
                   "test_reference_len": self.reference_len.compute()}
        metrics |= {f"test_{name}": value for name, value in self.rouge.compute().items()}
        metrics |= {f"test_lead_{name}": value for name, value in self.lead_rouge.compute().items()}
        self.log_dict({name: float(value) for name, value in metrics.items()})
        rows = self.gathered_rows()
        if self.trainer.is_global_zero:
            self.write_tables(rows)

    def gathered_rows(self) -> list[tuple]:
        """The table rows of every process, in the order of the test split (the shares are
        contiguous and in rank order); a collective call under several processes."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.rows
        shares = [None] * dist.get_world_size()
        dist.all_gather_object(shares, self.rows)
        return [row for share in shares for row in share]

    def write_tables(self, rows: list[tuple]) -> None:
        header = ("source (excerpt)", "reference", "lead", "generated")
        text = io.StringIO()
        csv.writer(text).writerows([header, *rows])
        payload = text.getvalue().encode("utf-8")
        write_atomically(self.artifacts_dir / "summaries.csv", lambda f: f.write(payload))

        def cell(value: str) -> str:
            return " ".join(value.split()).replace("|", "\\|") or " "

        d = self.cfg.decode
        lines = [
            f"# Test summaries: attention {attention_label(self.cfg)}, "
            f"{'greedy' if d.beam == 1 else f'beam {d.beam}'}, the first {min(TABLE_ROWS, len(rows))} "
            f"of {len(rows)} (all in summaries.csv)",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows[:TABLE_ROWS]),
        ]
        payload = ("\n".join(lines) + "\n").encode("utf-8")
        write_atomically(self.artifacts_dir / "summaries.md", lambda f: f.write(payload))


__all__ = ["SummarizationModule"]
