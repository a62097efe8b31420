#!/bin/sh
# Entrypoint of the redis stand-in, doing what the official image's does.
# The subchart sets the container's command to redis-server, which replaces
# this entrypoint in Kubernetes; it only matters for `docker run`.
#
#   - first argument a flag or a *.conf file: run redis-server with them;
#   - started as root: own /data (the working directory), drop to redis;
#   - umask 0077 unless one was set.
set -eu

case ${1:-} in
  -* | *.conf) set -- redis-server "$@" ;;
esac

if [ "${1:-}" = redis-server ] && [ "$(id -u)" = 0 ]; then
  find . \! -user redis -exec chown redis '{}' +
  exec setpriv --reuid=redis --regid=redis --init-groups "$0" "$@"
fi

if [ "$(umask)" = 0022 ]; then umask 0077; fi

exec "$@"
