#!/bin/sh
# Runs a benchmark command in its own session (its own scheduler autogroup) with that group's and
# its processes' priority raised, so that other tenants' builds sharing these 2 cores take little
# CPU from the server and the rig during the run. Server and rig get the same priority (the server
# is started by the rig with --server-cmd). Needs root for the negative nice values.
# Usage: docs/bench/prio.sh herald-bench broadcast -n 10000 ...
exec setsid -w sh -c 'echo -10 > /proc/self/autogroup 2>/dev/null; exec nice -n -10 "$@"' sh "$@"
