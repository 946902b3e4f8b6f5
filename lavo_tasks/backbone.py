"""What a task's model takes from `model.*`: its attention sites, the sizes the tasks'
Transformer backbones share, and the one table of those sizes' range rules.

An attention site is a group `model.<site>` holding a whole attention config (it has a
`name`); a task's model takes each site's config as a keyword argument of the same name.
"""

from omegaconf import DictConfig, OmegaConf

# The sizes every task's backbone shares, each with its check and what is allowed; a
# task's config holds those its model has (lm: n_layers; the encoder-decoders: the
# encoder_ and decoder_layers).
SIZE_RULES = {
    "n_layers": (lambda v: v >= 1, ">= 1"),
    "encoder_layers": (lambda v: v >= 1, ">= 1"),
    "decoder_layers": (lambda v: v >= 1, ">= 1"),
    "d_ff": (lambda v: v >= 1, ">= 1"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
}
ENCODER_DECODER_SIZES = ("d_model", "n_heads", "encoder_layers", "decoder_layers", "d_ff", "dropout")


def size_rules(cfg: DictConfig) -> list[tuple[str, bool, str]]:
    """(key, ok, allowed) of each SIZE_RULES key the config's `model` has, for
    `lavo_tasks.config.check_rules`."""
    return [(f"model.{key}", ok(cfg.model[key]), allowed) for key, (ok, allowed) in SIZE_RULES.items()
            if key in cfg.model]


def site_attentions(cfg: DictConfig) -> dict[str, DictConfig]:
    """{site: its attention config} of every attention site under `model`."""
    return {site: value for site, value in cfg.model.items()
            if isinstance(value, DictConfig) and "name" in value}


def encoder_decoder_args(cfg: DictConfig) -> dict:
    """The keyword arguments every encoder-decoder model of the tasks takes from the
    config: the ENCODER_DECODER_SIZES and each attention site's config."""
    sizes = {key: OmegaConf.select(cfg, f"model.{key}") for key in ENCODER_DECODER_SIZES}
    return {**sizes, **site_attentions(cfg)}
