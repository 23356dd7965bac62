#!/usr/bin/env bash
# A short narrated scenario on a disposable PostgreSQL: writers record deletions inside their
# own transactions, the sequencer numbers them, a durable consumer receives them in order and
# resumes from its cursor after a restart.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

say "Starting a disposable PostgreSQL cluster (scripts/pg.sh up)"
cluster=$(bash scripts/pg.sh up)
echo "cluster: $cluster"
psql -Xq "$cluster" -c "DROP DATABASE IF EXISTS outbox_demo" -c "CREATE DATABASE outbox_demo"
url=${cluster/\/postgres\?/\/outbox_demo?}
export DATABASE_URL=$url
echo "demo database: $DATABASE_URL"

say "Building the outbox CLI"
cargo build --quiet -p outbox-cli
outbox=target/debug/outbox
sql() { psql -Xq -v ON_ERROR_STOP=1 "$DATABASE_URL" "$@"; }

say "Migrating the outbox schema (safe to repeat)"
run $outbox migrate
run $outbox migrate

say "The application's own table: five live tasks in project 'demo'"
sql -c "CREATE TABLE tasks (id text PRIMARY KEY, project_id text NOT NULL,
                            column_name text NOT NULL, status text NOT NULL,
                            deleted_at timestamptz)" \
    -c "INSERT INTO tasks SELECT 'FN-' || g, 'demo', 'todo', 'open', NULL
        FROM generate_series(1, 5) g"

say "A durable consumer 'dashboard' starts; it has no cursor yet, so it reconciles first"
out=$(mktemp)
$outbox consume --project demo --consumer-id dashboard --lease-ttl 10s --heartbeat-interval 2s \
    >"$out" 2>"$out.log" &
consumer=$!
trap 'kill $consumer 2>/dev/null || true; rm -f "$out" "$out.log"' EXIT
sleep 1.5
cat "$out"

delete_task() { # id, commit|rollback
    sql -c "BEGIN" \
        -c "UPDATE tasks SET deleted_at = now() WHERE id = '$1' AND deleted_at IS NULL" \
        -c "SELECT outbox.write_task_deleted('demo', '$1', now(), 'demo-api-1',
                   jsonb_build_object('column', 'todo', 'status', 'open')) AS event_id" \
        -c "$2"
}

say "Service A deletes FN-1 and records the event in the same transaction, then commits"
delete_task FN-1 COMMIT
say "Service B deletes FN-2 but rolls back: the event never existed"
delete_task FN-2 ROLLBACK
say "A retried delete of FN-4 (same deleted_at) records one event: the second write is a no-op"
sql -c "UPDATE tasks SET deleted_at = '2026-11-01T12:00:00Z' WHERE id = 'FN-4'" \
    -c "SELECT outbox.write_task_deleted('demo', 'FN-4', '2026-11-01T12:00:00Z', 'demo-api-1')" \
    -c "SELECT outbox.write_task_deleted('demo', 'FN-4', '2026-11-01T12:00:00Z', 'demo-api-2')" \
    -c "SELECT count(*) AS rows_for_fn_4 FROM outbox.lifecycle_outbox WHERE task_id = 'FN-4'"
sleep 1

say "The consumer received each committed event once, in sequence order"
cat "$out"

say "Stopping the consumer (SIGTERM): it finishes, acknowledges and releases its lease"
kill -TERM $consumer
wait $consumer || true
: >"$out"

say "While it is down, FN-3 is deleted"
delete_task FN-3 COMMIT

say "Restarted with the same consumer ID, it resumes right after its cursor"
$outbox consume --project demo --consumer-id dashboard --lease-ttl 10s --heartbeat-interval 2s \
    >"$out" 2>>"$out.log" &
consumer=$!
sleep 1.5
cat "$out"
kill -TERM $consumer
wait $consumer || true

say "Extending the stream deliberately: the archive flow's contracts are registered (audited)"
run $outbox contracts add contracts/task-archived.json --by demo-operator
run $outbox contracts add contracts/task-restored.json --by demo-operator
run $outbox contracts list

say "FN-5 is archived: the generic writer checks the payload against its contract"
sql -c "SELECT outbox.write_event('demo', 'task:archived', 1, 'FN-5',
               jsonb_build_object('archived_at', now(),
                                  'prior', jsonb_build_object('column', 'todo', 'status', 'open')),
               'demo-api-1') AS event_id"
say "A payload with a free-text note is refused, naming the field; nothing is written"
sql -c "SELECT outbox.write_event('demo', 'task:archived', 1, 'FN-5',
               '{\"archived_at\": \"2026-11-01T12:00:00Z\", \"prior\": {}, \"note\": \"bye\"}',
               'demo-api-1')" || true

say "A consumer that declares both types receives the archive; the deletes-only 'dashboard' passes it"
: >"$out"
$outbox consume --project demo --consumer-id archive-view --start-from earliest \
    --event-types task:deleted@1,task:archived@1 --exit-when-caught-up >"$out" 2>>"$out.log"
cat "$out"

say "What the database holds"
sql -c "SELECT sequence, event_id, writer_process_id, payload FROM outbox.lifecycle_outbox
        WHERE project_id = 'demo' ORDER BY sequence" \
    -c "SELECT consumer_id, last_acked_sequence, lease_generation, lease_owner, state
        FROM outbox.lifecycle_consumer_cursors" \
    -c "SELECT kind, project_id, consumer_id, count FROM outbox.lifecycle_audit ORDER BY id"

if $outbox status --help >/dev/null 2>&1; then
    say "Operator view (outbox status)"
    $outbox status || true
fi

say "Done. The cluster keeps running for you to explore:"
echo "  export DATABASE_URL='$DATABASE_URL'"
echo "  make pg-down   # to stop it"
