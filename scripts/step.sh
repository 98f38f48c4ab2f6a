# Sourced by scripts/test.sh and clients/js/scripts/test.sh: the one way a CI step runs, so that no
# step can hang CI.
#   step NAME LIMIT_S COMMAND...
# prints "== NAME" and runs COMMAND under `timeout` (and "== NAME: N s, exit S" when it ends); past LIMIT_S × HERALD_STEP_TIMEOUT_SCALE
# (default 1) seconds it is stopped (TERM, KILL 30 s later) with "== TIMEOUT: step 'NAME' ...".
# `timeout` signals its whole process group, so what the step started (test binaries, herald
# nodes, Redis, Chromium) stops with it. It runs in the background with a trap so that Ctrl-C
# still stops it (timeout's own process group is not the terminal's; timeout gives the command
# back the default SIGINT a background job lacks). Returns COMMAND's exit status.
step() {
  local name=$1 limit=$(($2 * ${HERALD_STEP_TIMEOUT_SCALE:-1})) status=0 pid started=$SECONDS
  shift 2
  echo "== $name"
  timeout --kill-after=30 "$limit" "$@" &
  pid=$!
  trap 'kill -TERM "$pid" 2>/dev/null' INT TERM
  wait "$pid" || status=$?
  trap - INT TERM
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "== TIMEOUT: step '$name' ran past ${limit}s and was stopped" >&2
  fi
  # Each step's time, so that a slow CI run says where the time went.
  echo "== $name: $((SECONDS - started)) s, exit $status"
  return "$status"
}
