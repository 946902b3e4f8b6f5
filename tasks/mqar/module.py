"""The MQAR task's LightningModule: cross-entropy and accuracy on the queried positions.

Test metrics: `test_acc` (teacher forcing: the whole sequence at once), `test_decode_acc`
(the same sequences fed token by token through the decode states; equal to test_acc up
to float ties, or the decode states disagree with the full forward), `test_loss`, and
`test_state_size`, the numbers one layer of the attention under test keeps per sequence
(tasks/mqar/state.py), the x axis of the report's recall-against-state plot.
"""

import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from lavo_tasks.config import site_attention
from lavo_tasks.metrics import Mean, SumRatio
from lavo_tasks.module import TaskModule

from .data import IGNORE
from .model import RecallModel
from .state import state_size


def recall_site(cfg: DictConfig) -> tuple[str, int]:
    """(pattern, length) of the attention under test: CS over the sequence (self), or CC /
    NC over the 2N-token source (cross)."""
    if cfg.data.variant == "cross":
        return ("CC" if cfg.model.cross_causal else "NC"), 2 * cfg.data.num_kv_pairs
    return "CS", cfg.data.seq_len


class MQARModule(TaskModule):
    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: MQARDataModule.spec(), {"vocab_size"}."""
        super().__init__(cfg)
        self.attention = site_attention(cfg, "attention")
        self.model = RecallModel(spec["vocab_size"], cfg.data.num_kv_pairs, cfg.data.variant, cfg.model, self.attention)
        self.val_loss, self.val_acc = Mean(), SumRatio()
        self.test_loss, self.test_acc, self.test_decode_acc = Mean(), SumRatio(), SumRatio()

    @staticmethod
    def scored(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, T, V], targets [B, T] -> (NLL [Q], hit [Q]) of the Q queried positions."""
        asked = targets != IGNORE
        picked = logits[asked].float()  # [Q, V]
        answer = targets[asked]
        return F.cross_entropy(picked, answer, reduction="none"), picked.argmax(-1) == answer

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        # the mean NLL of the queried positions, as `scored` gives it, without selecting
        # them by a mask (which waits for the GPU)
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()

    def validation_step(self, batch, batch_idx: int) -> None:
        inputs, targets = batch
        nll, hit = self.scored(self.model(inputs), targets)
        self.val_loss.update(nll)
        self.val_acc.update(hit, hit.numel())

    def on_validation_epoch_end(self) -> None:
        self.log_dict({"val_loss": self.val_loss.compute(), "val_acc": self.val_acc.compute()}, prog_bar=True)

    def on_test_epoch_start(self) -> None:
        for metric in (self.test_loss, self.test_acc, self.test_decode_acc):
            metric.reset()

    def test_step(self, batch, batch_idx: int) -> None:
        inputs, targets = batch
        nll, hit = self.scored(self.model(inputs), targets)
        self.test_loss.update(nll)
        self.test_acc.update(hit, hit.numel())
        decode_hit = self.scored(self.model.decode(inputs), targets)[1]
        self.test_decode_acc.update(decode_hit, decode_hit.numel())

    def on_test_epoch_end(self) -> None:
        pattern, length = recall_site(self.cfg)
        size = state_size(self.attention, pattern, self.cfg.model.d_model, self.cfg.model.n_heads, length)
        self.log_dict({"test_acc": self.test_acc.compute(), "test_decode_acc": self.test_decode_acc.compute(),
                       "test_loss": self.test_loss.compute(), "test_state_size": float(size)})
