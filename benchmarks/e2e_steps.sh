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
# built once per machine into the default-data cache).
# PCC_BATCH: for pcc, a file that `bench_e2e task=pcc save_batch=FILE` wrote on a machine
# with open3d (the GPU machine has none to read pcc's data); its runs measure on it. An
# eager batch and a compiled one differ (`batch=` refuses the other): write it with no
# compile= for MODES=off, with compile=default for the compiled modes, and run one of the
# two kinds per file.
# lm needs a corpus long enough for the cab context (8,192 tokens a sample, 8 samples in
# its test split), summarization one whose sources fill the cab preset's 4,096 positions
# (the embedded docstrings take about 256): LM_DATA, a folder with train.txt, valid.txt and
# test.txt, and SUM_DATA, a folder of {train,val,test}.jsonl ("document", "summary"; batch
# 4, as #27's protocol), or SUM_DATA=embedded for the task's embedded data at its batch of
# 16. When they are not given, benchmarks/e2e_corpora.py writes both from the Python
# standard library's sources to OUT/lm_corpus and OUT/summarization_corpus.
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
for path in "$OUT" "${LM_DATA:-}" "${TTS_DATA:-}" "${SUM_DATA:-}" "${PCC_BATCH:-}"; do
  if [[ "$path" == *" "* ]]; then
    echo "e2e_steps.sh: '$path': OUT, LM_DATA, TTS_DATA, SUM_DATA and PCC_BATCH must be paths without spaces" >&2
    exit 2
  fi
done
mkdir -p "$OUT/logs"
rows="$OUT/e2e_steps.jsonl"
: > "$rows"

HERE=$(cd "$(dirname "$0")" && pwd)
if [[ " $TASKS " == *" lm "* && -z "${LM_DATA:-}" ]]; then
  LM_DATA="$OUT/lm_corpus"
  $PYTHON "$HERE/e2e_corpora.py" lm "$LM_DATA" || { echo "e2e_steps.sh: could not write the lm corpus to $LM_DATA" >&2; exit 1; }
fi
SUM_DATA=${SUM_DATA:-}
if [[ " $TASKS " == *" summarization "* && -z "$SUM_DATA" ]]; then
  SUM_DATA="$OUT/summarization_corpus"
  $PYTHON "$HERE/e2e_corpora.py" summarization "$SUM_DATA" \
    || { echo "e2e_steps.sh: could not write the summarization corpus to $SUM_DATA" >&2; exit 1; }
fi
if [[ "$SUM_DATA" == embedded ]]; then
  SUM_ARGS=""
else
  SUM_ARGS="data.path=$SUM_DATA data.format=jsonl data.tokenizer=bpe data.vocab_size=32000 data.batch_size=4"
fi

declare -A DATA=([lm]="data.path=${LM_DATA:-} data.tokenizer=bpe data.vocab_size=32000 data.batch_size=4"
                 [summarization]="$SUM_ARGS"
                 [tts]="${TTS_DATA:+data.path=$TTS_DATA}"
                 [pcc]="${PCC_BATCH:+batch=$PCC_BATCH}")
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
