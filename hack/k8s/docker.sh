#!/usr/bin/env bash
# docker.sh start|stop: a private Docker engine (Debian's docker.io) that only
# builds the cluster's images: its own socket ($DOCKER_HOST), data root under
# $CACHE/docker (base images and build cache survive between runs), its own
# bridge, PID file $RUN_DIR/dockerd.pid. It never touches another Docker
# engine on the machine.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
case ${1:-} in
start)
  mkdir -p "$RUN_DIR" "$CACHE/docker"
  docker version >/dev/null 2>&1 && exit 0
  # A PID file of an engine that died with the machine or was killed.
  if [[ -f $RUN_DIR/dockerd.pid ]] && ! kill -0 "$(cat "$RUN_DIR/dockerd.pid")" 2>/dev/null; then rm -f "$RUN_DIR/dockerd.pid"; fi
  # Its own bridge (BuildKit's frontend container needs one), no iptables
  # rules: builds that download use --network host.
  ip link show iek8sdock0 >/dev/null 2>&1 || { ip link add iek8sdock0 type bridge; ip addr add 172.31.254.1/24 dev iek8sdock0; }
  ip link set iek8sdock0 up
  setsid nohup dockerd --data-root "$CACHE/docker" --exec-root "$RUN_DIR/docker-exec" \
    --host "$DOCKER_HOST" --pidfile "$RUN_DIR/dockerd.pid" --bridge iek8sdock0 --iptables=false --ip-forward=false \
    >"$CACHE/dockerd.log" 2>&1 </dev/null &
  wait_for dockerd 60 docker version || { tail -20 "$CACHE/dockerd.log" >&2; exit 1; }
  ;;
stop)
  if [[ -f $RUN_DIR/dockerd.pid ]] && p=$(cat "$RUN_DIR/dockerd.pid") && kill -0 "$p" 2>/dev/null; then
    kill "$p"
    for _ in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$p" 2>/dev/null || true
  fi
  ip link del iek8sdock0 2>/dev/null || true
  ;;
*) echo "usage: docker.sh start|stop" >&2; exit 2 ;;
esac
