-- The expiry index holds settled records only. A new record is PROCESSING,
-- and a PROCESSING record never expires before its lease has run out (every
-- function that grants or extends a lease keeps expires_at at or after
-- lease_expires_at), so the sweeper finds the rare expired PROCESSING row
-- through idempotency_keys_leases (sql/functions/sweep.sql). An Acquire that
-- creates a record then writes two index entries instead of three, and a
-- cycle (Acquire + Complete) four instead of five (docs/performance.md).
--
-- IF NOT EXISTS: on a large table, build it beforehand with CREATE INDEX
-- CONCURRENTLY under this name and definition (a migration runs in one
-- transaction, where a plain build holds writes until it ends), and drop
-- idempotency_keys_expires_at afterwards with DROP INDEX CONCURRENTLY.
CREATE INDEX IF NOT EXISTS idempotency_keys_settled_expiry ON idempotency_keys (expires_at)
    WHERE status <> 'PROCESSING';
DROP INDEX IF EXISTS idempotency_keys_expires_at;
