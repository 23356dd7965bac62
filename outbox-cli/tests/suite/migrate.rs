//! Migrations: idempotent, safe when concurrent, refuse tampering, honour the schema name.

use outbox_core::migrate::{MIGRATIONS, Migration, migrate_with};
use outbox_core::{Error, Schema, migrate};
use outbox_tests::{empty_db, fresh_db};

#[tokio::test]
async fn migrate_twice_applies_once() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    let every: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();
    let first = migrate(&mut client, &Schema::default()).await.unwrap();
    assert_eq!(first.applied, every);
    assert!(first.already_applied.is_empty());
    let second = migrate(&mut client, &Schema::default()).await.unwrap();
    assert!(second.applied.is_empty());
    assert_eq!(second.already_applied, every);
    let rows = client
        .query(
            "SELECT version, checksum FROM outbox.schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), MIGRATIONS.len());
    for (row, migration) in rows.iter().zip(MIGRATIONS) {
        assert_eq!(row.get::<_, String>(1), migration.checksum());
    }
}

#[tokio::test]
async fn concurrent_migrations_serialise() {
    let db = empty_db().await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = db.connect().await;
            migrate(&mut client, &Schema::default()).await
        }));
    }
    let mut applied = 0;
    for task in tasks {
        let report = task
            .await
            .unwrap()
            .expect("every concurrent migrate succeeds");
        applied += report.applied.len();
    }
    assert_eq!(
        applied,
        MIGRATIONS.len(),
        "exactly one process applies each migration"
    );
}

#[tokio::test]
async fn tampered_checksum_is_refused() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    let tampered = [Migration {
        template: "-- edited\nSELECT 1 FROM {{schema}}.lifecycle_outbox;",
        ..MIGRATIONS[0]
    }];
    let err = migrate_with(&mut client, &Schema::default(), &tampered)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ChecksumMismatch { version: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("migration 1 (init)"), "{err}");

    client
        .execute("UPDATE outbox.schema_migrations SET checksum = 'x'", &[])
        .await
        .unwrap();
    let err = migrate(&mut client, &Schema::default()).await.unwrap_err();
    assert!(matches!(err, Error::ChecksumMismatch { .. }), "{err}");
}

#[tokio::test]
async fn unknown_applied_migration_is_refused() {
    let db = fresh_db().await;
    let mut client = db.connect().await;
    client
        .execute(
            "INSERT INTO outbox.schema_migrations (version, name, checksum) VALUES (99, 'future', 'x')",
            &[],
        )
        .await
        .unwrap();
    let err = migrate(&mut client, &Schema::default()).await.unwrap_err();
    assert!(
        matches!(err, Error::UnknownMigration { version: 99, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn failed_migration_leaves_nothing_behind() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    let broken = [
        MIGRATIONS[0],
        Migration {
            version: 2,
            name: "broken",
            template: "CREATE TABLE {{schema}}.half (x int); SELECT no_such_function();",
        },
    ];
    assert!(
        migrate_with(&mut client, &Schema::default(), &broken)
            .await
            .is_err()
    );
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'outbox')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !exists,
        "a failed run rolls back every migration of the run"
    );
}

#[tokio::test]
async fn schema_name_is_configurable() {
    let db = empty_db().await;
    let mut client = db.connect().await;
    let schema = Schema::new("tenant_a").unwrap();
    migrate(&mut client, &schema).await.unwrap();
    let event_id: String = client
        .query_one(
            "SELECT tenant_a.write_task_deleted('p', 't', now(), 'w')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(event_id.starts_with("task-deleted:t:"));
    let numbered = outbox_core::sequencer::Sequencer::new(&schema)
        .drain(&mut client)
        .await
        .unwrap();
    assert_eq!(numbered, 1);
    let outbox_exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'outbox')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!outbox_exists);
}

/// Every index of the event table costs each event twice (the writer's insert and the
/// sequencer's non-HOT update), so it carries only the three its readers use: no key on `id`.
/// Logical decoding still identifies rows, by the idempotency key.
#[tokio::test]
async fn the_event_table_carries_only_the_indexes_its_readers_use() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let rows = client
        .query(
            "SELECT indexrelid::regclass::text AS index, indisreplident \
             FROM pg_index WHERE indrelid = 'outbox.lifecycle_outbox'::regclass \
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let indexes: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        indexes,
        vec![
            ("outbox.lifecycle_outbox_event_key".to_string(), true),
            ("outbox.lifecycle_outbox_frontier_idx".to_string(), false),
            ("outbox.lifecycle_outbox_sequence_idx".to_string(), false),
        ]
    );
    let identity: i8 = client
        .query_one(
            "SELECT relreplident::\"char\" AS identity FROM pg_class \
             WHERE oid = 'outbox.lifecycle_outbox'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(identity as u8, b'i', "replica identity is an index");
}

/// The stored consumer ID rule, a backstop behind the Rust validation: 1 to 128 characters of
/// the identifier class.
#[tokio::test]
async fn the_consumer_id_check_keeps_the_identifier_rule() {
    let db = fresh_db().await;
    let client = db.connect().await;
    let insert = "INSERT INTO outbox.lifecycle_consumers (project_id, consumer_id) \
                  VALUES ('p', $1)";
    for good in ["c".repeat(128), "a.b_c:d@e-f".to_string()] {
        client.execute(insert, &[&good]).await.unwrap();
    }
    for bad in [
        "c".repeat(129),
        String::new(),
        "a b".to_string(),
        "ünï".to_string(),
    ] {
        let err = client.execute(insert, &[&bad]).await.unwrap_err();
        assert_eq!(
            err.as_db_error().map(|e| e.constraint()),
            Some(Some("lifecycle_consumers_consumer_check")),
            "{bad:?}"
        );
    }
}

/// Another tool's `schema_migrations` in the schema asked for (`--schema public` beside a
/// Rails or golang-migrate table): migrate, its dry run and every other command say that the
/// names collide instead of failing on a missing column (42703), and change nothing.
#[tokio::test]
async fn another_tools_migrations_table_is_named_as_a_collision() {
    let db = empty_db().await;
    let client = db.connect().await;
    client
        .batch_execute(
            "CREATE TABLE public.schema_migrations (version bigint PRIMARY KEY, dirty boolean);
             INSERT INTO public.schema_migrations VALUES (20240101, false);",
        )
        .await
        .unwrap();
    let mut client = db.connect().await;
    let err = migrate(&mut client, &Schema::new("public").unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ForeignMigrationsTable { .. }),
        "{err:?}"
    );
    let collision = "schema public already holds a schema_migrations table of another tool";
    for args in [&["migrate"][..], &["migrate", "--dry-run"], &["status"]] {
        let (code, out, err) = outbox_tests::process_kit::run_outbox(
            &[
                &["--database-url", db.url.as_str(), "--schema", "public"][..],
                args,
            ]
            .concat(),
        )
        .await;
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(err.contains(collision), "{args:?}: {err}");
        assert!(err.contains("the names collide"), "{args:?}: {err}");
        assert!(!err.contains("42703"), "{args:?}: {err}");
    }
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'lifecycle%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "nothing was created");
}
