#!/usr/bin/env bash
# `make dev`: bring the schema up, then run receiver and worker in the
# foreground against the local services. Ctrl-C (or SIGTERM) stops both
# cleanly; if either exits on its own, the other is stopped too.
#
# The banner is printed once both answer 200 on /readyz, never for a process
# that is already dying: if either exits while starting (a port taken, a bad
# variable, a service it cannot reach), the other is stopped and the script
# exits non-zero with the last lines of the one that died. An address that
# something else already listens on is refused before either starts: its
# /readyz (a `make dev` left running, say) would answer for them.
#
# Their logs go to $BIN/dev-logs/{receiver,worker}.log, so that those last
# lines can be shown, and are followed here once both are up (without
# colour, since they are written to a file).
#
# WORKER=./examples/orders (any main package of a worker built on
# pkg/effects and pkg/service) runs that worker instead of the stock one:
# it is built into $BIN/dev-worker first.
set -euo pipefail
BIN=${BIN:-bin}
worker_bin=$BIN/worker
# How long both may take to be ready before the banner is printed anyway,
# with what they answer: a worker waits for RabbitMQ and PostgreSQL.
start_timeout=${DEV_START_TIMEOUT:-60}
command -v curl >/dev/null || { echo "dev: curl is needed to see when the receiver and worker are ready" >&2; exit 1; }
if [[ -n ${WORKER:-} ]]; then
  echo "dev: building the worker $WORKER"
  CGO_ENABLED=0 go build -trimpath -o "$BIN/dev-worker" "$WORKER"
  worker_bin=$BIN/dev-worker
fi
# A development-only secret, so `eventsctl send` works out of the box.
export WEBHOOK_SECRETS=${WEBHOOK_SECRETS:-whsec_dev_local_only}
export LOG_FORMAT=${LOG_FORMAT:-console}

# hostport prints where to reach a listen address from here: ":8080" and
# "0.0.0.0:8080" are 127.0.0.1:8080.
hostport() {
  local host=${1%:*} port=${1##*:}
  case $host in "" | 0.0.0.0 | "[::]") host=127.0.0.1 ;; esac
  echo "$host:$port"
}
webhooks=$(hostport "${HTTP_ADDR:-:8080}")
receiver_metrics=$(hostport "${METRICS_ADDR:-:9090}")
worker_metrics=$(hostport "${METRICS_ADDR:-:9091}")

in_use() { # host:port variable what
  if (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; then
    echo "dev: something already listens on $1 ($2, $3): stop it (a make dev still running?) or set $2" >&2
    exit 1
  fi
}
in_use "$webhooks" HTTP_ADDR "the receiver's webhooks"
in_use "$receiver_metrics" METRICS_ADDR "the receiver's metrics"
in_use "$worker_metrics" METRICS_ADDR "the worker's metrics"

"$BIN/migrate"

logs=$BIN/dev-logs
mkdir -p "$logs"
: >"$logs/receiver.log"
: >"$logs/worker.log"
"$BIN/receiver" >>"$logs/receiver.log" 2>&1 &
receiver=$!
"$worker_bin" >>"$logs/worker.log" 2>&1 &
worker=$!
follower=

stopping=
stop() { stopping=1; kill -TERM "$receiver" "$worker" 2>/dev/null || true; }
trap stop INT TERM

# finish waits for both, lets the log follower show their last lines, and
# exits with status $1.
finish() {
  wait "$receiver" 2>/dev/null || true
  wait "$worker" 2>/dev/null || true
  if [[ -n $follower ]]; then
    sleep 0.3
    kill "$follower" 2>/dev/null || true
    wait "$follower" 2>/dev/null || true
  fi
  exit "$1"
}

# died name pid: one exited while starting. Its log has not been shown yet.
died() {
  local status=0
  wait "$2" || status=$?
  kill -TERM "$receiver" "$worker" 2>/dev/null || true
  echo "dev: the $1 exited with status $status while starting; its last lines ($logs/$1.log):" >&2
  tail -n 20 "$logs/$1.log" >&2
  finish $((status == 0 ? 1 : status))
}

# ready name host:port: whether it answers 200 on /readyz; the answer is kept
# in $logs/name.readyz for the message when it does not.
ready() {
  [[ $(curl -s -o "$logs/$1.readyz" -w '%{http_code}' --max-time 2 "http://$2/readyz" || true) == 200 ]]
}

not_ready() {
  echo "dev: the $1 runs but is not ready after ${start_timeout}s; its /readyz: $(cat "$logs/$1.readyz" 2>/dev/null || echo "no answer")" >&2
}

echo "dev: starting the receiver and the worker (logs in $logs/)"
receiver_ready=
worker_ready=
deadline=$((SECONDS + start_timeout))
while [[ -z $receiver_ready || -z $worker_ready ]]; do
  [[ -z $stopping ]] || finish 130
  kill -0 "$receiver" 2>/dev/null || died receiver "$receiver"
  kill -0 "$worker" 2>/dev/null || died worker "$worker"
  if [[ -z $receiver_ready ]] && ready receiver "$webhooks"; then receiver_ready=1; fi
  if [[ -z $worker_ready ]] && ready worker "$worker_metrics"; then worker_ready=1; fi
  if ((SECONDS >= deadline)); then
    [[ -n $receiver_ready ]] || not_ready receiver
    [[ -n $worker_ready ]] || not_ready worker
    break
  fi
  sleep 0.2
done
rm -f "$logs/receiver.readyz" "$logs/worker.readyz"

cat <<MSG

  idempotent-events is running:
    webhooks  POST http://$webhooks/webhooks/payment
    worker    ${WORKER:-the stock worker}
    metrics   http://$receiver_metrics/metrics (receiver), http://$worker_metrics/metrics (worker)
    logs      $logs/receiver.log, $logs/worker.log (followed below)
  Send a signed test event from another terminal:
    WEBHOOK_SECRETS=$WEBHOOK_SECRETS $BIN/eventsctl send --times 3
  Ctrl-C stops both.

MSG

# A background job of a script ignores SIGINT, so Ctrl-C leaves the
# follower to show the shutdown lines; finish stops it.
tail -q -n +1 -f "$logs/receiver.log" "$logs/worker.log" &
follower=$!

status=0
wait -n "$receiver" "$worker" || status=$?
stop
finish "$status"
