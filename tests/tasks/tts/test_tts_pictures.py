"""mels.png and stop.png carry the attention and the test figures (drawn from made-up
mels, no training)."""

from types import SimpleNamespace

import torch

import lavo_tasks.tasks.tts.module as tts_module
from lavo_tasks.config import compose
from lavo_tasks.tasks.tts.module import TTSModule


def test_pictures_are_titled_with_the_attention_and_the_test_figures(tmp_path, monkeypatch):
    suptitles = {}
    real_save = tts_module.save_figure

    def record(fig, path, *args, **kwargs):
        suptitles[path.name] = (fig._suptitle.get_text(), fig.get_figwidth())
        return real_save(fig, path, *args, **kwargs)

    monkeypatch.setattr(tts_module, "save_figure", record)
    cfg = compose(["task=tts", "attention=lavo", "model.cross_attention=softmax"])
    examples = [{"index": 3, "reference": torch.rand(20, 80), "synthesised": torch.rand(30, 80),
                 "stop_probs": torch.rand(8)}]
    module = SimpleNamespace(cfg=cfg, artifacts_dir=tmp_path, examples=examples)
    figures = {"test_mcd": 6.5, "test_msd": 2.9, "test_length_ratio": 1.5, "test_loss": 0.8,
               "test_baseline_mcd": 7.46, "test_baseline_msd": 3.24}
    title = TTSModule.picture_title(module, figures)
    assert title == ("tts, attention encoder lavo(window=32, rank=16, basis=learned, cross_segments=1, memory_bias=0.0), "
                     "decoder lavo(window=32, rank=16, basis=learned, cross_segments=1, memory_bias=0.0), "
                     "cross softmax(alibi=False)\ntest_mcd 6.5, test_msd 2.9, test_length_ratio 1.5\n"
                     "baseline: test_baseline_mcd 7.46, test_baseline_msd 3.24")
    TTSModule.plot_mels(module, title)
    TTSModule.plot_stop(module, title)
    assert set(suptitles) == {"mels.png", "stop.png"}
    for text, inches in suptitles.values():  # the title, wrapped at spaces to the figure's width
        assert text.replace("\n", " ") == title.replace("\n", " ")
        assert max(map(len, text.split("\n"))) <= inches * 72 / (9 * 0.6) < len(title.split("\n")[0])
