-- What an administrator last did to a record (the admin RPCs: ReleaseLease,
-- RetryNow, FailPermanently; DeleteRecord leaves no row to record it on,
-- only the server's log line), and the partial index that keeps the admin
-- summary cheap on a large table.
--
-- The columns have no default, so adding them rewrites nothing: on a table
-- of any size this is a change of the catalog only. The functions of
-- sql/functions/admin.sql are their only writers.
ALTER TABLE idempotency_keys
    -- 'RELEASE_LEASE', 'RETRY_NOW' or 'FAIL_PERMANENTLY'; NULL: never.
    ADD COLUMN admin_action text,
    -- Who: the credential's digest prefix and the operator's own name.
    ADD COLUMN admin_actor  text,
    -- Why, as the administrator wrote it.
    ADD COLUMN admin_reason text,
    -- When (database clock).
    ADD COLUMN admin_at     timestamptz;

-- The summary counts FAILED_PERMANENT records per tenant and scope from
-- this index alone (index-only scans), as it counts FAILED ones from
-- idempotency_keys_retries and PROCESSING ones from idempotency_keys_leases;
-- SUCCEEDED records, the bulk of a large table, are never counted one by
-- one (sql/functions/admin.sql says how). A row enters it only when it
-- becomes FAILED_PERMANENT, never on the Acquire/Complete hot path.
-- IF NOT EXISTS: on a large table, build it beforehand with CREATE INDEX
-- CONCURRENTLY under this name and definition (a migration runs in one
-- transaction, where a plain build holds writes until it ends).
CREATE INDEX IF NOT EXISTS idempotency_keys_failed_permanent ON idempotency_keys (tenant, scope)
    WHERE status = 'FAILED_PERMANENT';
