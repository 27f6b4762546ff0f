#!/bin/sh
# entrypoint.sh - the container's entry point (installed as /usr/local/bin/kiln-entrypoint; tini
# runs it as PID 1's child). The first argument picks the program: kilnd, kiln-agent, kiln-train
# or kiln; arguments that start with "-" go to kilnd; anything else is run as given (a shell, for
# debugging). Every flag also has a KILN_* environment variable (`kilnd --help`).
set -e

# kiln-agent as root with its sandbox on (deploy/README.md, "Container image"): each box gets a
# child of the agent's cgroup, but container runtimes mount the cgroup tree read-only. Made
# writable here, in this container's mount namespace only; with a cgroup namespace (cgroup v2's
# default) the tree is the container's own cgroup. On v2 every process of the container (tini and
# this one) then moves into its leaf "kiln-agent", where the agent would move itself: a cgroup
# that hands controllers to its children may hold no process. Whatever fails here, the agent's
# own check says what is missing.
agent_cgroup() {
    [ "$(id -u)" = 0 ] && [ "${KILN_SANDBOX:-on}" != off ] || return 0
    awk '$2 ~ /^\/sys\/fs\/cgroup/ && ($3 == "cgroup2" || $3 == "cgroup") && $4 ~ /(^|,)ro(,|$)/ { print $2 }' \
        /proc/self/mounts | while read -r m; do
        mount -o remount,bind,rw "$m" || echo "kiln-entrypoint: could not make $m writable" \
            "(the agent needs CAP_SYS_ADMIN, and no AppArmor or seccomp profile that refuses mount)" >&2
    done
    if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ "$(cat /proc/self/cgroup)" = "0::/" ]; then
        mkdir -p /sys/fs/cgroup/kiln-agent 2>/dev/null || return 0
        for p in $(cat /sys/fs/cgroup/cgroup.procs); do
            echo "$p" > /sys/fs/cgroup/kiln-agent/cgroup.procs 2>/dev/null || :
        done
    fi
}

case "${1:-kilnd}" in
    kilnd|kiln-agent|kiln-train|kiln)
        prog="${1:-kilnd}"
        [ $# -gt 0 ] && shift
        [ "$prog" = kiln-agent ] && agent_cgroup
        exec "/usr/local/bin/$prog" "$@"
        ;;
    -*)
        exec /usr/local/bin/kilnd "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
