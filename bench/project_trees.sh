#!/bin/bash
# The project layer's cost on whole trees: `ampfix check --no-cache --select ALL -j 2` of timm,
# accelerate and peft (their sdists in bench/.cache/, see bench_check.py --sdists) with the
# project layer (NEW), each file alone (NEW with AMPFIX_NO_PROJECT=1), optionally an older
# checkout (OLD), and a bare LibCST parse of the tree (BARE_PYTHON bench/bare_parse.py), back to
# back, ROUNDS times. One line per run: round, tree, what, seconds, load.
#
#   NEW=.venv/bin/ampfix OLD=../before/.venv/bin/ampfix bench/project_trees.sh
#
# EXTRA adds options to every ampfix run (EXTRA=--preview: the preview rules too, the same work
# on both sides when OLD and NEW differ in which rules are preview).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
C=$HERE/.cache
NEW=${NEW:-ampfix}; OLD=${OLD:-}; ROUNDS=${ROUNDS:-3}; EXTRA=${EXTRA:-}; BARE_PYTHON=${BARE_PYTHON:-python}
declare -A TREES=([timm]=$C/sdist-timm-1.0.31/timm-1.0.31 [accelerate]=$C/sdist-accelerate-1.15.0/accelerate-1.15.0
                  [peft]=$C/sdist-peft-0.21.2/peft-0.21.2)
load() { cut -d' ' -f1 /proc/loadavg; }
# Each checkout's bytecode brought up to date first, as an installed ampfix has it (pip compiles
# at install): with PYTHONDONTWRITEBYTECODE set, an edited module's stale .pyc is never
# rewritten, and every run (and every worker of its pool) compiles that module again.
for exe in "$NEW" $OLD; do
  py=$(cd "$(dirname "$(command -v "$exe")")" && pwd)/python
  # (from / : in a checkout, `python -c` would import that checkout's ampfix, not the venv's)
  src=$(cd / && "$py" -c 'import ampfix, os; print(os.path.dirname(os.path.dirname(ampfix.__file__)))')
  "$py" -m compileall -q "$src/ampfix" "$src/rules" > /dev/null
done
for rep in $(seq "$ROUNDS"); do
  for t in timm accelerate peft; do
    T=${TREES[$t]}
    for v in old new alone; do
      case $v in
        old) [ -n "$OLD" ] || continue; cmd=("$OLD"); env=();;
        new) cmd=("$NEW"); env=();;
        alone) cmd=("$NEW"); env=(AMPFIX_NO_PROJECT=1);;
      esac
      s=$(date +%s.%N)
      env "${env[@]}" "${cmd[@]}" check --no-cache --select ALL $EXTRA -j 2 -q "$T" > /dev/null 2>&1
      e=$(date +%s.%N)
      echo "$rep $t $v $(echo "$e - $s" | bc) load=$(load)"
    done
    echo "$rep $t bare $("$BARE_PYTHON" "$HERE/bare_parse.py" "$T") load=$(load)"
  done
done
