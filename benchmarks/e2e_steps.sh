#!/usr/bin/env bash
# The rows of docs/benchmarks.md's "Wall and GPU time of one step": bench_e2e for each
# task, compile mode and attention, one process each (a run that hits its time limit
# loses its own row only), the rows of this invocation in one file, OUT/e2e_steps.jsonl.
#
#   OUT=e2e_steps TASKS="summarization tsf tts lm" MODES="reduce-overhead off" \
#     ATTENTIONS="softmax lavo gsa" STEPS=20 LIMIT=150 bash benchmarks/e2e_steps.sh [KEY=VALUE ...]
#
# LIMIT: seconds a run may take (compiling one task's model takes 40-100 s on an H200).
# COMMIT: the code measured (bench_e2e's commit=; default: the checkout's short hash).
# TTS_DATA: a folder in the LJSpeech layout for tts (default: the embedded espeak set,
# built once per machine into the default-data cache). lm needs a corpus long enough for
# the cab context (8,192 tokens a sample, 8 samples in its test split): LM_DATA, a folder
# with train.txt, valid.txt and test.txt; when it is not given, the Python standard
# library's own sources are written to OUT/lm_corpus (every 20th file to valid and to test,
# about 10 MB of the rest to train).
# Extra KEY=VALUE arguments go to every run. Each run's log is OUT/logs/<task>-<mode>-<attention>.log;
# the runs of a task share OUT/work/<task> (its default data, caches and tokenizer, built once).
set -uo pipefail
OUT=${OUT:-e2e_steps}
TASKS=${TASKS:-summarization tsf tts}
MODES=${MODES:-reduce-overhead off}
ATTENTIONS=${ATTENTIONS:-softmax lavo gsa}
STEPS=${STEPS:-20}
LIMIT=${LIMIT:-150}
PYTHON=${PYTHON:-python}
COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
for path in "$OUT" "${LM_DATA:-}" "${TTS_DATA:-}"; do
  if [[ "$path" == *" "* ]]; then
    echo "e2e_steps.sh: '$path': OUT, LM_DATA and TTS_DATA must be paths without spaces" >&2
    exit 2
  fi
done
mkdir -p "$OUT/logs"
rows="$OUT/e2e_steps.jsonl"
: > "$rows"

if [[ " $TASKS " == *" lm "* && -z "${LM_DATA:-}" ]]; then
  LM_DATA="$OUT/lm_corpus"
  if $PYTHON - "$LM_DATA" <<'PY'
import sys, sysconfig
from pathlib import Path
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
files = sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).rglob("*.py") if "site-packages" not in p.parts)
texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
splits = {"valid.txt": texts[0::20], "test.txt": texts[1::20]}
train, size = [], 0
for text in (t for i, t in enumerate(texts) if i % 20 > 1):  # ~10 MB: the BPE trains on it in seconds
    if size > 10e6:
        break
    train.append(text)
    size += len(text)
splits["train.txt"] = train
for name, docs in splits.items():
    (out / name).write_text("\n\n".join(docs), encoding="utf-8")
    print(f"{out / name}: {sum(map(len, docs)) / 1e6:.1f} MB")
PY
  then :; else echo "e2e_steps.sh: could not write the lm corpus to $LM_DATA" >&2; exit 1; fi
fi

declare -A DATA=([lm]="data.path=${LM_DATA:-} data.tokenizer=bpe data.vocab_size=32000 data.batch_size=4"
                 [tts]="${TTS_DATA:+data.path=$TTS_DATA}")
status=0
for task in $TASKS; do
  for mode in $MODES; do
    for attention in $ATTENTIONS; do
      name="$task-$mode-$attention"
      rm -f "$OUT/runs/$name/bench_e2e_$task.jsonl"  # a row of an earlier invocation is not this one's
      # shellcheck disable=SC2086  # DATA holds whole KEY=VALUE words
      timeout -k 10 "$LIMIT" $PYTHON -m lavo_tasks.bench_e2e "task=$task" "attentions=$attention" "compile=$mode" \
        "steps=$STEPS" "commit=$COMMIT" "out=$OUT/runs/$name" "run.dir=$OUT/work/$task" ${DATA[$task]:-} "$@" \
        > "$OUT/logs/$name.log" 2>&1
      code=$?
      if [[ -f "$OUT/runs/$name/bench_e2e_$task.jsonl" ]]; then
        cat "$OUT/runs/$name/bench_e2e_$task.jsonl" >> "$rows"
      fi
      echo "$name: exit $code"
      [[ $code == 0 ]] || status=1
    done
  done
done
exit $status
