#!/bin/sh
# healthcheck.sh - the images' HEALTHCHECK (installed as /usr/local/bin/kiln-healthcheck): asks
# the daemon this container runs whether it works, with that daemon's own probe, which reads the
# container's KILN_* settings: `kilnd --health` (GET /healthz on KILN_HTTP_ADDR, over TLS when
# KILN_TLS_CERT is set) or `kiln-agent --health` (GET /healthz on KILN_METRICS_ADDR). A
# container running the CLI or a shell has nothing to check.
for d in /proc/[0-9]*; do
    comm=$(cat "$d/comm" 2>/dev/null) || continue
    case "$comm" in
        kilnd) exec /usr/local/bin/kilnd --health ;;
        kiln-agent) exec /usr/local/bin/kiln-agent --health ;;
    esac
done
exit 0
