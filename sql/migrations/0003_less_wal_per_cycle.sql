-- Less WAL per cycle (Acquire + Complete); bench/wal/breakdown.sh shows
-- where a cycle's WAL goes, record type by record type.
--
-- 1. The expiry index holds settled records only. A new record is
--    PROCESSING, and a PROCESSING record never expires before its lease
--    has run out (every function that grants or extends a lease keeps
--    expires_at at or after lease_expires_at), so the sweeper finds the rare
--    expired PROCESSING row through idempotency_keys_leases
--    (sql/functions/sweep.sql). An Acquire that creates a record then
--    writes two index entries instead of three, and a cycle four instead of
--    five.
--
-- IF NOT EXISTS: on a large table, build it beforehand with CREATE INDEX
-- CONCURRENTLY under this name and definition (a migration runs in one
-- transaction, where a plain build holds writes until it ends), and drop
-- idempotency_keys_expires_at afterwards with DROP INDEX CONCURRENTLY.
CREATE INDEX IF NOT EXISTS idempotency_keys_settled_expiry ON idempotency_keys (expires_at)
    WHERE status <> 'PROCESSING';
DROP INDEX IF EXISTS idempotency_keys_expires_at;

-- 2. Room on every page for the Complete of the records inserted there.
--    Every record is inserted once and updated by its Complete, which
--    writes a new version of the row; on a full page that version goes to
--    another page, and PostgreSQL first logs a row lock on the old one (a
--    Heap/LOCK record) before the update itself. With 30% of each page
--    left free by inserts, the new version stays on its page: no lock
--    record, a smaller update record. Applies to pages filled from now on;
--    a change of the catalog only.
ALTER TABLE idempotency_keys SET (fillfactor = 70);
