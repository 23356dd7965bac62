# What the peer benchmarks (peers-harness.sh, equal-latency.sh) share: each system's schema
# and its producer's statement. Sourced after bench/lib.sh, never run; `peers` names the
# directory of PgQue's SQL when the pgque system is used.

# peer_setup SYSTEM: the system's schema in $DATABASE_URL: PgQ's or PgQue's queue
# `bench_queue` (rotation every 30 s, as the peers' harness) with the consumer `bench_consumer`,
# and the ticker procedure (create_ticker), or this project's migrations.
peer_setup() {
    case $1 in
    pgq)
        sql <<'SQL'
CREATE EXTENSION pgq;
SELECT pgq.create_queue('bench_queue');
UPDATE pgq.queue SET queue_rotation_period = '30 seconds' WHERE queue_name = 'bench_queue';
SELECT pgq.register_consumer('bench_queue', 'bench_consumer');
SQL
        create_ticker
        ;;
    pgque)
        sql -f "$peers/sql/pgque.sql" >/dev/null
        sql <<'SQL'
SELECT pgque.create_queue('bench_queue');
UPDATE pgque.queue SET queue_rotation_period = '30 seconds' WHERE queue_name = 'bench_queue';
SELECT pgque.register_consumer('bench_queue', 'bench_consumer');
SQL
        create_ticker
        ;;
    ours)
        "$outbox" migrate >&2
        # The table `outbox consume`'s default live-set query reads when it reconciles.
        sql -c "CREATE TABLE tasks (id text PRIMARY KEY, project_id text NOT NULL, deleted_at timestamptz)"
        ;;
    esac
}

# The producer's statement (the authors' producer.sql for the peers).
producer_sql() {
    case $1 in
    pgq) echo "SELECT pgq.insert_event('bench_queue', 'bench', repeat('x', 200));" ;;
    pgque) echo "SELECT pgque.send('bench_queue', json_build_object('data', repeat('x', 200))::jsonb);" ;;
    ours)
        cat <<'SQL'
\set k :k + 1
SELECT outbox.write_task_deleted('p0', lpad(:k::text, 64, 't'), clock_timestamp(), 'bench-writer',
    jsonb_build_object('column', repeat('c', 64), 'status', repeat('s', 64)));
SQL
        ;;
    esac
}

# create_ticker: `bench_ticker(kind, period_ms)`, PgQ's or PgQue's ticker and maintenance as
# their daemons run them: a tick every period_ms, maintenance every 5 s, a transaction per step.
create_ticker() {
    sql <<'SQL'
CREATE PROCEDURE bench_ticker(kind text, period_ms int) LANGUAGE plpgsql AS $$
DECLARE
    last_maint timestamptz := clock_timestamp();
    op record;
BEGIN
    LOOP
        IF kind = 'pgq' THEN
            PERFORM pgq.ticker();
            COMMIT;
            IF clock_timestamp() - last_maint >= interval '5 seconds' THEN
                FOR op IN SELECT func_name, func_arg FROM pgq.maint_operations() LOOP
                    CONTINUE WHEN op.func_name = 'vacuum';
                    IF op.func_arg IS NULL THEN
                        EXECUTE format('SELECT %s()', op.func_name);
                    ELSE
                        EXECUTE format('SELECT %s(%L)', op.func_name, op.func_arg);
                    END IF;
                    COMMIT;
                END LOOP;
                last_maint := clock_timestamp();
            END IF;
        ELSE
            PERFORM pgque.ticker();
            COMMIT;
            IF clock_timestamp() - last_maint >= interval '5 seconds' THEN
                PERFORM pgque.maint();
                COMMIT;
                PERFORM pgque.maint_rotate_tables_step2();
                COMMIT;
                last_maint := clock_timestamp();
            END IF;
        END IF;
        PERFORM pg_sleep(period_ms / 1000.0);
    END LOOP;
END $$;
SQL
}

# notice_arrivals: the arrivals (unix ms and age in µs, a line per event) from a PgQ or PgQue
# consumer's NOTICEs on stdin (`ev ts=<epoch s> n=<events> ages=<ms,ms,...>`).
notice_arrivals() {
    sed -n 's/.*ev ts=\([0-9]*\) n=\([0-9]*\) ages=\(.*\)$/\1 \3/p' | awk '
        { if ($2 == "") next; n = split($2, a, ","); for (i = 1; i <= n; i++) printf "%.0f %.0f\n", $1 * 1000, a[i] * 1000 }'
}
