-- idempotency_complete_in_tx: the holder of p_token stores its result
-- inside its own open transaction, beside the writes that are its work
-- (docs/in-transaction.md). The application calls it on its own
-- connection, after its writes and before its COMMIT, so that the writes
-- and the record's SUCCEEDED commit or roll back together.
--
-- The decision is idempotency_complete's with outcome SUCCESS (it runs
-- that function, so it takes the same row lock and makes the same
-- checks); every answer but OK raises, so that the caller's transaction,
-- its work included, cannot commit:
--
-- SQLSTATE | DETAIL            | when
-- IK001    | RECORD_NOT_FOUND  | no row for this tenant, scope and key, or past
--          |                   | expires_at (the message names the tenant)
-- IK002    | LEASE_LOST        | p_token is not the latest lease's token: another
--          |                   | holder took over (fencing by the row lock)
-- IK003    | ALREADY_COMPLETED | the holder already completed with a failure or
--          |                   | a release
-- 22023    | the argument      | an argument is NULL or over its limit (as
--          |                   | Complete's: content type 255 characters, result
--          |                   | reference 2048, result c_max_result_bytes:
--          |                   | 1 MiB, the server's default
--          |                   | --max-result-bytes; this function cannot know
--          |                   | the flag a server was started with)
-- 0A000    |                   | the transaction is not READ COMMITTED (under
--          |                   | REPEATABLE READ or SERIALIZABLE its snapshot
--          |                   | may predate the caller's own Acquire or
--          |                   | heartbeat, refused as a lost record or a
--          |                   | serialization failure that a retry repeats)
-- 0A000    |                   | the records table is distributed by Citus
--
-- OK returns the record's status, fencing token, completion and expiry. A
-- repeated call with the same token after SUCCESS is OK and changes
-- nothing. The "this row changed" NOTIFY of a watched record is sent by
-- PostgreSQL at COMMIT, and not at all on ROLLBACK: waiters on every
-- replica wake when the result is really there.
--
-- The clock offset is 0: tests move the server's clock, not this one.
--
-- Privileges: the function is SECURITY DEFINER and nobody but its owner
-- (the role that ran `migrate`) may execute it until granted
-- (`GRANT EXECUTE ON FUNCTION <schema>.idempotency_complete_in_tx(text, text,
-- text, uuid, bytea, text, integer, text) TO app_role`); the application's
-- role needs no privilege on the records table, so it cannot read or
-- rewrite any tenant's records. The lease token is the capability: only
-- the caller holding the token of a key's latest lease can complete it.
--
-- search_path is pinned, after the definition below, to the schema the
-- function was created in followed by pg_temp (`migrate` run with
-- `options=-c search_path=...` in its URL installs the schema elsewhere than
-- `public`): an application whose session does not list that schema calls
-- it qualified and it still finds the records table and
-- idempotency_complete, and no temporary table or function of the caller's
-- session can stand in for ours (pg_temp is searched last, not first).
CREATE OR REPLACE FUNCTION idempotency_complete_in_tx(
    p_tenant       text,
    p_scope        text,
    p_key          text,
    p_token        uuid,
    p_result       bytea,
    p_content_type text,
    p_status_code  integer,
    p_result_ref   text
)
RETURNS TABLE (status text, fencing_token bigint, completed_at timestamptz, expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
AS $$
DECLARE
    c_max_result_bytes constant integer := 1048576;
    v_outcome     text;
    v_distributed boolean := false;
    v_null        text;
BEGIN
    IF p_tenant IS NULL OR p_scope IS NULL OR p_key IS NULL OR p_token IS NULL
       OR p_result IS NULL OR p_content_type IS NULL OR p_status_code IS NULL
       OR p_result_ref IS NULL THEN
        v_null := CASE WHEN p_tenant IS NULL THEN 'p_tenant'
                       WHEN p_scope IS NULL THEN 'p_scope'
                       WHEN p_key IS NULL THEN 'p_key'
                       WHEN p_token IS NULL THEN 'p_token'
                       WHEN p_result IS NULL THEN 'p_result'
                       WHEN p_content_type IS NULL THEN 'p_content_type'
                       WHEN p_status_code IS NULL THEN 'p_status_code'
                       ELSE 'p_result_ref' END;
        RAISE EXCEPTION 'idempotency_complete_in_tx: % must not be NULL', v_null
            USING ERRCODE = 'invalid_parameter_value', DETAIL = v_null;
    END IF;
    IF char_length(p_content_type) > 255 THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: p_content_type must be at most 255 characters, got %',
            char_length(p_content_type)
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'p_content_type';
    END IF;
    IF char_length(p_result_ref) > 2048 THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: p_result_ref must be at most 2048 characters, got %',
            char_length(p_result_ref)
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'p_result_ref';
    END IF;
    IF octet_length(p_result) > c_max_result_bytes THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: p_result is % bytes, more than the limit of % bytes; store it elsewhere and pass p_result_ref',
            octet_length(p_result), c_max_result_bytes
            USING ERRCODE = 'invalid_parameter_value', DETAIL = 'p_result';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: the transaction''s isolation level is %; READ COMMITTED is required',
            upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Run the work and the completion in a READ COMMITTED transaction (PostgreSQL''s default).';
    END IF;
    IF to_regclass('pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition
                                 WHERE logicalrelid = ''idempotency_keys''::regclass)'
           INTO v_distributed;
    END IF;
    IF v_distributed THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: the records table is distributed by Citus; complete in the application''s transaction only on plain PostgreSQL'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Use Complete (gRPC or HTTP) on Citus.';
    END IF;

    SELECT c.outcome, (c.rec).status, (c.rec).fencing_token, (c.rec).completed_at,
           (c.rec).expires_at
      INTO v_outcome, status, fencing_token, completed_at, expires_at
      FROM idempotency_complete(p_tenant, p_scope, p_key, p_token, 'SUCCESS',
                                p_result, p_content_type, p_status_code, p_result_ref,
                                '', false, NULL, 0, 0, 0) c;
    IF v_outcome = 'NOT_FOUND' THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: no record for this key under tenant "%" (a tenant other than the one the coordinator files the caller''s records under, or the record expired, or was never acquired)',
            p_tenant
            USING ERRCODE = 'IK001', DETAIL = 'RECORD_NOT_FOUND';
    ELSIF v_outcome = 'LEASE_LOST' THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: the lease is no longer this caller''s: another holder took over; nothing of this transaction may commit'
            USING ERRCODE = 'IK002', DETAIL = 'LEASE_LOST';
    ELSIF v_outcome = 'ALREADY_COMPLETED' THEN
        RAISE EXCEPTION 'idempotency_complete_in_tx: this lease was already completed with another outcome'
            USING ERRCODE = 'IK003', DETAIL = 'ALREADY_COMPLETED';
    END IF;
    RETURN NEXT;
END;
$$;

DO $pin$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION %1$I.idempotency_complete_in_tx(text, text, text, uuid, bytea, text, integer, text)
             SET search_path = %1$I, pg_temp',
        current_schema());
    EXECUTE format(
        'REVOKE EXECUTE ON FUNCTION %I.idempotency_complete_in_tx(text, text, text, uuid, bytea, text, integer, text)
             FROM PUBLIC',
        current_schema());
END;
$pin$;
