#!/usr/bin/env bash
# Make sure RabbitMQ, Redis and PostgreSQL answer on 127.0.0.1, starting any
# that is installed locally but not listening, and enable the RabbitMQ
# management plugin the tests use to create a vhost per test.
# Used by `make dev`, `make test` and .ci/run. Exits non-zero, naming the
# service, if one cannot be brought up.
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port seconds
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    listening "$2" && return 0
    sleep 0.1
  done
  echo "services: $1 did not start listening on 127.0.0.1:$2 within $3s" >&2
  return 1
}

if ! listening 5432; then
  echo "services: starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
  else
    echo "services: PostgreSQL is not listening on 5432 and pg_ctlcluster is not installed" >&2; exit 1
  fi
  wait_for PostgreSQL 5432 60
fi

if ! listening 6379; then
  echo "services: starting Redis"
  command -v redis-server >/dev/null || { echo "services: Redis is not listening on 6379 and redis-server is not installed" >&2; exit 1; }
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis 6379 30
fi

if ! listening 5672; then
  echo "services: starting RabbitMQ"
  command -v rabbitmq-server >/dev/null || { echo "services: RabbitMQ is not listening on 5672 and rabbitmq-server is not installed" >&2; exit 1; }
  rabbitmq-server -detached
  wait_for RabbitMQ 5672 120
fi

if ! listening 15672; then
  if command -v rabbitmq-plugins >/dev/null; then
    echo "services: enabling the RabbitMQ management plugin"
    rabbitmq-plugins enable rabbitmq_management >/dev/null
    wait_for "RabbitMQ management" 15672 60
  else
    echo "services: RabbitMQ management API not on 15672; tests fall back to rabbitmqctl for vhosts" >&2
  fi
fi
echo "services: PostgreSQL, Redis and RabbitMQ are up on 127.0.0.1"
