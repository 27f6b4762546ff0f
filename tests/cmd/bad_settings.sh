#!/usr/bin/env bash
# bad_settings.sh - for every setting PROGRAM declares (PROGRAM --print-settings), a value of the
# wrong type, out of its range or not among its choices, given as the flag and as the environment
# variable, makes PROGRAM exit 2 at once with a message naming the flag or the variable.
# usage: bad_settings.sh BIN_DIR PROGRAM...; prints "checked N value(s) of PROGRAM" per program and
# a line per failure; exits 1 when any failed.
set -uo pipefail
bin=$1
shift
for v in $(compgen -e | grep '^KILN_' || true); do unset "$v"; done
fail=0
bad_values() { # TYPE MIN MAX CHOICES: one bad value a line
    case $1 in
    int) echo abc; echo 1.5 ;;
    number) echo abc; echo nan ;;
    bool) echo maybe ;;
    esac
    if [ "$2" != - ]; then
        awk -v lo="$2" -v hi="$3" 'BEGIN { printf "%.15g\n%.15g\n", lo - 1, hi + 1 }'
    fi
    if [ "$4" != - ]; then echo no-such-choice; fi
}
try() { # PROGRAM WHAT NAME-IN-MESSAGE CMD...: CMD must exit 2 naming NAME-IN-MESSAGE
    local prog=$1 what=$2 name=$3
    shift 3
    local err rc
    err=$(timeout 30 "$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -ne 2 ] || ! grep -qF -- "$name" <<<"$err"; then
        echo "FAIL $prog $what: exit $rc, message: $(head -c 300 <<<"$err")"
        fail=1
    fi
}
for prog in "$@"; do
    table=$("$bin/$prog" --print-settings) || { echo "FAIL $prog --print-settings"; fail=1; continue; }
    n=0
    while IFS=$'\t' read -r name env type lo hi choices def test help; do
        while read -r bad; do
            [ -n "$bad" ] || continue
            try "$prog" "--$name=$bad" "--$name" "$bin/$prog" "--$name=$bad"
            n=$((n + 1))
            if [ "$env" != - ]; then
                try "$prog" "$env=$bad" "$env" env "$env=$bad" "$bin/$prog"
                n=$((n + 1))
            fi
        done < <(bad_values "$type" "$lo" "$hi" "$choices")
    done <<<"$table"
    echo "checked $n value(s) of $prog"
done
exit $fail
