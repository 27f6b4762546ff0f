#!/bin/sh
# entrypoint.sh - the container's entry point (installed as /usr/local/bin/kiln-entrypoint; tini
# runs it as PID 1's child). The first argument picks the program: kilnd, kiln-agent, kiln-train
# or kiln; arguments that start with "-" go to kilnd; anything else is run as given (a shell, for
# debugging). Every flag also has a KILN_* environment variable (`kilnd --help`).
set -e
case "${1:-kilnd}" in
    kilnd|kiln-agent|kiln-train|kiln)
        prog="${1:-kilnd}"
        [ $# -gt 0 ] && shift
        exec "/usr/local/bin/$prog" "$@"
        ;;
    -*)
        exec /usr/local/bin/kilnd "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
