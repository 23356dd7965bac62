-- lifecycle-outbox schema, version 6: the event table loses its primary key on `id`.
--
-- Every index of the event table is paid twice per event: once by the writer's insert and once
-- more by the sequencer, whose UPDATE of `sequence` can never be HOT (`sequence` is indexed),
-- so the new row version gets an entry in every index. Nothing looks an event up by `id`:
-- readers go by `(project_id, sequence)`, operators by `(project_id, event_id)`, and the
-- sequencer reaches the rows it numbers by their physical address. `id` stays as the arrival
-- order of the sequencer's work list (the partial index on unsequenced rows), filled by its
-- identity, so dropping the key saves two index entries per event.
--
-- Logical decoding (Debezium and the like) needs a replica identity to describe updated and
-- deleted rows; the idempotency key `(project_id, event_id)` becomes it, in place of the
-- primary key it replaces.
ALTER TABLE {{schema}}.lifecycle_outbox
    REPLICA IDENTITY USING INDEX lifecycle_outbox_event_key;

ALTER TABLE {{schema}}.lifecycle_outbox
    DROP CONSTRAINT lifecycle_outbox_pkey;
