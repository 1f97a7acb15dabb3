#!/usr/bin/env bash
# run.sh — install (scripts/py_setup.sh), build and run the Python tests.
# Exits non-zero on any failure; the last line is the summary
# "N passed, N failed[, N skipped]" followed by pytest's own summary line.
# Extra arguments go to pytest (e.g. -k fsdp, -x).
# BITEXACT_SKIP_INSTALL=1: test the bitexact already importable (e.g. a
# prebuilt one on PYTHONPATH, from `pip install --target DIR .` on a machine
# with nvcc), without scripts/py_setup.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"

if [ "${BITEXACT_SKIP_INSTALL:-0}" = 1 ]; then
  "$PY" -c 'import bitexact; print("run.sh: testing", bitexact.__file__, bitexact.cuda_info())' || {
    echo "0 passed, 1 failed (BITEXACT_SKIP_INSTALL=1 but bitexact is not importable)"
    exit 1
  }
elif ! bash scripts/py_setup.sh; then
  echo "0 passed, 1 failed (scripts/py_setup.sh: install or build failed)"
  exit 1
fi

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# The repository root holds no importable bitexact/ (it is python/bitexact),
# so the tests import the installed package.
"$PY" -m pytest -p no:cacheprovider -q -rs --rootdir tests/python tests/python "$@" \
  2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}

summary="$(grep -E '(passed|failed|skipped|errors?|deselected|no tests ran).* in [0-9.]+s' "$LOG" | tail -n 1 \
           | sed -E 's/^=+ //; s/ =+$//')"
count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
passed=$(count passed); failed=$(count failed); errors=$(count error); skipped=$(count skipped)
failed=$((failed + errors))
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # pytest itself failed
line="$passed passed, $failed failed"
[ "$skipped" -gt 0 ] && line="$line, $skipped skipped"
echo "$line (pytest: ${summary:-no summary})"
exit "$rc"
