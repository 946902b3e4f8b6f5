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
