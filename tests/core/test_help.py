"""--help's key meanings: whole YAML comments, and the attention sites' patterns of the
configuration it describes."""

from lavo_tasks import train
from lavo_tasks.keydoc import parse_key_comments

YAML = """\
# a file comment
data:
  path: ""      # first line of the meaning;
                # its second line
  size: 4       # one line
  # a comment about the next key, at the keys' own indent
  rate: auto
model:
  width: 8      # the width
    # continues it (deeper than the key)

  depth: 2
"""


def test_comments_continue_on_deeper_comment_lines():
    assert parse_key_comments(YAML) == {
        "data.path": "first line of the meaning;\nits second line",
        "data.size": "one line",
        "model.width": "the width\ncontinues it (deeper than the key)",
    }


def lines_of(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_help_shows_multi_line_comments_whole():
    lines = lines_of(train.usage(["task=tts"]))
    start = lines.index(["model.text_position_rate=auto", *"text position p is encoded as decoder step rate * p; "
                         "auto: the training data's".split()])
    assert lines[start + 1] == "decoder steps per symbol (Deep Voice 3's position rate); 1: plain positions".split()
    start = lines.index(["trainer.early_stopping_patience=0", *"stop after this many validations in a row without a "
                         "lower val_loss (0: never);".split()])
    assert lines[start + 1] == "the test always scores best.ckpt, the weights of the lowest val_loss".split()
    path = next(n for n, line in enumerate(lines) if line[:1] == ["data.path=''"])
    assert lines[path + 1][-3:] == "the default-data cache".split()


def test_help_names_the_cross_pattern_of_the_defaults():
    summarization = lines_of(train.usage(["task=summarization"]))
    assert ["model.cross_attention:", "NC", "(noncausal", "cross-attention);", "model.cross_causal=true:", "CC",
            "(causal", "cross-attention)"] in summarization
    tts = lines_of(train.usage(["task=tts"]))
    assert ["model.cross_attention:", "CC", "(causal", "cross-attention);", "model.cross_causal=false:", "NC",
            "(noncausal", "cross-attention)"] in tts
