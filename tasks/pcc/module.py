"""Training and evaluation of the completion model.

Loss: PoinTr's, CD-l1 of the coarse points plus CD-l1 of the dense points, each against
the complete cloud. Validation logs `val_loss`, `val_cd_l1` (dense, x 1000) and `val_fscore`. Test
logs `test_cd_l1`, `test_cd_l2`, `test_fscore` of the dense prediction and the same per
category (`test_cd_l1_<category>`, ...), and beside them the figures of the model-free
baseline that outputs the partial input itself (`test_partial_cd_l1`, ...), on the same
test clouds. Artifacts: `completions.png` (partial / predicted / true clouds of the first
test model of each category, up to PICTURED of them, titled with the attention and the
test figures, matplotlib 3-D scatter: open3d's offscreen renderer needs an EGL or
X display, which a bare machine lacks) and those predictions as `predictions/*.pcd`.

Test metrics are torchmetrics Metrics (metrics.CompletionScores): with several devices
each process scores its share of the test set and the figures are those of the whole.
The pictures are of the test models that process 0 sees.
"""

import re

import numpy as np
import torch
from matplotlib.figure import Figure  # not pyplot: no global backend state is touched
from omegaconf import DictConfig

from ...backbone import encoder_decoder_args
from ...module import TaskModule
from ...plots import attention_label, format_metrics, save_figure, set_suptitle
from .pcn import write_pcd
from .geometry import chamfer_l1_loss
from .metrics import METRICS, CompletionScores, completion_metrics
from .model import PoinTr

PICTURED = 8  # categories pictured, one test model each
PICTURE_POINTS = 2048  # drawn per cloud (a random subset of larger ones)


class CompletionModule(TaskModule):
    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: PCNDataModule.spec() (the categories' names and synsets, in index order)."""
        super().__init__(cfg)
        self.category_names = [re.sub(r"\W+", "_", name) for name in spec["categories"]]
        m = cfg.model
        self.model = PoinTr(**encoder_decoder_args(cfg), n_proxies=m.n_proxies, n_neighbors=m.n_neighbors,
                            n_queries=m.n_queries, fold_points=m.fold_points)
        self.model_scores = CompletionScores(self.category_names)
        self.partial_scores = CompletionScores(self.category_names)

    def loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(PoinTr's loss, the dense output [B, n_queries x fold_points + n_input, 3])."""
        coarse, dense = self.model(batch["partial"])
        truth = batch["complete"]
        return chamfer_l1_loss(coarse.float(), truth) + chamfer_l1_loss(dense.float(), truth), dense.float()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True, batch_size=len(batch["partial"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, dense = self.loss(batch)
        size = len(batch["partial"])
        self.log("val_loss", loss, prog_bar=True, batch_size=size)
        scores = completion_metrics(dense, batch["complete"])
        self.log("val_cd_l1", scores["cd_l1"].mean(), batch_size=size)
        self.log("val_fscore", scores["fscore"].mean(), batch_size=size)

    def on_test_epoch_start(self) -> None:
        self.model_scores.reset()
        self.partial_scores.reset()
        self.pictured: list[dict] = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        _, dense = self.model(batch["partial"])
        dense = dense.float()
        self.model_scores.update(dense, batch["complete"], batch["category"])
        self.partial_scores.update(batch["partial"], batch["complete"], batch["category"])
        for i in range(len(dense)):
            name = self.category_names[int(batch["category"][i])]
            if len(self.pictured) >= PICTURED or any(item["category"] == name for item in self.pictured):
                continue
            self.pictured.append({"category": name, "partial": batch["partial"][i].cpu().numpy(),
                                  "predicted": dense[i].cpu().numpy(), "true": batch["complete"][i].cpu().numpy(),
                                  "name": f"{name}_{int(batch['index'][i])}"})

    def on_test_epoch_end(self) -> None:
        figures = {f"test_{k}": v for k, v in self.model_scores.compute().items()}
        figures |= {f"test_partial_{k}": v for k, v in self.partial_scores.compute().items()}
        for name, value in figures.items():
            self.log(name, value.float(), rank_zero_only=True)  # already the figures of every process
        if not self.trainer.is_global_zero:
            return
        folder = self.artifacts_dir / "predictions"
        for item in self.pictured:
            write_pcd(folder / f"{item['name']}.pcd", item["predicted"])
        self.draw_completions({name: float(value) for name, value in figures.items()})

    def draw_completions(self, figures: dict[str, float]) -> None:
        """One row per pictured test model: partial, predicted and true clouds, seen from
        the same direction, on the same axes; titled with the attention and the test
        figures of the model and of the partial input (`figures`: the test metrics), each
        row with its category's."""
        fig = Figure(figsize=(10.5, 0.6 + 3.4 * len(self.pictured)))
        headline = [f"test_{name}" for name in METRICS]
        set_suptitle(fig, f"pcc, attention {attention_label(self.cfg)}\nmodel: {format_metrics(figures, headline)}\n"
                          f"partial input: {format_metrics(figures, [f'test_partial_{name}' for name in METRICS])}")
        rng = np.random.default_rng(0)
        for row, item in enumerate(self.pictured):
            limit = np.abs(item["true"]).max() * 1.05
            for col, kind in enumerate(("partial", "predicted", "true")):
                points = item[kind]
                if len(points) > PICTURE_POINTS:
                    points = points[rng.choice(len(points), PICTURE_POINTS, replace=False)]
                ax = fig.add_subplot(len(self.pictured), 3, 3 * row + col + 1, projection="3d")
                ax.scatter(points[:, 0], points[:, 1], points[:, 2], s=1.5, c=points[:, 2], cmap="viridis",
                           depthshade=False)
                ax.set(xlim=(-limit, limit), ylim=(-limit, limit), zlim=(-limit, limit))
                ax.set_box_aspect((1, 1, 1))
                ax.view_init(elev=25, azim=45)
                ax.set_axis_off()
                title = f"{item['name']}: {kind} ({len(item[kind])} points)"
                if kind in ("partial", "predicted"):  # the category's test figure of this cloud's kind
                    prefix = "test_partial_" if kind == "partial" else "test_"
                    title += "\n" + format_metrics(figures, [f"{prefix}cd_l1_{item['category']}"])
                ax.set_title(title, fontsize=8)
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "completions.png")
