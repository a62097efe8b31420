#!/usr/bin/env bash
# `make dev`: bring the schema up, then run receiver and worker in the
# foreground against the local services. Ctrl-C (or SIGTERM) stops both
# cleanly; if either exits on its own, the other is stopped too.
#
# WORKER=./examples/orders (any main package of a worker built on
# pkg/effects and pkg/service) runs that worker instead of the stock one:
# it is built into $BIN/dev-worker first.
set -euo pipefail
BIN=${BIN:-bin}
worker_bin=$BIN/worker
if [[ -n ${WORKER:-} ]]; then
  echo "dev: building the worker $WORKER"
  CGO_ENABLED=0 go build -trimpath -o "$BIN/dev-worker" "$WORKER"
  worker_bin=$BIN/dev-worker
fi
# A development-only secret, so `eventsctl send` works out of the box.
export WEBHOOK_SECRETS=${WEBHOOK_SECRETS:-whsec_dev_local_only}
export LOG_FORMAT=${LOG_FORMAT:-console}

"$BIN/migrate"

"$BIN/receiver" &
receiver=$!
"$worker_bin" &
worker=$!

stop() { kill -TERM "$receiver" "$worker" 2>/dev/null || true; }
trap stop INT TERM

cat <<MSG

  idempotent-events is running:
    webhooks  POST http://127.0.0.1${HTTP_ADDR:-:8080}/webhooks/payment
    worker    ${WORKER:-the stock worker}
    metrics   http://127.0.0.1:9090/metrics (receiver), http://127.0.0.1:9091/metrics (worker)
  Send a signed test event from another terminal:
    WEBHOOK_SECRETS=$WEBHOOK_SECRETS $BIN/eventsctl send --times 3
  Ctrl-C stops both.

MSG

status=0
wait -n "$receiver" "$worker" || status=$?
stop
wait "$receiver" 2>/dev/null || true
wait "$worker" 2>/dev/null || true
exit "$status"
