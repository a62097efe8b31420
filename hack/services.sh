#!/usr/bin/env bash
# services.sh [up|down]: make sure PostgreSQL, Redis and RabbitMQ answer on
# 127.0.0.1 (`make services`; `make dev`, `make test` and .ci/run run it
# first), or stop what it started (`make services-down`).
#
# For each service, the first of these that applies, said in one line:
#   1. something already listens on its port: it is used, and nothing of it is
#      changed;
#   2. one this script set up before (its state directory, below): started
#      again from there;
#   3. installed: started. A system PostgreSQL cluster (Debian's
#      pg_ctlcluster) is started as it is, when run as root; otherwise
#      PostgreSQL, Redis and RabbitMQ run from the state directory, with the
#      installed binaries;
#   4. Debian or Ubuntu, as root: Debian's packages (postgresql,
#      redis-server, rabbitmq-server) installed with apt-get,
#      non-interactively, without starting or enabling their system services;
#      then as 3, from the state directory: PostgreSQL with trust for the user
#      postgres on loopback, RabbitMQ with guest/guest and its management
#      plugin;
#   5. Docker with Compose: that service of compose.yaml (the chart's image
#      versions, ports on 127.0.0.1);
#   6. otherwise: it stops, with the commands to run on the common platforms.
#
# The state directory: $IE_SERVICES_DIR, by default
# ${XDG_STATE_HOME:-~/.local/state}/idempotent-events/services, or
# /var/lib/idempotent-events/services as root (the servers then run as their
# own users, postgres, redis and rabbitmq, which cannot enter root's home).
# Each service it runs has <service>/{data,log} and its pid file there, and
# the file `started` lists what this script started; `down` stops exactly
# those, and removes nothing else (data stays for the next start).
#
# RabbitMQ's management plugin (the tests create vhosts and read queue gauges
# through it) is on in every RabbitMQ this script starts. On a RabbitMQ that
# was already running it is enabled only for the suite (make test sets
# IE_SERVICES_FOR_TESTS, and CI sets CI): the tests cannot run without it,
# and the line says so; make dev and make services leave it as it is and
# say how.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [[ $(id -u) -eq 0 ]]; then
  STATE=${IE_SERVICES_DIR:-/var/lib/idempotent-events/services}
else
  STATE=${IE_SERVICES_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/idempotent-events/services}
fi
[[ $STATE == /* ]] || STATE=$PWD/$STATE
STARTED=$STATE/started
COMPOSE=(docker compose -f "$ROOT/compose.yaml")

say() { echo "services: $*"; }
fail() { echo "services: $*" >&2; exit 1; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
root() { [[ $(id -u) -eq 0 ]]; }
has_user() { id -u "$1" >/dev/null 2>&1; }

# as USER CMD...: CMD as USER when root and USER exists, else as ourselves;
# from / (USER may not enter the current directory, root's home, say).
# Without fd 9, the lock: a server started with it would hold the lock.
as() {
  local u=$1; shift
  if root && has_user "$u"; then (cd / && runuser -u "$u" -- "$@" 9>&-); else "$@" 9>&-; fi
}

# lock: one `make services` or `services-down` at a time per state
# directory (fd 9; flock is not on every platform).
lock() {
  mkdir -p "$STATE"
  if command -v flock >/dev/null; then
    exec 9>"$STATE/lock"
    flock 9
  fi
}

# dirs USER DIR...: create DIRs, owned by USER when root and USER exists.
dirs() {
  local u=$1; shift
  mkdir -p "$@"
  if root && has_user "$u"; then chown "$u:" "$@"; fi
}

# wait_for NAME PORT SECONDS LOG: until PORT listens; else the last lines of LOG.
wait_for() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    listening "$2" && return 0
    sleep 0.1
  done
  echo "services: $1 did not start listening on 127.0.0.1:$2 within $3s${4:+; the last lines of $4:}" >&2
  if [[ -n ${4:-} ]]; then tail -n 20 "$4" >&2 || true; fi
  return 1
}

name() { case $1 in postgresql) echo PostgreSQL ;; redis) echo Redis ;; rabbitmq) echo RabbitMQ ;; esac; }

record() { grep -qxF "$1" "$STARTED" 2>/dev/null || echo "$1" >>"$STARTED"; }

debian_like() {
  [[ -r /etc/os-release ]] || return 1
  local id like
  id=$(. /etc/os-release && echo "${ID:-}") like=$(. /etc/os-release && echo "${ID_LIKE:-}")
  [[ " $id $like " == *" debian "* || " $id $like " == *" ubuntu "* ]] && command -v apt-get >/dev/null
}

compose_ok() {
  command -v docker >/dev/null && docker compose version >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

# --- where the installed servers are ----------------------------------------

# pg_bin: the directory of the newest initdb + pg_ctl: PATH, Debian's
# /usr/lib/postgresql/*/bin, Homebrew's keg-only postgresql@N.
pg_bin() {
  local d
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then dirname "$(command -v pg_ctl)"; return; fi
  for d in $(ls -d /usr/lib/postgresql/*/bin /opt/homebrew/opt/postgresql@*/bin /usr/local/opt/postgresql@*/bin 2>/dev/null | sort -V -r); do
    if [[ -x $d/initdb && -x $d/pg_ctl ]]; then echo "$d"; return; fi
  done
  return 1
}

# pg_system_cluster: "VERSION main" of the newest system cluster (Debian's
# postgresql-common), which root starts as it is.
pg_system_cluster() {
  root && command -v pg_ctlcluster >/dev/null || return 1
  local v
  v=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -1)
  [[ -n $v && -d /etc/postgresql/$v/main ]] && echo "$v main"
}

# rabbitmq_bin: the directory of the real rabbitmq-server script (Debian's
# /usr/sbin one is a wrapper that switches user and ignores our environment).
rabbitmq_bin() {
  if [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; then echo /usr/lib/rabbitmq/bin; return; fi
  command -v rabbitmq-server >/dev/null || return 1
  dirname "$(command -v rabbitmq-server)"
}

# --- starting them from the state directory ---------------------------------

start_postgresql() {
  local bin=$1 d=$STATE/postgresql
  dirs postgres "$d" "$d/log" "$d/run"
  if [[ ! -f $d/data/PG_VERSION ]]; then
    dirs postgres "$d/data"
    chmod 700 "$d/data"
    as postgres "$bin/initdb" -D "$d/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$d/log/initdb.log" 2>&1 ||
      as postgres "$bin/initdb" -D "$d/data" -U postgres --auth=trust -E UTF8 --locale=C >"$d/log/initdb.log" 2>&1 ||
      { tail -n 20 "$d/log/initdb.log" >&2; fail "PostgreSQL: initdb in $d/data failed"; }
    # Only the user postgres, only from this machine, without a password:
    # what the tests and `make dev` use.
    cat >"$d/data/pg_hba.conf" <<'HBA'
# idempotent-events (hack/services.sh): trust for postgres on loopback only.
local all postgres trust
host  all postgres 127.0.0.1/32 trust
host  all postgres ::1/128 trust
HBA
    cat >>"$d/data/postgresql.conf" <<CONF
# idempotent-events (hack/services.sh)
listen_addresses = '127.0.0.1'
port = 5432
unix_socket_directories = '$d/run'
CONF
  fi
  record "postgresql own"
  as postgres "$bin/pg_ctl" -D "$d/data" -l "$d/log/postgresql.log" -w -t 60 start >/dev/null ||
    { tail -n 20 "$d/log/postgresql.log" >&2; fail "PostgreSQL: pg_ctl start failed (log: $d/log/postgresql.log)"; }
  wait_for PostgreSQL 5432 60 "$d/log/postgresql.log"
}

start_redis() {
  local d=$STATE/redis
  dirs redis "$d" "$d/data" "$d/log"
  record "redis own"
  as redis redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir "$d/data" --logfile "$d/log/redis.log" --pidfile "$d/redis.pid" ||
    fail "Redis: redis-server did not start (log: $d/log/redis.log)"
  wait_for Redis 6379 30 "$d/log/redis.log"
}

start_rabbitmq() {
  local bin=$1 d=$STATE/rabbitmq
  dirs rabbitmq "$d" "$d/data" "$d/log"
  # Its own configuration, plugins, data and logs: nothing of a system node's
  # (/etc/rabbitmq/rabbitmq.conf, /var/lib/rabbitmq) is read or written. It
  # keeps the node name (rabbitmq-env.conf's or rabbit@<host>) and the Erlang
  # cookie of the user it runs as, so that a plain rabbitmqctl reaches it
  # (the chaos run of `make test` uses one); Erlang's port mapper and
  # distribution port are bound as Debian's own service binds them (where
  # the node's host name resolves, 127.0.1.1 on Debian; the cookie guards
  # them), unless rabbitmq-env.conf says otherwise.
  cat >"$d/rabbitmq.conf" <<'CONF'
listeners.tcp.1 = 127.0.0.1:5672
management.tcp.ip = 127.0.0.1
management.tcp.port = 15672
CONF
  echo '[rabbitmq_management].' >"$d/enabled_plugins"
  if root && has_user rabbitmq; then chown rabbitmq: "$d/rabbitmq.conf" "$d/enabled_plugins"; fi
  # epmd (Erlang's port mapper) is started by the node when none runs; it is
  # then ours to stop too.
  if ! listening 4369; then record "epmd"; fi
  record "rabbitmq own"
  # In a session of its own where there is setsid (not on macOS).
  local detach=(nohup)
  if command -v setsid >/dev/null; then detach=(setsid nohup); fi
  RABBITMQ_CONFIG_FILE=$d/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins \
    RABBITMQ_MNESIA_BASE=$d/data RABBITMQ_LOG_BASE=$d/log RABBITMQ_PID_FILE=$d/rabbitmq.pid \
    as rabbitmq "${detach[@]}" "$bin/rabbitmq-server" >"$d/log/console.log" 2>&1 </dev/null 9>&- &
  wait_for RabbitMQ 5672 120 "$d/log/console.log"
  wait_for "RabbitMQ management" 15672 60 "$d/log/console.log"
}

# --- installing them --------------------------------------------------------

# apt_install PACKAGE...: Debian's packages, non-interactively, with their
# system services neither started (policy-rc.d) nor enabled at boot: this
# script runs them from the state directory.
apt_install() {
  local log=$STATE/apt.log policy=/usr/sbin/policy-rc.d ours=
  mkdir -p "$STATE"
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\n# hack/services.sh: no service starts while it installs.\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    ours=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@")
  if ! "${apt[@]}" >"$log" 2>&1; then
    # The package lists may be missing or stale (a fresh machine has none).
    apt-get update -q >>"$log" 2>&1 || true
    "${apt[@]}" >>"$log" 2>&1 || { tail -n 20 "$log" >&2; fail "apt-get install $* failed (log: $log)"; }
  fi
  if [[ -n $ours ]]; then rm -f "$policy"; trap - EXIT; fi
  echo "installed: $*" >>"$STATE/installed"
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    local u units=()
    for u in postgresql redis-server rabbitmq-server; do
      systemctl list-unit-files "$u.service" >/dev/null 2>&1 && units+=("$u")
    done
    if ((${#units[@]})); then systemctl disable --quiet "${units[@]}" 2>/dev/null || true; fi
  fi
}

# --- stopping what was started ----------------------------------------------

# alive PID: it runs (an exited process its parent has not reaped is not).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [[ ! -r /proc/$1/stat ]] || [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]
}

# stop_pid NAME PIDFILE: SIGTERM, then up to 60 s for it to exit.
stop_pid() {
  local p i
  [[ -f $2 ]] || { say "$1: no pid file ($2): not running"; return 0; }
  p=$(head -1 "$2")
  if ! alive "$p"; then say "$1: not running (pid $p)"; rm -f "$2"; return 0; fi
  kill -TERM "$p"
  for ((i = 0; i < 600; i++)); do alive "$p" || break; sleep 0.1; done
  if alive "$p"; then echo "services: $1: pid $p still runs 60s after SIGTERM" >&2; return 1; fi
  rm -f "$2"
  say "$1: stopped"
}

down() {
  if [[ ! -s $STARTED ]]; then
    say "nothing to stop: this script started none of them (state: $STATE)"
    return 0
  fi
  lock
  local line bin compose=() left=()
  # The reverse of the order they were started in; whatever cannot be
  # stopped stays in the list, and the others are stopped all the same.
  while read -r line; do
    case $line in
    "postgresql own")
      if ! bin=$(pg_bin); then
        echo "services: PostgreSQL: pg_ctl not found to stop $STATE/postgresql/data" >&2; left+=("$line")
      elif as postgres "$bin/pg_ctl" -D "$STATE/postgresql/data" status >/dev/null 2>&1; then
        if as postgres "$bin/pg_ctl" -D "$STATE/postgresql/data" -m fast -w stop >/dev/null; then
          say "PostgreSQL: stopped ($STATE/postgresql)"
        else
          left+=("$line")
        fi
      else
        say "PostgreSQL: not running ($STATE/postgresql)"
      fi
      ;;
    "postgresql cluster "*)
      # shellcheck disable=SC2086
      if pg_ctlcluster --skip-systemctl-redirect ${line#postgresql cluster } stop 9>&-; then
        say "PostgreSQL: stopped the system cluster ${line#postgresql cluster }"
      else
        left+=("$line")
      fi
      ;;
    "redis own") stop_pid Redis "$STATE/redis/redis.pid" || left+=("$line") ;;
    "rabbitmq own") stop_pid RabbitMQ "$STATE/rabbitmq/rabbitmq.pid" || left+=("$line") ;;
    epmd)
      # Only when no other Erlang node is registered with it.
      if listening 4369 && command -v epmd >/dev/null; then
        if epmd -names 2>/dev/null | grep -q '^name '; then
          say "epmd: left running, other Erlang nodes use it"
        else
          epmd -kill >/dev/null && say "epmd: stopped"
        fi
      fi
      ;;
    "compose "*) compose+=("${line#compose }") ;;
    *) say "unknown line in $STARTED: $line (ignored)" ;;
    esac
  done < <(tac "$STARTED" 2>/dev/null || tail -r "$STARTED")
  if ((${#compose[@]})); then
    if "${COMPOSE[@]}" rm --stop --force "${compose[@]}" >/dev/null 9>&-; then
      say "compose: stopped and removed ${compose[*]}"
    else
      for line in "${compose[@]}"; do left+=("compose $line"); done
    fi
  fi
  if ((${#left[@]})); then
    printf '%s\n' "${left[@]}" >"$STARTED"
    fail "not stopped: ${left[*]} (still listed in $STARTED)"
  fi
  rm -f "$STARTED"
}

case ${1:-up} in
up) ;;
down)
  down
  exit
  ;;
*) echo "usage: $0 [up|down]" >&2; exit 2 ;;
esac

# --- up ---------------------------------------------------------------------

# First what is there; nothing is written while every service listens.
need=()
for s in postgresql redis rabbitmq; do
  case $s in postgresql) p=5432 ;; redis) p=6379 ;; rabbitmq) p=5672 ;; esac
  if listening "$p"; then
    case $s in
    postgresql) say "PostgreSQL: already listening on 127.0.0.1:5432, using it" ;;
    redis) say "Redis: already listening on 127.0.0.1:6379, using it" ;;
    rabbitmq)
      if listening 15672; then
        say "RabbitMQ: already listening on 127.0.0.1:5672 (management API on 15672), using it"
      elif [[ -n ${CI:-}${IE_SERVICES_FOR_TESTS:-} ]] && command -v rabbitmq-plugins >/dev/null; then
        say "RabbitMQ: already listening on 127.0.0.1:5672, using it; enabling its management plugin for the suite (the tests need its API on 15672)"
        rabbitmq-plugins enable rabbitmq_management >/dev/null
        wait_for "RabbitMQ management" 15672 60
      else
        say "RabbitMQ: already listening on 127.0.0.1:5672, using it; its management API is not on 15672, which some tests need (rabbitmq-plugins enable rabbitmq_management): left as it is"
      fi
      ;;
    esac
  else
    need+=("$s")
  fi
done
if ((${#need[@]} == 0)); then
  say "PostgreSQL, Redis and RabbitMQ are up on 127.0.0.1"
  exit 0
fi

lock

# how SERVICE: how it comes up, the first of the header's ways that applies.
how() {
  case $1 in
  postgresql)
    if [[ -f $STATE/postgresql/data/PG_VERSION ]] && pg_bin >/dev/null; then echo own; return; fi
    if pg_system_cluster >/dev/null; then echo cluster; return; fi
    if pg_bin >/dev/null && { ! root || has_user postgres; }; then echo installed; return; fi
    ;;
  redis)
    if command -v redis-server >/dev/null; then
      if [[ -d $STATE/redis ]]; then echo own; else echo installed; fi
      return
    fi
    ;;
  rabbitmq)
    if rabbitmq_bin >/dev/null; then
      if [[ -d $STATE/rabbitmq/data ]]; then echo own; else echo installed; fi
      return
    fi
    ;;
  esac
  if root && debian_like; then echo apt
  elif compose_ok; then echo compose
  else echo none
  fi
}

# How each missing one comes up (hows[i] for need[i]: no associative arrays,
# which macOS's bash 3.2 lacks), and the packages to install in one apt-get.
hows=() install=()
for s in "${need[@]}"; do
  h=$(how "$s")
  hows+=("$h")
  if [[ $h == apt ]]; then
    case $s in postgresql) install+=(postgresql) ;; redis) install+=(redis-server) ;; rabbitmq) install+=(rabbitmq-server) ;; esac
  fi
done

for i in "${!need[@]}"; do
  s=${need[$i]}
  if [[ ${hows[$i]} == none ]]; then
    cat >&2 <<MSG
services: $(name "$s") is not listening on 127.0.0.1, is not installed, and this machine has neither
services: apt-get with root nor Docker with Compose to bring it up. Install the services with one of:
services:   Debian/Ubuntu  sudo make services        (apt-get installs postgresql, redis-server, rabbitmq-server)
services:   macOS          brew install postgresql@17 redis rabbitmq && make services
services:                  or, with Docker Desktop: docker compose -f compose.yaml up -d --wait
services:   Fedora         sudo dnf install postgresql-server redis rabbitmq-server && make services
services: then run make dev (or make test) again.
MSG
    exit 1
  fi
done

if ((${#install[@]})); then
  say "not installed: ${install[*]}; installing Debian's packages with apt-get (non-interactive; their system services are not started or enabled)"
  t=$SECONDS
  apt_install "${install[@]}"
  say "installed ${install[*]} in $((SECONDS - t))s (log: $STATE/apt.log)"
fi

for i in "${!need[@]}"; do
  s=${need[$i]} h=${hows[$i]}
  from="from $STATE/$s"
  case $h in
  own) why="set up here before: starting it again $from" ;;
  installed) why="installed, not running: starting it $from" ;;
  apt) why="installed just now with apt-get: starting it $from" ;;
  esac
  case $s:$h in
  postgresql:cluster)
    read -r v c < <(pg_system_cluster)
    say "PostgreSQL: installed, not running: starting the system cluster $v/$c (pg_ctlcluster)"
    record "postgresql cluster $v $c"
    pg_ctlcluster --skip-systemctl-redirect "$v" "$c" start 9>&-
    wait_for PostgreSQL 5432 60
    ;;
  postgresql:compose | redis:compose | rabbitmq:compose)
    svc=$s; [[ $s == postgresql ]] && svc=postgres
    say "$(name "$s"): not installed, no apt-get with root: starting compose.yaml's $svc with Docker Compose"
    record "compose $svc"
    "${COMPOSE[@]}" up -d --wait "$svc" 9>&-
    ;;
  postgresql:*) say "PostgreSQL: $why"; start_postgresql "$(pg_bin)" ;;
  redis:*) say "Redis: $why"; start_redis ;;
  rabbitmq:*) say "RabbitMQ: $why (management plugin on)"; start_rabbitmq "$(rabbitmq_bin)" ;;
  esac
done
say "PostgreSQL, Redis and RabbitMQ are up on 127.0.0.1 (make services-down stops what this started)"
