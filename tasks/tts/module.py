"""Training and evaluation of Transformer-TTS.

Loss (teacher forcing): L1 + L2 between the target frames and the frames before the
postnet, the same after it, over the real frames; plus BCE on the stop logit of every
real step (the last step of an utterance is the positive, weighted 5); with
`model.guided_attention` > 0, that weight times the guided-attention loss on the softmax
cross-attention weights (alignment.py).

Test: `test_loss` as in training; then each utterance is synthesised autoregressively
(`lavo_tasks.generation.generate_frames` over the model's decode state; the encoder runs
once) until the stop probability reaches `decode.stop_threshold` or `decode.max_frames`.
Synthesised and reference mels both go through the same Griffin-Lim vocoder, and
`test_mcd` / `test_msd` are fairseq's eval_sp distortions between the two (metrics.py),
per reference frame.
The baseline is the mean training frame repeated for the reference's length, vocoded the
same way (`test_baseline_mcd`, `test_baseline_msd`). `test_length_ratio` is the mean of
synthesised / reference frames. Artifacts: the first test utterances' wavs (synthesised
and vocoded reference), their mels, stop probabilities and, for a softmax
cross-attention, its weights; each picture titled with the attention and the test figures.

The test metrics are torchmetrics sums, added up over the processes, so a test on
several devices scores the whole split; the artifacts come from the first process's
utterances. The mel prenet's inference dropout draws, for each test batch, from the
random state seeded with `seed` + the batch's first test index (as does the dropout of
`test_loss`'s teacher-forced pass), so the test does not depend on how many processes
run it or on what ran before.
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure  # not pyplot: no global backend state is touched
from omegaconf import DictConfig

from ...attention.softmax import SoftmaxAttention
from ...backbone import encoder_decoder_args
from ...generation import generate_frames
from ...metrics import Mean, SumRatio
from ...module import TaskModule
from ...plots import attention_label, format_metrics, save_figure, set_suptitle
from .alignment import guided_attention_loss, recorded_cross_weights
from .audio import GriffinLim, MelConfig, write_wav
from .metrics import CorpusDistortion
from .model import TransformerTTS

STOP_POSITIVE_WEIGHT = 5.0
ARTIFACT_UTTERANCES = 3


class TTSModule(TaskModule):
    def __init__(self, cfg: DictConfig, spec: dict):
        """spec: TTSDataModule.spec() (vocabulary, mel settings, mel mean / std, frames
        per symbol)."""
        super().__init__(cfg)
        m = cfg.model
        rate = m.text_position_rate
        if rate == "auto":  # the training data's decoder steps per text symbol
            rate = spec["frames_per_symbol"] / m.n_frames_per_step
        self.mel_config = MelConfig(**spec["mel"])
        self.model = TransformerTTS(
            len(spec["vocabulary"]), self.mel_config.n_mels, **encoder_decoder_args(cfg),
            conv_channels=m.conv_channels, prenet_dim=m.prenet_dim, n_frames_per_step=m.n_frames_per_step,
            cross_causal=m.cross_causal, text_position_rate=float(rate),
        )
        # Saved with the checkpoint: the run's normalisation of the mels.
        self.register_buffer("mel_mean", torch.tensor(spec["mel_mean"]))
        self.register_buffer("mel_std", torch.tensor(spec["mel_std"]))
        self.vocoder = GriffinLim(self.mel_config)
        rate = self.mel_config.sample_rate
        self.distortion, self.baseline_distortion = CorpusDistortion(rate), CorpusDistortion(rate)
        self.length_ratio = Mean()
        self.test_loss = SumRatio()  # batch losses weighted by their utterances, as Lightning averages a logged value

    # --- teacher forcing

    def _whole_steps(self, mels: torch.Tensor, mel_lengths: torch.Tensor):
        """mels [B, T, n_mels] padded with zeros to N * r frames, the real steps [B] and
        the real-frame mask [B, N * r]."""
        r = self.model.r
        n_steps = -(-mels.shape[1] // r)
        mels = F.pad(mels, (0, 0, 0, n_steps * r - mels.shape[1]))
        frame_mask = torch.arange(n_steps * r, device=mels.device) < mel_lengths[:, None]
        return mels, -(-mel_lengths // r), frame_mask

    def losses(self, batch: dict) -> dict[str, torch.Tensor]:
        mels, step_lengths, frame_mask = self._whole_steps(batch["mels"], batch["mel_lengths"])
        guided = self.cfg.model.guided_attention
        with recorded_cross_weights(self.model.decoder) if guided else nullcontext() as cross_weights:
            before, after, stop = self.model(batch["tokens"], batch["token_lengths"], mels, step_lengths)
        real = frame_mask[..., None].float()  # [B, N * r, 1]
        count = real.sum() * mels.shape[-1]
        mel_loss = sum(((F.l1_loss(pred.float(), mels, reduction="none") + F.mse_loss(pred.float(), mels, reduction="none"))
                        * real).sum() / count for pred in (before, after))
        steps = torch.arange(stop.shape[1], device=stop.device)
        step_mask = steps < step_lengths[:, None]
        stop_target = (steps == step_lengths[:, None] - 1).float()
        # The mean over real steps, weighted as pos_weight would (STOP_POSITIVE_WEIGHT on the
        # last step, 1 elsewhere: the same for a 0/1 target), without selecting by the mask
        # or building a tensor from a number: both wait for the GPU.
        weight = step_mask * (1 + (STOP_POSITIVE_WEIGHT - 1) * stop_target)
        stop_loss = F.binary_cross_entropy_with_logits(stop.float(), stop_target, weight, reduction="sum") / step_mask.sum()
        losses = {"loss": mel_loss + stop_loss, "mel_loss": mel_loss, "stop_loss": stop_loss}
        if guided:
            losses["attention_loss"] = guided_attention_loss(cross_weights, step_lengths, batch["token_lengths"])
            losses["loss"] = losses["loss"] + guided * losses["attention_loss"]
        return losses

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        losses = self.losses(batch)
        self.log("train_loss", losses["loss"], prog_bar=True, batch_size=len(batch["tokens"]))
        return losses["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        losses = self.losses(batch)
        size = len(batch["tokens"])
        self.log("val_loss", losses["loss"], prog_bar=True, batch_size=size)
        self.log("val_mel_loss", losses["mel_loss"], batch_size=size)
        self.log("val_stop_loss", losses["stop_loss"], batch_size=size)
        if "attention_loss" in losses:
            self.log("val_attention_loss", losses["attention_loss"], batch_size=size)

    # --- synthesis

    @torch.no_grad()
    def synthesise(self, tokens: torch.Tensor, token_lengths: torch.Tensor):
        """(mels [B, N * r, n_mels] after the postnet, normalised; frame lengths [B];
        stop probabilities [B, N])."""
        r = self.model.r
        state = self.model.init_state(tokens, token_lengths)
        start = tokens.new_zeros(len(tokens), 1, self.model.n_mels, dtype=self.mel_mean.dtype)
        out = generate_frames(self.model.step, state, start, max_steps=-(-self.cfg.decode.max_frames // r),
                              stop_threshold=self.cfg.decode.stop_threshold, feedback=self.model.last_frame,
                              cuda_graph=self.cfg.decode.cuda_graph)
        frames = out.frames.reshape(len(tokens), -1, self.model.n_mels)  # [B, N, r * n_mels] -> [B, N * r, n_mels]
        lengths = out.lengths * r
        mask = torch.arange(frames.shape[1], device=frames.device) < lengths[:, None]
        return self.model.refine(frames, mask), lengths, out.stop_probs

    def to_log_mel(self, normalised: torch.Tensor) -> torch.Tensor:
        return normalised.float() * self.mel_std + self.mel_mean

    def on_test_epoch_start(self) -> None:
        for metric in (self.distortion, self.baseline_distortion, self.length_ratio, self.test_loss):
            metric.reset()
        self.examples: list[dict] = []

    def test_step(self, batch: dict, batch_idx: int) -> None:
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.cfg.seed + int(batch["index"][0]))  # the prenet's dropout: see the docstring
            self.test_loss.update(self.losses(batch)["loss"].detach() * len(batch["tokens"]), len(batch["tokens"]))
            mels, lengths, stop_probs = self.synthesise(batch["tokens"], batch["token_lengths"])
        for i, (ref_len, syn_len) in enumerate(zip(batch["mel_lengths"].tolist(), lengths.tolist())):
            reference = self.to_log_mel(batch["mels"][i, :ref_len])
            synthesised = self.to_log_mel(mels[i, :syn_len])
            ref_audio, syn_audio = self.vocoder(reference), self.vocoder(synthesised)
            baseline_audio = self.vocoder(self.mel_mean.expand(ref_len, -1))
            self.distortion.update(ref_audio, syn_audio)
            self.baseline_distortion.update(ref_audio, baseline_audio)
            self.length_ratio.update(torch.tensor(syn_len / ref_len))
            if len(self.examples) < ARTIFACT_UTTERANCES:
                self.examples.append({
                    "index": int(batch["index"][i]), "reference": reference.cpu(), "synthesised": synthesised.cpu(),
                    "reference_audio": ref_audio.cpu(), "synthesised_audio": syn_audio.cpu(),
                    "stop_probs": stop_probs[i, :-(-syn_len // self.model.r)].float().cpu(),
                    "tokens": batch["tokens"][i, :batch["token_lengths"][i]].cpu(),
                    "mel": batch["mels"][i, :ref_len].cpu(),
                })

    def on_test_epoch_end(self) -> None:
        figures = {f"test_{k}": v for k, v in self.distortion.compute().items()}
        figures |= {f"test_baseline_{k}": v for k, v in self.baseline_distortion.compute().items()}
        figures["test_length_ratio"] = float(self.length_ratio.compute())
        figures["test_loss"] = float(self.test_loss.compute())
        for name, value in figures.items():
            self.log(name, value)
        if self.trainer.is_global_zero:
            self.write_artifacts(figures)

    # --- artifacts

    def picture_title(self, figures: dict[str, float]) -> str:
        """The title every picture of the test carries: the attention and the test figures."""
        return (f"tts, attention {attention_label(self.cfg)}\n"
                f"{format_metrics(figures, ('test_mcd', 'test_msd', 'test_length_ratio'))}\n"
                f"baseline: {format_metrics(figures, ('test_baseline_mcd', 'test_baseline_msd'))}")

    def write_artifacts(self, figures: dict[str, float]) -> None:
        """The first test utterances' wavs, and their pictures titled with `figures` (the test metrics)."""
        folder = self.artifacts_dir / "wavs"
        folder.mkdir(exist_ok=True)
        rate = self.mel_config.sample_rate
        for n, ex in enumerate(self.examples):
            write_wav(folder / f"test{ex['index']:03d}_synthesised.wav", ex["synthesised_audio"], rate)
            write_wav(folder / f"test{ex['index']:03d}_reference_vocoded.wav", ex["reference_audio"], rate)
        title = self.picture_title(figures)
        self.plot_mels(title)
        self.plot_stop(title)
        self.plot_cross_attention(title)

    def plot_mels(self, title: str) -> None:
        fig = Figure(figsize=(10, 0.7 + 2.6 * len(self.examples)))
        set_suptitle(fig, title)
        axes = fig.subplots(len(self.examples), 2, squeeze=False)
        for row, ex in zip(axes, self.examples):
            for ax, key in zip(row, ("reference", "synthesised")):
                ax.imshow(ex[key].T.numpy(), origin="lower", aspect="auto", interpolation="none")
                ax.set_title(f"test {ex['index']}: {key} ({len(ex[key])} frames)", fontsize=9)
                ax.set_ylabel("mel band")
        for ax in axes[-1]:
            ax.set_xlabel("frame")
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "mels.png", dpi=90)

    def plot_stop(self, title: str) -> None:
        fig = Figure(figsize=(7, 3.8))
        set_suptitle(fig, title)
        ax = fig.subplots()
        for ex in self.examples:
            ax.plot(ex["stop_probs"].numpy(), label=f"test {ex['index']}")
        ax.axhline(self.cfg.decode.stop_threshold, color="0.5", linestyle="--", label="threshold")
        ax.set_xlabel("decoder step")
        ax.set_ylabel("stop probability")
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "stop.png", dpi=90)

    @torch.no_grad()
    def plot_cross_attention(self, title: str) -> None:
        """The last decoder layer's cross-attention weights (mean over heads) under
        teacher forcing, when that block is `softmax` (the other blocks never form the
        weights)."""
        if not isinstance(self.model.decoder.layers[-1].cross_attn, SoftmaxAttention):
            return
        fig = Figure(figsize=(max(5 * len(self.examples), 8), 4.4))
        set_suptitle(fig, title)
        axes = fig.subplots(1, len(self.examples), squeeze=False)[0]
        for ax, ex in zip(axes, self.examples):
            tokens, mel = ex["tokens"][None].to(self.device), ex["mel"][None].to(self.device)
            mels, steps, _ = self._whole_steps(mel, torch.tensor([len(ex["mel"])], device=self.device))
            with recorded_cross_weights(self.model.decoder) as weights:
                self.model(tokens, torch.tensor([tokens.shape[1]], device=self.device), mels, steps)
            ax.imshow(weights[-1].mean(1)[0].T.cpu().numpy(), origin="lower", aspect="auto", interpolation="none")
            ax.set_title(f"test {ex['index']}: cross-attention, last layer", fontsize=9)
            ax.set_xlabel("decoder step")
            ax.set_ylabel("text position")
        fig.tight_layout()
        save_figure(fig, self.artifacts_dir / "cross_attention.png", dpi=90)
