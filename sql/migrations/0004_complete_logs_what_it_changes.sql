-- The records table's columns in an order that lets a Complete log only
-- what it changes.
--
-- An UPDATE whose new row version stays on its page (fillfactor 70,
-- 0003_less_wal_per_cycle.sql) logs the new row less the bytes it shares
-- with the old one at its start and at its end. The baseline's order put
-- status fourth, so a successful Complete logged all but the key's three
-- columns again: the fingerprint, the lease token, the fencing token, the
-- attempts and most timestamps, about 310 bytes. Here the columns a
-- Complete never changes come first, those it changes after them (the
-- fixed-width ones first, so that they need less padding) and the result
-- last: a successful Complete logs about 175 bytes, and a cycle's WAL is
-- about a sixth smaller (bench/wal/breakdown.sh). The key's columns stay
-- first, where a person reading the table looks for them. Every reader
-- and writer names its columns, so both orders answer alike.
--
-- Only a table that nobody has used yet is rebuilt: an empty one that no
-- function depends on (a new database, where this runs before the
-- function files are applied; on a Citus coordinator, before the table is
-- distributed). A table already in use keeps its order: rebuilding it would
-- rewrite every row while holding every call, which no migration here
-- imposes. Such a database answers the same; only its Completes write more
-- WAL.
DO $$
DECLARE
    v_distributed boolean := false;
BEGIN
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                 WHERE logicalrelid = ''idempotency_keys''::regclass)'
           INTO v_distributed;
    END IF;
    IF v_distributed OR EXISTS (SELECT 1 FROM idempotency_keys) THEN
        RAISE NOTICE 'idempotency_keys is in use: its columns keep their order';
        RETURN;
    END IF;
    BEGIN
        DROP TABLE idempotency_keys RESTRICT;
    EXCEPTION WHEN dependent_objects_still_exist THEN
        RAISE NOTICE 'objects depend on idempotency_keys: its columns keep their order';
        RETURN;
    END;
    -- 0001_baseline.sql and 0002_admin.sql say what each column holds.
    CREATE TABLE idempotency_keys (
        -- Never changed by a Complete.
        tenant              text        NOT NULL,
        scope               text        NOT NULL,
        idempotency_key     text        NOT NULL,
        fingerprint         text        NOT NULL,
        created_at          timestamptz NOT NULL,
        retention           interval    NOT NULL,
        max_attempts        integer     NOT NULL,
        checkpoint          bytea       NOT NULL DEFAULT '',
        -- Changed by an Acquire that grants a new lease (and the recovery
        -- feed's offer), never by a Complete.
        fencing_token       bigint      NOT NULL DEFAULT nextval('idempotency_fencing'),
        attempt_count       integer     NOT NULL,
        lease_token         uuid        NOT NULL,
        lease_request_id    text        NOT NULL,
        watch_until         timestamptz,
        offered_until       timestamptz,
        offered_to          uuid,
        -- Changed by a Complete.
        lease_expires_at    timestamptz,
        next_retry_at       timestamptz,
        last_error_at       timestamptz,
        completed_at        timestamptz,
        updated_at          timestamptz NOT NULL,
        expires_at          timestamptz NOT NULL,
        result_status_code  integer     NOT NULL DEFAULT 0,
        status              text        NOT NULL,
        lease_outcome       text,
        last_error          text        NOT NULL DEFAULT '',
        result_content_type text        NOT NULL DEFAULT '',
        result_ref          text        NOT NULL DEFAULT '',
        result              bytea,
        -- Changed by the admin calls alone.
        admin_action        text,
        admin_actor         text,
        admin_reason        text,
        admin_at            timestamptz,
        PRIMARY KEY (tenant, scope, idempotency_key)
    ) WITH (fillfactor = 70);
    -- The indexes of 0001_baseline.sql, 0002_admin.sql and
    -- 0003_less_wal_per_cycle.sql, under their names.
    CREATE INDEX idempotency_keys_leases ON idempotency_keys (lease_expires_at)
        WHERE status = 'PROCESSING';
    CREATE INDEX idempotency_keys_retries ON idempotency_keys (tenant, scope, next_retry_at)
        WHERE status = 'FAILED';
    CREATE INDEX idempotency_keys_offered_to ON idempotency_keys (offered_to)
        WHERE offered_to IS NOT NULL;
    CREATE INDEX idempotency_keys_failed_permanent ON idempotency_keys (tenant, scope)
        WHERE status = 'FAILED_PERMANENT';
    CREATE INDEX idempotency_keys_settled_expiry ON idempotency_keys (expires_at)
        WHERE status <> 'PROCESSING';
END $$;
