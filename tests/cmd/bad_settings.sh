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
    int) echo 1.5 ;;
    number) echo nan ;; # strtod takes it; the parser must not
    bool) echo maybe ;;
    esac
    if [ "$2" != - ]; then
        awk -v lo="$2" -v hi="$3" 'BEGIN { printf "%.15g\n%.15g\n", lo - 1, hi + 1 }'
    fi
    if [ "$4" != - ]; then echo no-such-choice; fi
}
fails=$(mktemp -d)
trap 'rm -rf "$fails"' EXIT
try() { # PROGRAM WHAT NAME-IN-MESSAGE CMD...: CMD must exit 2 naming NAME-IN-MESSAGE (in the background)
    local prog=$1 what=$2 name=$3
    shift 3
    {
        err=$(timeout 30 "$@" 2>&1 >/dev/null)
        rc=$?
        if [ $rc -ne 2 ] || ! grep -qF -- "$name" <<<"$err"; then
            echo "FAIL $prog $what: exit $rc, message: $(head -c 300 <<<"$err")" > "$fails/$BASHPID"
        fi
    } &
    # a few at a time
    while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
}
for prog in "$@"; do
    table=$("$bin/$prog" --print-settings) || { echo "FAIL $prog --print-settings"; fail=1; continue; }
    n=0
    while IFS=$'\t' read -r name env type lo hi choices def test help; do
        first=$(bad_values "$type" "$lo" "$hi" "$choices" | head -1)
        while read -r bad; do
            [ -n "$bad" ] || continue
            try "$prog" "--$name=$bad" "--$name" "$bin/$prog" "--$name=$bad"
            n=$((n + 1))
            # the variable goes through the same check as the flag: its first bad value shows it is read
            if [ "$env" != - ] && [ "$bad" = "$first" ]; then
                try "$prog" "$env=$bad" "$env" env "$env=$bad" "$bin/$prog"
                n=$((n + 1))
            fi
        done < <(bad_values "$type" "$lo" "$hi" "$choices")
    done <<<"$table"
    wait
    echo "checked $n value(s) of $prog"
done
if compgen -G "$fails/*" >/dev/null; then
    cat "$fails"/*
    fail=1
fi
exit $fail
