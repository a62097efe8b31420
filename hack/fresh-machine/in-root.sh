#!/usr/bin/env bash
# in-root.sh: what a developer does on a fresh Debian machine after
# `git clone`, run by test.sh inside the fresh root (network and PID
# namespaces of its own, no network): `make dev`, then the README's first
# example from another terminal, then `make services-down`, `make services`
# and `make services-down` again. Fails, naming the step, at the first thing
# that does not go as the README says.
set -euo pipefail
cd /root/idempotent-events
LOGS=/root/fresh-machine-logs
mkdir -p "$LOGS"
log() { printf '%s fresh-machine (in the root): %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# The receiver's, worker's and servers' logs beside ours, for test.sh to show.
keep_logs() {
  local f
  for f in bin/dev-logs/*.log /var/lib/idempotent-events/services/apt.log /var/lib/idempotent-events/services/*/log/*.log; do
    if [[ -f $f ]]; then cp "$f" "$LOGS/$(echo "${f#/var/lib/idempotent-events/services/}" | tr / -)"; fi
  done
}
trap keep_logs EXIT

for p in 5432 6379 5672 15672; do
  listening "$p" && die "something listens on 127.0.0.1:$p before make dev: the root is not fresh"
done
for c in psql redis-server rabbitmq-server pg_ctl; do
  command -v "$c" >/dev/null && die "$c is installed before make dev: the root is not fresh"
done

# make dev, in a process group of its own so that it can be stopped as Ctrl-C
# would.
t=$SECONDS
setsid make dev >"$LOGS/make-dev.log" 2>&1 &
dev=$!
ready=
for ((i = 0; i < 15 * 60 * 5; i++)); do
  if grep -q 'idempotent-events is running' "$LOGS/make-dev.log"; then ready=1; break; fi
  kill -0 "$dev" 2>/dev/null || break
  sleep 0.2
done
[[ -n $ready ]] || die "make dev did not print its banner (it exited, or 15 minutes passed): $LOGS/make-dev.log"
log "make dev is up after $((SECONDS - t))s; what hack/services.sh said:"
grep '^services:' "$LOGS/make-dev.log" >&2
for s in PostgreSQL Redis RabbitMQ; do
  grep -q "^services: $s: .*apt-get" "$LOGS/make-dev.log" || die "hack/services.sh did not say it installed $s with apt-get"
done
# The tools `make test` uses beside the tests reach them as on a machine
# whose services came with it: a plain rabbitmqctl (the chaos run's broker
# restart), psql and redis-cli.
rabbitmqctl -q list_vhosts >"$LOGS/rabbitmqctl.log" 2>&1 || die "rabbitmqctl does not reach the RabbitMQ node: $(cat "$LOGS/rabbitmqctl.log")"
psql -h 127.0.0.1 -U postgres -Atc 'SELECT 1' idempotent_events >/dev/null || die "psql -h 127.0.0.1 -U postgres"
[[ $(redis-cli -h 127.0.0.1 ping) == PONG ]] || die "redis-cli ping"

# The README's first example, run as written: the commands of the first sh
# block after "Send an event", each checked against the answer the README
# shows under it.
mapfile -t cmds < <(awk '/^### Send an event/ {s = 1} s && /^```sh/ {b = 1; next} b && /^```/ {exit} b && !/^#/ && NF' README.md)
((${#cmds[@]} == 3)) || die "the README's first example should be three commands (send, verify, send again); found ${#cmds[@]}: ${cmds[*]}"
run() { bash -c "$1" 2>&1 | tee -a "$LOGS/example.log"; }

out=$(run "${cmds[0]}") || die "${cmds[0]}: $out"
[[ $(head -1 <<<"$out") == 202\ * ]] || die "the first send did not answer 202: $out"
# The worker commits asynchronously; the README's verify comes a moment after.
for ((i = 0; i < 150; i++)); do
  out=$(run "${cmds[1]}") && [[ $out == ok:* ]] && break
  sleep 0.2
done
[[ $out == ok:* ]] || die "eventsctl verify did not say ok within 30s: $out"
out=$(run "${cmds[2]}") || die "${cmds[2]}: $out"
[[ $out == 200\ * && $out == *duplicate* ]] || die "the second send did not answer 200 duplicate: $out"
log "the README's example: 202, verify ok, then 200 duplicate"

kill -INT -- "-$dev" 2>/dev/null || true
for ((i = 0; i < 150; i++)); do kill -0 "$dev" 2>/dev/null || break; sleep 0.2; done
kill -0 "$dev" 2>/dev/null && die "make dev did not stop within 30s of Ctrl-C"

ports_down() {
  local p
  for p in 5432 6379 5672 15672; do listening "$p" && return 1; done
  return 0
}
make --no-print-directory services-down >"$LOGS/services-down.log" 2>&1 || die "make services-down"
ports_down || die "make services-down left something listening: $(cat "$LOGS/services-down.log")"
t=$SECONDS
make --no-print-directory services >"$LOGS/services-again.log" 2>&1 || die "make services (again)"
grep -q apt-get "$LOGS/services-again.log" && die "make services installed again: $(cat "$LOGS/services-again.log")"
log "make services again (from the state the first left): $((SECONDS - t))s"
make --no-print-directory services-down >>"$LOGS/services-down.log" 2>&1 || die "make services-down (again)"
ports_down || die "make services-down (again) left something listening"
log "make services-down stopped all it started, twice"
