#!/usr/bin/env bash
# image-flags.sh DOCKERFILE [NAME=VALUE...] - the engine's compiler flags that DOCKERFILE's build
# step gets from the Makefile, found without Docker: the RUN instruction that calls `make`
# (continuation lines joined), its words expanded with the Dockerfile's ARG defaults (NAME=VALUE
# arguments stand for --build-arg), and the variables it passes make given to
# `make print-engine-flags`. Prints `MAKEVARS: ...` (those variables), then the flags.
# It runs nothing of the Dockerfile but the expansions of its make words ($(nproc) included).
# Run from anywhere; tests/deploy compares its output with the Makefile's own flags.
set -euo pipefail
[ -r "${1:-}" ] || { echo "usage: image-flags.sh DOCKERFILE [NAME=VALUE...] (cannot read \"${1:-}\")" >&2; exit 2; }
f=$(realpath "$1")
shift
cd "$(dirname "$0")/.."

# one instruction a line
joined=$(awk '{ if (sub(/\\$/, "")) { buf = buf $0 " "; next } print buf $0; buf = "" }' "$f")

# ARG defaults, in order (an ARG without a default keeps the value an earlier one gave)
while IFS= read -r line; do
  decl=${line#ARG }
  name=${decl%%=*}
  [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "image-flags.sh: odd ARG: $line" >&2; exit 2; }
  if [[ "$decl" == *=* ]]; then eval "$name=${decl#*=}"; else eval ": \"\${$name:=}\""; fi
done < <(grep -E '^ARG ' <<<"$joined")
for a in "$@"; do
  [[ "${a%%=*}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "image-flags.sh: not NAME=VALUE: $a" >&2; exit 2; }
  eval "${a%%=*}=\${a#*=}"
done

# the make command of the RUN instruction that builds: from `make` to the end of its command
runs=$(grep -E '^RUN ' <<<"$joined" | grep -E '(^RUN|&&|;|[[:space:]])[[:space:]]*make[[:space:]]' || true)
[ "$(grep -c . <<<"$runs")" = 1 ] ||
  { echo "image-flags.sh: $f has $(grep -c . <<<"$runs") RUN instructions that call make (want 1)" >&2; exit 2; }
cmd=$(sed -E 's/^RUN //; s/(^|.*(&&|;|[[:space:]]))[[:space:]]*make[[:space:]]/make /; s/[[:space:]]*(&&|;|\|\|).*$//' <<<"$runs")
eval "words=( ${cmd#make } )"
vars=()
for w in "${words[@]}"; do
  [[ "$w" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] && vars+=("$w")
done
echo "MAKEVARS: ${vars[*]}"
make -s --no-print-directory print-engine-flags "${vars[@]}"
