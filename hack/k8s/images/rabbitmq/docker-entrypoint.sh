#!/usr/bin/env bash
# Entrypoint of the rabbitmq stand-in, doing what the official image's
# docker-entrypoint.sh does (the default user, RABBITMQ_DEFAULT_USER and
# RABBITMQ_DEFAULT_PASS, is created by RabbitMQ itself, not by this script):
#
#   - started as root with a rabbitmq* command: own /var/lib/rabbitmq, drop to
#     the rabbitmq user (uid 999);
#   - refuse the variables the official image has deprecated;
#   - long node names when the hostname is a FQDN;
#   - RUNNING_UNDER_SYSTEMD=true so that rabbitmq-server execs the VM (beam
#     becomes PID 1 and receives SIGTERM).
set -euo pipefail

if [[ ${1:-} == rabbitmq* && $(id -u) == 0 ]]; then
  if [[ $1 == rabbitmq-server ]]; then
    find /var/lib/rabbitmq \! -user rabbitmq -exec chown rabbitmq '{}' +
  fi
  exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "${BASH_SOURCE[0]}" "$@"
fi

deprecated=0
for v in RABBITMQ_DEFAULT_PASS_FILE RABBITMQ_DEFAULT_USER_FILE RABBITMQ_VM_MEMORY_HIGH_WATERMARK \
  "${!RABBITMQ_SSL_@}" "${!RABBITMQ_MANAGEMENT_SSL_@}"; do
  if [[ -n ${!v:-} ]]; then echo "error: $v is set but deprecated; use a file in /etc/rabbitmq/conf.d" >&2; deprecated=1; fi
done
[[ $deprecated == 0 ]] || exit 1

if [[ -z ${RABBITMQ_USE_LONGNAME:-} && $(hostname) != "$(hostname -s)" ]]; then
  export RABBITMQ_USE_LONGNAME=true
fi
export RUNNING_UNDER_SYSTEMD=true

exec "$@"
