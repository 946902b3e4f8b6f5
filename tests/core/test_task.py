"""Task.site_patterns: each site's pattern follows the configuration, and the config check
asks the attention for that pattern."""

import pytest

from lavo_tasks import tasks
from lavo_tasks.config import compose, validate
from lavo_tasks.errors import ConfigError


@pytest.mark.parametrize("name", tasks.task_names())
def test_sites_are_the_patterns_of_the_defaults(name):
    task = tasks.load_task(name)
    assert task.site_patterns(compose([f"task={name}"])) == dict(task.sites)


@pytest.mark.parametrize(("name", "args", "cross"), [
    ("summarization", [], "NC"),
    ("summarization", ["model.cross_causal=true"], "CC"),
    ("summarization", ["model.preset=cab"], "CC"),
    ("tts", [], "CC"),
    ("tts", ["model.cross_causal=false"], "NC"),
    ("tsf", [], "NC"),
])
def test_the_cross_pattern_follows_the_config(name, args, cross):
    patterns = tasks.load_task(name).site_patterns(compose([f"task={name}", *args]))
    assert patterns == {"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": cross}


@pytest.mark.parametrize(("args", "needed"), [([], "noncausal cross-attention (NC)"),
                                              (["model.cross_causal=true"], "causal cross-attention (CC)")])
def test_the_config_check_asks_for_the_pattern_the_run_has(args, needed):
    with pytest.raises(ConfigError) as info:
        validate(compose(["task=summarization", "model.cross_attention=local", *args]))
    assert f"does not support {needed}, which this site needs" in str(info.value)
