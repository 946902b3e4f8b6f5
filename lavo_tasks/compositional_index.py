"""CAB's compositional index (CI) per attention pattern, from the mean test metrics of runs.

Per pattern P and attention A: for each task T with a site of pattern P, and each of the
task's CI metrics m, z = sign(m) * (x - mu) / sigma, where x is A's metric (mean over
seeds) with A at T's sites of pattern P, sign +1 where higher is better and -1 where lower
is better; z is averaged over T's metrics, then over the tasks. mu and sigma are CAB's
published ones (below) when every run of the pattern's tasks is CAB's configuration
(model.preset=cab and real data, see `cab_dataset`), else the mean and the population
standard deviation over the attentions in the report (labelled as such).

What this cannot do: CAB replaces only the sites of one pattern and keeps softmax at the
others; a run here counts for every pattern its sites use, so `attention=lavo` at every
site of tsf counts for NS, CS and NC alike (a run with softmax at its other sites follows
CAB exactly). Whether data.path holds CAB's dataset is judged from the path alone. CAB's
NS numbers for TTS cover FastSpeech 2 and Transformer-TTS; the tts task here is
Transformer-TTS, so only those two enter. An attention missing at a task (e.g. `local`,
which has no cross pattern) averages over the tasks it has; the tables say how many.
"""

import math
from collections.abc import Mapping
from pathlib import Path

# Higher (+1) or lower (-1) is better, for the metrics CAB scores per task (CAB's
# metric_weight). Other metrics of a task do not enter the index.
CI_METRICS = {
    "tts": {"test_mcd": -1, "test_msd": -1},
    "summarization": {"test_rouge1": 1, "test_rouge2": 1, "test_rougeL": 1},
    "lm": {"test_ppl": -1},
    "pcc": {"test_cd_l1": -1, "test_cd_l2": -1, "test_fscore": 1},
    "tsf": {"test_mse": -1, "test_mae": -1},
}

# (pattern, CAB dataset, metric) -> (mu, sigma), facts from CAB's
# scripts/compositional_index/compositional_index.py (github.com/Shark-NLP/CAB, commit
# b52b0641), its `mu` / `sigma` lists with the column meanings of its scripts/README.md.
# Units as CAB's: ROUGE x 100, CD x 1000 (as tasks/summarization and tasks/pcc report them).
CAB_STATS = {
    ("NS", "tts", "test_mcd"): (4.06947, 0.09422),  # Transformer-TTS
    ("NS", "tts", "test_msd"): (2.19021, 0.03866),
    ("NS", "summarization", "test_rouge1"): (34.88667, 1.39697),
    ("NS", "summarization", "test_rouge2"): (6.79333, 1.41078),
    ("NS", "summarization", "test_rougeL"): (31.96889, 1.31499),
    ("CS", "tts", "test_mcd"): (4.08325, 0.04529),
    ("CS", "tts", "test_msd"): (2.20085, 0.01372),
    ("CS", "summarization", "test_rouge1"): (32.95750, 1.92754),
    ("CS", "summarization", "test_rouge2"): (6.09250, 0.41007),
    ("CS", "summarization", "test_rougeL"): (30.25750, 1.61951),
    ("CS", "lm", "test_ppl"): (22.26000, 8.29944),
    ("NC", "pcc", "test_cd_l1"): (7.70250, 0.64789),
    ("NC", "pcc", "test_cd_l2"): (0.24775, 0.03366),
    ("NC", "pcc", "test_fscore"): (0.76250, 0.03906),
    ("NC", "tsf:ETT", "test_mse"): (1.18933, 0.05615),
    ("NC", "tsf:ETT", "test_mae"): (0.80625, 0.02193),
    ("NC", "tsf:ECL", "test_mse"): (0.47575, 0.01057),
    ("NC", "tsf:ECL", "test_mae"): (0.51100, 0.00601),
    ("NC", "tsf:Weather", "test_mse"): (0.62025, 0.18948),
    ("NC", "tsf:Weather", "test_mae"): (0.58075, 0.10312),
    ("CC", "tts", "test_mcd"): (5.50370, 1.29239),
    ("CC", "tts", "test_msd"): (2.62780, 0.42726),
    ("CC", "summarization", "test_rouge1"): (31.35000, 3.77103),
    ("CC", "summarization", "test_rouge2"): (5.26000, 1.26028),
    ("CC", "summarization", "test_rougeL"): (28.80000, 3.28638),
}
_TSF_DATASETS = {"ETT": "ETT", "ECL": "ECL", "ELECTRICITY": "ECL", "WTH": "Weather", "WEATHER": "Weather"}


def cab_dataset(task: str, preset: str | None, data_path: str) -> str | None:
    """The key of CAB's numbers for a run (`tts`, `tsf:ETT`, ...), or None when the run
    is not CAB's configuration: the cab preset on real data (for tsf, a file whose name
    starts with ETT, ECL / electricity, WTH / weather)."""
    if preset != "cab" or not data_path:
        return None
    if task != "tsf":
        return task
    stem = Path(data_path).stem.upper()
    return next((f"tsf:{name}" for prefix, name in _TSF_DATASETS.items() if stem.startswith(prefix)), None)


def compositional_index(results: Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]],
                        cab_keys: Mapping[str, str | None]) -> tuple[dict, dict, list[str]]:
    """`results[pattern][task][attention]` = {metric: mean over seeds}; `cab_keys[task]`:
    `cab_dataset` of the task's runs (None unless all are CAB's). Returns
    (index[pattern][attention] = (CI, n tasks), source[pattern], notes): source is "CAB"
    or "report"; the notes say which tasks or metrics were left out and why."""
    index, source, notes = {}, {}, []
    for pattern, by_task in results.items():
        use_cab = all(cab_keys.get(task) for task in by_task)
        source[pattern] = "CAB" if use_cab else "report"
        scores: dict[str, list[float]] = {}
        for task, by_attention in by_task.items():
            signs = CI_METRICS.get(task)
            if not signs:
                notes.append(f"{pattern}: task {task} has no CI metrics (CAB scores no such task)")
                continue
            task_scores = _task_scores(pattern, task, by_attention, signs, cab_keys.get(task) if use_cab else None,
                                       notes)
            for attention, score in task_scores.items():
                scores.setdefault(attention, []).append(score)
        index[pattern] = {a: (sum(s) / len(s), len(s)) for a, s in scores.items()}
    return index, source, notes


def _task_scores(pattern, task, by_attention, signs, cab_key, notes) -> dict[str, float]:
    """{attention: mean signed z over the task's metrics} for one pattern and task."""
    metrics = [m for m in signs if all(m in values for values in by_attention.values())]
    if not metrics:
        notes.append(f"{pattern}: task {task} left out: its runs lack {', '.join(signs)}")
        return {}
    stats = {}
    for metric in metrics:
        if cab_key is not None:
            if (pattern, cab_key, metric) not in CAB_STATS:
                notes.append(f"{pattern}: {task} {metric} left out: CAB publishes no mu/sigma for it here")
                continue
            stats[metric] = CAB_STATS[(pattern, cab_key, metric)]
            continue
        values = [v[metric] for v in by_attention.values()]
        mu = sum(values) / len(values)
        sigma = math.sqrt(sum((v - mu) ** 2 for v in values) / len(values))
        if len(values) < 2 or sigma == 0:
            notes.append(f"{pattern}: {task} {metric} left out: its attentions' spread is 0 (n={len(values)})")
            continue
        stats[metric] = (mu, sigma)
    if not stats:
        return {}
    return {attention: sum(signs[m] * (values[m] - mu) / sigma for m, (mu, sigma) in stats.items()) / len(stats)
            for attention, values in by_attention.items()}
