"""lavo_tasks.bench_decode's bad input: one line naming the argument, exit code 2, before
any work (its measurements need a GPU and run through the device tool)."""

import pytest

from lavo_tasks import bench_decode


@pytest.mark.parametrize(("args", "message"), [
    (["task=pcc"], "task=pcc: bench_decode takes task=lm|summarization|tts"),
    (["task=lm", "attentions=softmax,flash"], "attentions='softmax,flash': choose from"),
    (["task=lm", "modes=eager,fast"], "modes='eager,fast': choose from eager, graph"),
    (["task=lm", "contexts=4k"], "contexts='4k': whole numbers >= 1"),
    (["task=lm", "beams=4"], "beams='4': only summarization decodes with beam search here"),
    (["task=summarization", "tokens=0"], "tokens='0': whole numbers >= 1"),
])
def test_bad_arguments(args, message, capsys):
    assert bench_decode.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_state_bytes_counts_each_storage_once():
    """A view, an expanded tensor and a second reference share their storage: counted
    once; plain values count nothing."""
    import torch

    cache = torch.zeros(2, 3, 4)  # 96 bytes of fp32
    basis = torch.zeros(5, dtype=torch.float64)[None].expand(7, -1)  # 40 bytes, 7 rows of views
    state = ({"k": cache, "view": cache[:, 1]}, [basis, cache], 3, None)
    assert bench_decode.state_bytes(state) == 96 + 40
