"""Configuration: composition order, presets, per-site attention, and every config error.

Each bad input must give a ConfigError whose one-line message names the key or value and
what is allowed; through the CLIs that is `error: <message>` on stderr, exit code 2, no
traceback and nothing written.
"""

import subprocess
import sys

import lightning as L
import pytest
from omegaconf import OmegaConf

import lavo_tasks.config
import lavo_tasks.tasks
from lavo_tasks import train
from lavo_tasks.config import compose, site_attention, validate
from lavo_tasks.errors import ConfigError
from lavo_tasks.module import TaskModule
from lavo_tasks.task import Task

# A task of the encoder-decoder kind, with a preset, defined here so these tests do not
# depend on a real task's sizes.
TOY_YAML = """
data:
  seq_len: 16
model:
  preset: default
  d_model: 32
  n_heads: 4
  n_layers: 2
  encoder_attention: ""
  decoder_attention: ""
  cross_attention: ""
trainer:
  max_steps: 5
presets:
  big:
    model:
      d_model: 64
      n_layers: 6
    data:
      seq_len: 64
"""


def check_toy_config(cfg):
    if cfg.data.seq_len < 4:
        raise ConfigError(f"data.seq_len={cfg.data.seq_len}: must be >= 4")


TOY_SITES = {"encoder_attention": "NS", "decoder_attention": "CS", "cross_attention": "NC"}


@pytest.fixture
def toy_task(register_task):
    # Only the config is exercised here: the data and module classes are never built.
    register_task(Task(name="toy", DataModule=L.LightningDataModule, Module=TaskModule,
                       check_config=check_toy_config, sites=TOY_SITES), TOY_YAML)


def attention_yaml(name):
    """configs/attention/<name>.yaml's group as a plain dict, read here with OmegaConf."""
    path = lavo_tasks.config.resources.files("lavo_tasks.configs") / f"attention/{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(str(path)).attention)


def error_of(args):
    with pytest.raises(ConfigError) as info:
        validate(compose(args))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_layers_in_order(toy_task):
    cfg = compose(["task=toy", "attention=gsa", "attention.slots=5", "optim.lr=0.5", "data.seq_len=12"])
    assert cfg.task == "toy"
    assert cfg.data.seq_len == 12 and cfg.data.batch_size == 16       # CLI over task over train.yaml
    assert cfg.trainer.max_steps == 5 and cfg.trainer.val_check_interval == 50
    for site in TOY_SITES:
        assert OmegaConf.to_container(cfg.model[site]) == {**attention_yaml("gsa"), "slots": 5}
    assert cfg.optim.lr == 0.5
    assert "presets" not in cfg
    validate(cfg)


def test_defaults_select_the_softmax_attention_and_the_task_of_train_yaml():
    cfg = compose([])
    assert cfg.task == OmegaConf.load(lavo_tasks.config.resources.files("lavo_tasks.configs") / "train.yaml").task
    assert OmegaConf.to_container(cfg.model.attention) == attention_yaml("softmax")  # the LM's one site
    assert cfg.model.attention.name == "softmax"
    assert "attention" not in cfg  # every attention config lives at its site


def test_values_take_the_type_of_their_default(toy_task):
    cfg = compose(["task=toy", "optim.lr=1", "optim.weight_decay=1e-4", "trainer.enable_progress_bar=false",
                   "run.dir=2024", "data.path=", "trainer.devices=2"])
    assert cfg.optim.lr == 1 and cfg.optim.weight_decay == 1e-4       # an int is fine for a float key
    assert cfg.trainer.enable_progress_bar is False
    assert cfg.run.dir == "2024" and cfg.data.path == ""               # str keys take the text as is
    assert cfg.trainer.devices == "2"


def test_presets(toy_task):
    cfg = compose(["task=toy", "model.preset=big", "model.n_layers=3"])
    assert cfg.model.preset == "big" and cfg.model.d_model == 64     # from the preset
    assert cfg.model.n_layers == 3                                   # explicit CLI key wins
    assert cfg.model.n_heads == 4                                    # untouched by the preset
    assert cfg.data.seq_len == 64                                    # a preset sets data keys too
    assert compose(["task=toy", "model.preset=big", "data.seq_len=20"]).data.seq_len == 20
    assert "presets" not in cfg
    assert compose(["task=toy", "model.preset=default"]).model.d_model == 32
    assert compose(["task=toy", "model.preset='big'"]).model.d_model == 64
    assert error_of(["task=toy", "model.preset=huge"]) == (
        "model.preset='huge': unknown preset for task toy; allowed: default, big")


def test_a_preset_may_only_set_existing_keys(toy_task, monkeypatch):
    bad = TOY_YAML.replace("      n_layers: 6", "      n_layer: 6")
    monkeypatch.setattr(lavo_tasks.config, "task_yaml", lambda name: OmegaConf.create(bad))
    message = error_of(["task=toy", "model.preset=big"])
    assert message.startswith("unknown key 'model.n_layer' (presets.big.model.n_layer in configs/task/toy.yaml)")


def test_each_site_holds_its_whole_attention_config(toy_task):
    cfg = compose(["task=toy", "model.cross_attention.slots=7", "attention=lavo", "attention.window=4",
                   "model.cross_attention=gsa", "model.decoder_attention.rank=2"])
    # attention= sets every site, model.<site>= one (wherever it stands among the arguments),
    # attention.KEY the sites of attention=, model.<site>.KEY one site.
    lavo = attention_yaml("lavo")
    assert OmegaConf.to_container(cfg.model.encoder_attention) == {**lavo, "window": 4}
    assert OmegaConf.to_container(cfg.model.decoder_attention) == {**lavo, "window": 4, "rank": 2}
    assert OmegaConf.to_container(cfg.model.cross_attention) == {**attention_yaml("gsa"), "slots": 7}
    assert site_attention(cfg, "cross_attention") == cfg.model.cross_attention
    with pytest.raises(ValueError, match=r"model.memory: not an attention site of task toy; its sites: "
                                         r"encoder_attention, decoder_attention, cross_attention"):
        site_attention(cfg, "memory")


def test_the_task_yaml_may_name_a_sites_default(toy_task, monkeypatch):
    named = TOY_YAML.replace('  cross_attention: ""', "  cross_attention: lavo")
    monkeypatch.setattr(lavo_tasks.tasks, "task_yaml_text", lambda name: named)
    cfg = compose(["task=toy"])
    assert cfg.model.cross_attention.name == "lavo" and cfg.model.encoder_attention.name == "softmax"
    assert compose(["task=toy", "attention=gsa"]).model.cross_attention.name == "gsa"  # attention= sets every site
    assert compose(["task=toy", "model.cross_attention="]).model.cross_attention.name == "softmax"


def test_the_task_yaml_may_set_an_attentions_keys(toy_task, monkeypatch):
    """attention_options.NAME.KEY: the task's default of KEY at every site of attention
    NAME; the command line wins; the group is gone from the composed config."""
    options = TOY_YAML + "attention_options:\n  lavo:\n    window: 6\n    rank: 4\n  softmax:\n    alibi: true\n"
    monkeypatch.setattr(lavo_tasks.tasks, "task_yaml_text", lambda name: options)
    cfg = compose(["task=toy", "attention=lavo", "model.cross_attention=softmax"])
    assert OmegaConf.to_container(cfg.model.encoder_attention) == {**attention_yaml("lavo"), "window": 6, "rank": 4}
    assert OmegaConf.to_container(cfg.model.cross_attention) == {"name": "softmax", "alibi": True}
    assert attention_yaml("lavo")["window"] != 6 and attention_yaml("softmax")["alibi"] is False
    assert "attention_options" not in cfg
    assert compose(["task=toy", "attention=lavo", "attention.window=10"]).model.decoder_attention.window == 10
    assert compose(["task=toy", "attention=lavo", "model.encoder_attention.window=8"]).model.encoder_attention.window == 8
    assert compose(["task=toy", "attention.alibi=false"]).model.encoder_attention.alibi is False
    assert compose(["task=toy", "attention=gsa"]).model.encoder_attention == OmegaConf.create(attention_yaml("gsa"))
    validate(cfg)


@pytest.mark.parametrize(("options", "message"), [
    ("attention_options:\n  lava:\n    window: 6\n",
     "attention_options.lava in configs/task/toy.yaml: unknown attention; allowed: softmax, local, lavo, gsa"),
    ("attention_options:\n  lavo:\n    windw: 6\n",
     "attention_options.lavo.windw in configs/task/toy.yaml: not a key of attention 'lavo'; its keys: window, rank, "
     "basis, cross_segments, memory_bias, backend"),
    ("attention_options:\n  softmax:\n    name: lavo\n",
     "attention_options.softmax.name in configs/task/toy.yaml: not a key of attention 'softmax'; its keys: alibi"),
    ("attention_options:\n  lavo: 6\n",
     "attention_options.lavo in configs/task/toy.yaml: must be a group of keys of attention lavo"),
    ("attention_options: 3\n", "attention_options in configs/task/toy.yaml: must be a group of attention names"),
    # A value the attention refuses fails in validate, naming the site's key.
    ("attention_options:\n  softmax:\n    alibi: 2\n", "model.encoder_attention.alibi=2: must be true or false"),
])
def test_bad_attention_options_in_the_task_yaml(toy_task, monkeypatch, options, message):
    monkeypatch.setattr(lavo_tasks.tasks, "task_yaml_text", lambda name: TOY_YAML + options)
    assert error_of(["task=toy"]) == message


def test_a_later_argument_wins_at_a_site(toy_task):
    cfg = compose(["task=toy", "attention=lavo", "model.encoder_attention.window=6", "attention.window=10"])
    assert cfg.model.encoder_attention.window == 10 and cfg.model.decoder_attention.window == 10
    cfg = compose(["task=toy", "attention=lavo", "attention.window=10", "model.encoder_attention.window=6"])
    assert cfg.model.encoder_attention.window == 6 and cfg.model.decoder_attention.window == 10


def test_a_task_declares_its_sites_with_patterns():
    with pytest.raises(ValueError, match=r"site 'cross' has pattern 'XX'; allowed: CS, NS, CC, NC"):
        Task(name="bad", DataModule=L.LightningDataModule, Module=TaskModule, check_config=print,
             sites={"cross": "XX"})
    with pytest.raises(ValueError, match="at least one attention site"):
        Task(name="bad", DataModule=L.LightningDataModule, Module=TaskModule, check_config=print, sites={})
    task = Task(name="ok", DataModule=L.LightningDataModule, Module=TaskModule, check_config=print,
                sites={"attention": "CS"})
    with pytest.raises(TypeError):
        task.sites["other"] = "NS"  # frozen, its sites too
    assert lavo_tasks.tasks.load_task("tsf").sites == TOY_SITES
    assert lavo_tasks.tasks.load_task("lm").sites == {"attention": "CS"}


CONFIG_ERRORS = [
    (["task=nope"], "task='nope': unknown task; allowed: "),
    (["task=toy", "attention=flash"], "attention='flash': unknown attention; allowed: softmax, local, lavo, gsa"),
    (["task=toy", "trainer.max_step=5"], "unknown key 'trainer.max_step' (did you mean trainer.max_steps?)"),
    (["task=toy", "model.d_modle=8"], "unknown key 'model.d_modle' (did you mean model.d_model?)"),
    (["task=toy", "attention.window=8"], "unknown key 'attention.window'; keys of attention: name"),
    (["task=toy", "zzz.top=1"], "unknown key 'zzz.top'; keys of the root: "),
    (["task=toy", "trainer.max_steps=ten"], "trainer.max_steps='ten': expected an integer (default 5)"),
    (["task=toy", "trainer.max_steps=2.5"], "trainer.max_steps='2.5': expected an integer (default 5)"),
    (["task=toy", "optim.lr=fast"], "optim.lr='fast': expected a number (default 0.001)"),
    (["task=toy", "trainer.enable_progress_bar=maybe"], "trainer.enable_progress_bar='maybe': expected true or false"),
    (["task=toy", "model=3"], "model='3': model is a group of keys; set one of them, e.g. model.preset=..."),
    (["task=toy", "attention.name=gsa"], "attention.name='gsa': choose the attention with attention=NAME"),
    (["task=toy", "trainer.max_steps"], "argument 'trainer.max_steps': expected key=value"),
    (["task=toy", "attention=local", "attention.window=0"], "model.encoder_attention.window=0: must be an integer >= 1"),
    (["task=toy", "attention=lavo", "attention.rank=9"], "model.encoder_attention.rank=9"),  # head dim 32 / 4 = 8
    (["task=toy", "model.cross_attention=lavo", "model.cross_attention.window=0"],
     "model.cross_attention.window=0: must be an integer >= 1"),
    (["task=toy", "attention=lavo", "model.encoder_attention.window=5"],
     "model.encoder_attention.window=5: must be even for noncausal self-attention (NS)"),
    (["task=toy", "model.cross_attention=local"],
     "model.cross_attention=local: attention 'local' does not support noncausal cross-attention (NC), which this "
     "site needs; it supports: CS (causal self-attention), NS (noncausal self-attention); "
     "set model.cross_attention to another attention"),
    (["task=toy", "model.cross_attention.windw=3", "model.cross_attention=lavo"],
     "unknown key 'model.cross_attention.windw': model.cross_attention is attention lavo; its keys: window, rank, "
     "basis, cross_segments, memory_bias, backend"),
    (["task=toy", "model.cross_attention.window=3"],
     "unknown key 'model.cross_attention.window': model.cross_attention is attention softmax; its keys: alibi"),
    (["task=toy", "model.memory.window=3"],
     "unknown attention site 'model.memory' of task toy; its sites: model.encoder_attention, "
     "model.decoder_attention, model.cross_attention"),
    (["task=toy", "model.cross_attenton.window=3"], "unknown attention site 'model.cross_attenton' of task toy "
                                                   "(did you mean model.cross_attention?); its sites: "),
    (["task=toy", "model.cross_attention.name=gsa"],
     "model.cross_attention.name='gsa': choose a site's attention with model.cross_attention=NAME"),
    (["task=toy", "attention=lavo", "model.encoder_attention=gsa", "model.decoder_attention=gsa",
      "model.cross_attention=gsa", "attention.window=8"],
     "attention.window='8': no site uses attention=lavo (model.encoder_attention=gsa, model.decoder_attention=gsa, "
     "model.cross_attention=gsa); set model.<site>.window=... instead"),
    (["task=toy", "model.cross_attention=lavo", "model.cross_attention.window=ten"],
     "model.cross_attention.window='ten': expected an integer (default 32)"),
    (["task=toy", "data.path=/no/such/corpus"], "data.path='/no/such/corpus': no such file or folder"),
    (["task=toy", "trainer.max_steps=0"], "trainer.max_steps=0: must be >= 1"),
    (["task=toy", "optim.lr=0"], "optim.lr=0: must be > 0"),
    (["task=toy", "optim.min_lr_ratio=1.5"], "optim.min_lr_ratio=1.5: must be in [0, 1]"),
    (["task=toy", "data.seq_len=2"], "data.seq_len=2: must be >= 4"),                # the task's own check
    (["task=toy", "model.cross_attention=flash"], "model.cross_attention='flash': unknown attention"),
    (["task=toy", "model.n_heads=5"], "model.n_heads=5: must be >= 1 and divide model.d_model=32"),
]


@pytest.mark.parametrize(("args", "message"), CONFIG_ERRORS, ids=[" ".join(a[1:]) or a[0] for a, _ in CONFIG_ERRORS])
def test_config_errors(toy_task, args, message):
    assert error_of(args).startswith(message)


def test_cli_prints_one_line_and_builds_nothing(toy_task, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert train.main(["task=toy", f"run.dir={run_dir}", "attention=local", "attention.window=0"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: model.encoder_attention.window=0") and captured.err.count("\n") == 1
    assert captured.out == "" and not run_dir.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["trainer.max_step=5"], "error: unknown key 'trainer.max_step' (did you mean trainer.max_steps?)\n"),
    (["task=nope"], "error: task='nope': unknown task; allowed: "),
])
def test_cli_subprocess(tmp_path, args, message):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.train", f"run.dir={run_dir}", *args],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and not run_dir.exists()


def test_a_configuration_error_reaches_the_command_line_before_lightning(tmp_path):
    """The command line checks the configuration before it imports Lightning (a slow
    import): a bad key's one line comes without it."""
    code = "import sys\nfrom lavo_tasks import train\nprint(train.main(['task=nope']), 'lightning' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert result.stderr.startswith("error: task='nope'")


def test_help_lists_tasks_attentions_and_keys():
    result = subprocess.run([sys.executable, "-m", "lavo_tasks.train", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0
    for name in [*lavo_tasks.tasks.task_names(), "softmax", "local", "lavo", "gsa", "attention.slots",
                 "trainer.max_steps=", "run.resume=", "data.path="]:
        assert name in result.stdout, name


def test_a_relative_data_path_is_saved_absolute(toy_task, tmp_path, monkeypatch):
    (tmp_path / "corpus").mkdir()
    monkeypatch.chdir(tmp_path)
    cfg = compose(["task=toy", "data.path=corpus"])
    assert cfg.data.path == str(tmp_path / "corpus")


@pytest.mark.parametrize("task,model_keys,data_keys", [
    ("lm", {"d_model": 768, "n_layers": 12, "n_heads": 12}, {"seq_len": 8192}),
    ("tsf", {"d_model": 512, "n_heads": 8, "encoder_layers": 2, "decoder_layers": 1}, {}),
])
def test_the_cab_presets_give_cabs_sizes(task, model_keys, data_keys):
    cfg = compose([f"task={task}", "model.preset=cab", "attention=lavo", "attention.rank=64"])
    validate(cfg)
    assert {key: cfg.model[key] for key in model_keys} == model_keys
    assert {key: cfg.data[key] for key in data_keys} == data_keys


def test_the_pcc_cab_preset_sets_pointrs_lr_and_an_override_still_wins():
    assert compose(["task=pcc"]).optim.lr == 0.002
    cab = compose(["task=pcc", "model.preset=cab"])
    assert (cab.optim.lr, cab.model.d_model, cab.model.n_queries, cab.data.n_gt) == (0.0005, 384, 224, 16384)
    assert compose(["task=pcc", "model.preset=cab", "optim.lr=0.001"]).optim.lr == 0.001
