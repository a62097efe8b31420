#!/usr/bin/env bash
# Entrypoint of the postgres stand-in: the part of the official image's
# docker-entrypoint.sh that the postgresql subchart relies on, rewritten for
# Debian's PostgreSQL 15.
#
#   - first argument starting with "-": run `postgres` with those flags;
#   - started as root: own $PGDATA and /var/run/postgresql, drop to postgres;
#   - empty $PGDATA (no PG_VERSION): initdb with POSTGRES_USER as the
#     superuser and POSTGRES_PASSWORD as its password (required unless
#     POSTGRES_HOST_AUTH_METHOD=trust), local connections trusted as initdb
#     sets them, `host all all all <password_encryption>` appended to
#     pg_hba.conf (scram-sha-256), POSTGRES_DB created on a socket-only
#     temporary server, then *.sql and *.sh of /docker-entrypoint-initdb.d;
#   - then exec the command (listen_addresses='*' comes from the sample
#     config the Dockerfile edited).
#
# Not implemented: the *_FILE variables, POSTGRES_INITDB_WALDIR, nss_wrapper
# for uids missing from /etc/passwd, compressed init files.
set -Eeuo pipefail

say() { printf '%s\n' "$*" >&2; }

if [[ ${1:-} == -* ]]; then set -- postgres "$@"; fi
if [[ ${1:-} != postgres ]]; then exec "$@"; fi
for arg; do
  case $arg in -'?' | --help | --describe-config | -V | --version) exec "$@" ;; esac
done

: "${PGDATA:=/var/lib/postgresql/data}"
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:=}"
: "${POSTGRES_INITDB_ARGS:=}"
: "${POSTGRES_HOST_AUTH_METHOD:=}"
export PGDATA

mkdir -p "$PGDATA"
chmod 700 "$PGDATA" || :   # initdb and postgres refuse a group/world-accessible PGDATA
mkdir -p /var/run/postgresql || :
chmod 3775 /var/run/postgresql || :
if [[ $(id -u) == 0 ]]; then
  find "$PGDATA" /var/run/postgresql \! -user postgres -exec chown postgres: '{}' +
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [[ -s $PGDATA/PG_VERSION ]]; then
  say "PostgreSQL data directory $PGDATA contains a database; skipping initialization"
  exec "$@"
fi

if [[ -z $POSTGRES_PASSWORD && $POSTGRES_HOST_AUTH_METHOD != trust ]]; then
  say "error: $PGDATA is empty and POSTGRES_PASSWORD is not set (or set POSTGRES_HOST_AUTH_METHOD=trust)"
  exit 1
fi

# The password goes through a pipe, never a file on disk. The trailing
# newline: initdb rejects an empty --pwfile.
# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of flags
initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") $POSTGRES_INITDB_ARGS

shift # "postgres": the rest are server flags, honoured by the temporary server too
if [[ -z $POSTGRES_HOST_AUTH_METHOD ]]; then
  POSTGRES_HOST_AUTH_METHOD=$(postgres -C password_encryption "$@")
fi
printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

# A temporary server on the socket only, so nothing connects over TCP
# before POSTGRES_DB exists.
export PGPASSWORD=$POSTGRES_PASSWORD
NOTIFY_SOCKET='' pg_ctl -D "$PGDATA" -w start -o "$(printf '%q ' "$@" -c "listen_addresses=" -p "${PGPORT:-5432}")"
sql() { PGHOST='' PGHOSTADDR='' psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc "$@"; }
# On stdin: psql interpolates :'db' and :"db" only in input it reads, not in -c.
if [[ -z $(printf "SELECT 1 FROM pg_database WHERE datname = :'db';\n" | sql --dbname postgres --tuples-only --set db="$POSTGRES_DB") ]]; then
  printf 'CREATE DATABASE :"db";\n' | sql --dbname postgres --set db="$POSTGRES_DB"
fi
for f in /docker-entrypoint-initdb.d/*; do
  case $f in
    *.sql) say "running $f"; sql --dbname "$POSTGRES_DB" -f "$f" ;;
    *.sh) say "running $f"; if [[ -x $f ]]; then "$f"; else . "$f"; fi ;;
    */\*) ;;
    *) say "ignoring $f" ;;
  esac
done
PGUSER=$POSTGRES_USER pg_ctl -D "$PGDATA" -m fast -w stop
unset PGPASSWORD
say "PostgreSQL init process complete; ready for start up."

exec postgres "$@"
