"""What a task's model takes from the config: its sites, its sizes and their range rules."""

import pytest
from omegaconf import DictConfig

from lavo_tasks.backbone import ENCODER_DECODER_SIZES, encoder_decoder_args, site_attentions
from lavo_tasks.config import compose, validate
from lavo_tasks.errors import ConfigError
from lavo_tasks.tasks import load_task

ENCODER_DECODERS = ("pcc", "summarization", "tsf", "tts")
# (key, a bad value, the end of its one-line error), for each size key a task has.
BAD_SIZES = [
    ("n_layers", 0, ">= 1"),
    ("encoder_layers", 0, ">= 1"),
    ("decoder_layers", 0, ">= 1"),
    ("d_ff", 0, ">= 1"),
    ("dropout", 1.0, r"in \[0, 1\)"),
]


@pytest.mark.parametrize("task", ["lm", *ENCODER_DECODERS])
def test_every_task_names_a_bad_size_key(task):
    keys = compose([f"task={task}"]).model
    cases = [(key, value, allowed) for key, value, allowed in BAD_SIZES if key in keys]
    assert len(cases) == (3 if task == "lm" else 4)
    for key, value, allowed in cases:
        with pytest.raises(ConfigError, match=rf"^model.{key}={value}: must be {allowed}$"):
            validate(compose([f"task={task}", f"model.{key}={value}"]))


@pytest.mark.parametrize("task", ENCODER_DECODERS)
def test_an_encoder_decoder_gets_its_sizes_and_each_of_its_sites(task):
    cfg = compose([f"task={task}", "attention=gsa", "model.d_ff=48"])
    args = encoder_decoder_args(cfg)
    sites = set(load_task(task).sites)
    assert set(args) == {*ENCODER_DECODER_SIZES, *sites}
    assert args["d_ff"] == 48 and args["d_model"] == cfg.model.d_model
    for site in sites:
        assert isinstance(args[site], DictConfig)
        assert args[site].name == cfg.model[site].name


def test_the_sites_are_the_attention_groups_of_the_model():
    cfg = compose(["task=tsf", "attention=lavo", "model.cross_attention=softmax"])
    sites = site_attentions(cfg)
    assert {site: attention.name for site, attention in sites.items()} == {
        "encoder_attention": "lavo", "decoder_attention": "lavo", "cross_attention": "softmax"}
    assert set(site_attentions(compose(["task=lm"]))) == {"attention"}
