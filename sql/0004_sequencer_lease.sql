-- Which process runs the sequencer. Every process that may sequence (consumers with their
-- embedded sequencer, `outbox sequence --every`) competes for this one row; only the holder
-- ticks, the others look at the row now and then. A lease with a generation, not a session
-- advisory lock, so the election works through transaction-mode poolers and survives a
-- reconnect. It is an efficiency measure only: every tick still takes the transaction-level
-- sequencer lock, so two processes that both believe they lead (a paused leader waking up
-- after its lease was taken over) still number one at a time, gap-free.
CREATE TABLE {{schema}}.lifecycle_sequencer_lease (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    owner       text,
    generation  bigint      NOT NULL DEFAULT 0 CHECK (generation >= 0),
    expires_at  timestamptz,
    renewed_at  timestamptz,
    CONSTRAINT lifecycle_sequencer_lease_held_check CHECK ((owner IS NULL) = (expires_at IS NULL))
);

INSERT INTO {{schema}}.lifecycle_sequencer_lease (singleton) VALUES (true);
