#!/usr/bin/env bash
# The tree's style, checked (CI runs it): C++/CUDA against .clang-format (clang-format 22, the
# version install.sh installs: another version formats differently), Python against ruff.toml.
#   tools/lint.sh          # check; prints what differs and exits 1
#   tools/lint.sh --fix    # apply clang-format and ruff's safe fixes
set -euo pipefail
cd "$(dirname "$0")/.."
format=${CLANG_FORMAT:-clang-format-22}
command -v "$format" >/dev/null || { echo "lint: $format not found (./install.sh installs it)"; exit 2; }
python=${PYTHON:-python3}
mapfile -t cxx < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
status=0
if [[ ${1:-} == --fix ]]; then
  "$format" -i "${cxx[@]}"
  "$python" -m ruff check --fix .
  exit 0
fi
"$format" --dry-run --Werror "${cxx[@]}" || { echo "lint: C++ style differs: tools/lint.sh --fix"; status=1; }
"$python" -m ruff check . || { echo "lint: Python findings above"; status=1; }
[[ $status -eq 0 ]] && echo "lint: ${#cxx[@]} C++ files formatted, Python clean"
exit $status
