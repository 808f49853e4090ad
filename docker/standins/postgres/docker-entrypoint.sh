#!/bin/sh
# The official postgres image's contract, reduced to what docker-compose.yml uses: on an
# empty $PGDATA create the cluster with superuser $POSTGRES_USER (password
# $POSTGRES_PASSWORD, required) and database $POSTGRES_DB, then run the server on all
# interfaces with password authentication for TCP clients.
set -eu

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "docker-entrypoint: POSTGRES_PASSWORD is empty; refusing to create a database" \
             "without a password" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
           --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --no-instructions
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        # A socket-only server while the database is created, so nothing connecting over
        # TCP (pg_isready -h in the healthcheck) sees it before it is ready.
        pg_ctl --pgdata="$PGDATA" --options="-c listen_addresses=''" --wait --silent start
        createdb --username="$POSTGRES_USER" "$POSTGRES_DB"
        pg_ctl --pgdata="$PGDATA" --mode=fast --wait --silent stop
    fi
fi

if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
