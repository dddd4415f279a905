-- A tenant's in-flight records, found by tenant and scope: Summarize
-- counts one tenant's PROCESSING records per scope through it, without
-- reading any other tenant's (through idempotency_keys_leases, which is
-- ordered by expiry alone, 100,000 PROCESSING records of another tenant
-- made one tenant's Summarize read all of them).
--
-- Partial, like idempotency_keys_leases: it holds only PROCESSING records,
-- as many as the work in flight; a record enters it when a lease is
-- granted (a new record, or a takeover) and leaves it when its Complete
-- writes the record's next version. Its cost: one more index entry per
-- lease granted, 83 WAL bytes per Acquire-and-Complete cycle
-- (bench/wal/breakdown.sh: 891 -> 974 bytes by default, 1,653 -> 1,737
-- with random keys, 50,000 records before and a checkpoint every 10,000
-- cycles). Without it, a scope of 200,000 records made its own tenant's
-- Summarize read them all, or the planner read every tenant's leases.
--
-- IF NOT EXISTS: on a large table, build it beforehand with CREATE INDEX
-- CONCURRENTLY under this name and definition (a migration runs in one
-- transaction, where a plain build holds writes until it ends).
CREATE INDEX IF NOT EXISTS idempotency_keys_processing
    ON idempotency_keys (tenant, scope, lease_expires_at)
    WHERE status = 'PROCESSING';
