-- On a Citus coordinator, after the function files: the batch, made
-- delegable. idempotency_call_batch takes arrays of keys, which Citus cannot
-- route; idempotency_call_batch_at adds a scalar routing argument, p_route
-- (a key of the batch), and is distributed by it, colocated with
-- idempotency_keys. Called on the node holding p_route's shard (the
-- server sends each node's share of a batch straight there, src/store/shards.rs)
-- it runs there as on one PostgreSQL; called on another node, Citus sends
-- it whole to that node.
--
-- Its statements run on the shards' own tables. Citus plans and executes
-- every statement on a distributed table itself (a distributed plan, its
-- shard pruned per call, a local plan looked up, its bookkeeping per
-- statement) even where it caches the shard's plan, and that was most of a
-- worker's CPU per call (docs/scaling.md). So for each key whose shard
-- this node holds, the batch reads and writes that shard's table
-- (idempotency_keys_<shard id>) through statements prepared once per
-- session (idempotency_shard_statements): plain PostgreSQL, one cached
-- plan each. The guard that keeps this correct while shards move
-- (idempotency_local_shards): the batch takes the lock Citus's own writes
-- take on each of its shards' metadata (ShareLock, the lock a shard move
-- or split takes exclusively before it switches the shard over), and only
-- then reads whether this node's group holds the shard's placement. A
-- move waits for the batch's commit (the writes on the old placement are
-- copied by the move's replication like any other); a batch behind a
-- finished move reads that the shard is elsewhere. A key whose shard is
-- not here (the server's map of shards was stale, or the call came
-- through the coordinator node) runs on the distributed table as before:
-- Citus routes it, slower, never wrong.
--
-- The decisions are idempotency_call_batch's on one PostgreSQL
-- (sql/functions/batches.sql) for keys that cannot be created together: a
-- new key is created by idempotency_create_at's INSERT, a live record with
-- a final answer is answered from the loop's read, a holder's success is
-- recorded by idempotency_succeed_at's UPDATE (its conditions and clock
-- are the batch's), every other Acquire runs idempotency_acquire and every
-- other Complete idempotency_complete (idempotency_call_alone). A new
-- key's token and fencing token are drawn into variables before its INSERT
-- (on the distributed table Citus caches no plan of a statement with a
-- volatile call inside). The distributed table's success UPDATE sets
-- expires_at to the clock plus the row's retention as
-- to_timestamp(v_epoch + extract(epoch FROM k.retention)), v_epoch the
-- clock in seconds: `v_now + k.retention` is a STABLE operator over a
-- column, which Citus refuses in an UPDATE of a distributed table.
-- The same instant: retention is whole milliseconds (the server sends
-- milliseconds), and to_timestamp rounds to the microsecond. The shard's
-- UPDATE is PostgreSQL's and says `v_now + k.retention`.
--
-- The deadline check is inside: Citus delegates a call with no subquery
-- alongside it (a parameter in one is sent as `$0`, which the node does not
-- have), and a check per row would read the clock once per call. It runs
-- after the batch, before the commit, as the single calls' does.
--
-- idempotency_acquire_batch_at and idempotency_complete_batch_at, the
-- routed batch of one kind, are kept for servers of the previous release
-- during a rolling upgrade.
--
-- PL/pgSQL: a LANGUAGE sql set-returning function is inlined into the
-- caller's statement before Citus sees a function call to delegate.
--
-- Applied at every migration of a Citus database (src/store/migrate.rs),
-- after sql/citus/delegate_functions.sql. CREATE OR REPLACE keeps a
-- function delegated; each is distributed where it is not yet.

-- The shard of each key of p_key, in order, where this node holds it, else
-- NULL; every shard's metadata is locked (ShareLock, in shard order) until
-- the transaction ends, so that none moves before it commits.
CREATE OR REPLACE FUNCTION idempotency_local_shards(p_key text[])
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_shards bigint[];
    v_here   bigint[];
BEGIN
    SELECT array_agg(get_shard_id_for_distribution_column('idempotency_keys', u.k) ORDER BY u.o)
      INTO v_shards
      FROM unnest(p_key) WITH ORDINALITY u(k, o);
    IF v_shards IS NULL THEN
        RETURN v_shards;
    END IF;
    -- 5: ShareLock, as Citus's executor takes it for a write of the shard.
    PERFORM lock_shard_metadata(5, ARRAY(SELECT DISTINCT s FROM unnest(v_shards) s ORDER BY s));
    SELECT array_agg(p.shardid)
      INTO v_here
      FROM pg_dist_placement p
     WHERE p.shardid = ANY (v_shards) AND p.shardstate = 1
       AND p.groupid = (SELECT groupid FROM pg_dist_local_group);
    RETURN ARRAY(SELECT CASE WHEN u.s = ANY (v_here) THEN u.s END
                   FROM unnest(v_shards) WITH ORDINALITY u(s, o) ORDER BY u.o);
END;
$$;

-- Prepares, once per session, the batch's three statements on the table of
-- each shard of p_shards (NULLs skipped): idempotency_sel_<shard>,
-- idempotency_ins_<shard> and idempotency_upd_<shard>, the read, the new
-- record and the success of the loop below. The session's setting
-- idempotency.prepared_shards lists the shards whose statements it has
-- (`,<shard>,` each), so a batch reads no more than that; a shard not
-- listed is looked up in pg_prepared_statements, name by name, since a
-- prepared statement outlives a rolled-back transaction and the setting
-- does not.
CREATE OR REPLACE FUNCTION idempotency_shard_statements(p_shards bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_listed text := coalesce(current_setting('idempotency.prepared_shards', true), '');
    v_have   text[];
    v_shard  bigint;
    v_table  text;
BEGIN
    FOR v_shard IN SELECT DISTINCT s FROM unnest(p_shards) s WHERE s IS NOT NULL LOOP
        CONTINUE WHEN strpos(v_listed, ',' || v_shard || ',') > 0;
        SELECT array_agg(name) INTO v_have
          FROM pg_prepared_statements
         WHERE name IN ('idempotency_sel_' || v_shard, 'idempotency_ins_' || v_shard,
                        'idempotency_upd_' || v_shard);
        v_have := coalesce(v_have, '{}');
        v_table := 'idempotency_keys_' || v_shard;
        IF NOT 'idempotency_ins_' || v_shard = ANY (v_have) THEN
            EXECUTE format(
                'PREPARE %I (text, text, text, text, integer, interval, uuid, text,'
                '            timestamptz, bigint, timestamptz, timestamptz) AS '
                'INSERT INTO %I AS k ('
                '    tenant, scope, idempotency_key, status, fingerprint,'
                '    attempt_count, max_attempts, retention,'
                '    lease_token, lease_request_id, lease_expires_at, fencing_token,'
                '    created_at, updated_at, expires_at)'
                ' VALUES ($1, $2, $3, ''PROCESSING'', $4, 1, $5, $6, $7, $8, $9, $10,'
                '         $11, $11, $12)'
                ' ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING RETURNING *',
                'idempotency_ins_' || v_shard, v_table);
        END IF;
        IF NOT 'idempotency_upd_' || v_shard = ANY (v_have) THEN
            EXECUTE format(
                'PREPARE %I (text, text, text, uuid, bytea, text, integer, text, timestamptz) AS '
                'UPDATE %I AS k SET'
                '    status = ''SUCCEEDED'', lease_outcome = ''SUCCESS'','
                '    lease_expires_at = NULL, next_retry_at = NULL,'
                '    result = $5, result_content_type = $6,'
                '    result_status_code = $7, result_ref = $8,'
                '    completed_at = $9, updated_at = $9, expires_at = $9 + k.retention'
                ' WHERE k.tenant = $1 AND k.scope = $2 AND k.idempotency_key = $3'
                '   AND k.lease_token = $4 AND k.lease_outcome IS NULL'
                '   AND k.expires_at > $9 AND k.updated_at <= $9'
                ' RETURNING *',
                'idempotency_upd_' || v_shard, v_table);
        END IF;
        IF NOT 'idempotency_sel_' || v_shard = ANY (v_have) THEN
            EXECUTE format(
                'PREPARE %I (text, text, text) AS SELECT * FROM %I AS k'
                ' WHERE k.tenant = $1 AND k.scope = $2 AND k.idempotency_key = $3',
                'idempotency_sel_' || v_shard, v_table);
        END IF;
        v_listed := coalesce(nullif(v_listed, ''), ',') || v_shard || ',';
        PERFORM set_config('idempotency.prepared_shards', v_listed, false);
    END LOOP;
END;
$$;

-- A new key's record, in the table of p_shard where this node holds the
-- key's shard (the shard's prepared statement), else in the distributed
-- table by idempotency_create_alone, as of p_now (the clock read after the
-- batch found no row): the record, or NULL when another transaction
-- created it meanwhile and idempotency_acquire must decide. The token and
-- fencing token are drawn here and sent to the shard's statement as values
-- (above). Like every step below, it runs within idempotency_call_batch_at,
-- whose plan_cache_mode holds here too.
CREATE OR REPLACE FUNCTION idempotency_create_at(
    p_shard        bigint,
    p_tenant       text,
    p_scope        text,
    p_key          text,
    p_fingerprint  text,
    p_request_id   text,
    p_lease_ms     bigint,
    p_max_attempts integer,
    p_retention_ms bigint,
    p_now          timestamptz
)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    r           idempotency_keys;
    v_retention interval := p_retention_ms * interval '1 millisecond';
    v_lease     interval := p_lease_ms * interval '1 millisecond';
BEGIN
    IF p_shard IS NULL THEN
        RETURN idempotency_create_alone(p_tenant, p_scope, p_key, p_fingerprint,
                                        p_request_id, p_lease_ms, p_max_attempts,
                                        p_retention_ms, p_now);
    END IF;
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L)',
                   'idempotency_ins_' || p_shard, p_tenant, p_scope, p_key,
                   p_fingerprint, p_max_attempts, v_retention, gen_random_uuid(),
                   p_request_id, p_now + v_lease, nextval('idempotency_fencing'), p_now,
                   p_now + greatest(v_retention, v_lease)) INTO r;
    RETURN r;
END;
$$;

-- A holder's success, in the table of p_shard where this node holds the
-- key's shard, else in the distributed table (expires_at there from the
-- clock in seconds since the epoch, v_epoch: above): the record as
-- updated, or NULL when the conditions do not hold and
-- idempotency_complete must decide.
CREATE OR REPLACE FUNCTION idempotency_succeed_at(
    p_shard           bigint,
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_token           uuid,
    p_result          bytea,
    p_content_type    text,
    p_status_code     integer,
    p_result_ref      text,
    p_clock_offset_ms bigint
)
RETURNS idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    v_epoch numeric;
    r       idempotency_keys;
BEGIN
    IF p_shard IS NOT NULL THEN
        EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L, %L)',
                       'idempotency_upd_' || p_shard, p_tenant, p_scope, p_key,
                       p_token, p_result, p_content_type, p_status_code,
                       p_result_ref, v_now) INTO r;
    ELSE
        v_epoch := extract(epoch FROM v_now);
        UPDATE idempotency_keys k SET
            status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
            lease_expires_at = NULL, next_retry_at = NULL,
            result = p_result, result_content_type = p_content_type,
            result_status_code = p_status_code, result_ref = p_result_ref,
            completed_at = v_now, updated_at = v_now,
            expires_at = to_timestamp(v_epoch + extract(epoch FROM k.retention))
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.lease_token = p_token AND k.lease_outcome IS NULL
           AND k.expires_at > v_now AND k.updated_at <= v_now
        RETURNING * INTO r;
    END IF;
    IF r.watch_until > v_now THEN
        PERFORM idempotency_notify_if_watched(r, v_now);
    END IF;
    RETURN r;
END;
$$;

-- The batch, routed: the calls in order, as idempotency_call_batch decides
-- them (sql/functions/batches.sql) with keys not together. The steps it
-- names: idempotency_local_shards and idempotency_shard_statements (once a
-- batch: where each key's shard is, and that shard's statements),
-- idempotency_create_at and idempotency_succeed_at (a new key, a holder's
-- success), and idempotency_call_alone (every other call: its single-call
-- function). The loop itself reads each Acquire's row and answers what
-- needs no lock. Call i's key's shard where this node holds it (else NULL:
-- the distributed table) and its key are copied out of the arrays into
-- plain variables: each is then a parameter of the cached plan.
--
-- SET plan_cache_mode: every statement's plan generic from its first run,
-- in this function and in the steps it calls. Each is on one row by
-- primary key, where the custom plans PostgreSQL would otherwise make for
-- a prepared statement's first five runs in a session (per shard, per
-- session: most runs, for a while) cost planning and gain nothing.
CREATE OR REPLACE FUNCTION idempotency_call_batch_at(
    p_route           text,
    p_acquire         boolean[],
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, outcome text,
               rec idempotency_keys)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    r        idempotency_keys;
    v_now    timestamptz;
    v_shards bigint[];
    v_shard  bigint;
    v_tenant text;
    v_scope  text;
    v_key    text;
BEGIN
    v_shards := idempotency_local_shards(p_key);
    PERFORM idempotency_shard_statements(v_shards);
    FOR i IN 1 .. coalesce(array_length(p_key, 1), 0) LOOP
        ord := i; decision := NULL; retry_after_ms := NULL; outcome := NULL;
        v_shard := v_shards[i]; v_tenant := p_tenant[i]; v_scope := p_scope[i]; v_key := p_key[i];
        IF NOT p_acquire[i] THEN
            IF p_outcome[i] = 'SUCCESS' THEN
                rec := idempotency_succeed_at(v_shard, v_tenant, v_scope, v_key, p_token[i],
                                              p_result[i], p_content_type[i], p_status_code[i],
                                              p_result_ref[i], p_clock_offset_ms);
                outcome := CASE WHEN rec.idempotency_key IS NOT NULL THEN 'OK' END;
            END IF;
        ELSE
            IF v_shard IS NULL THEN
                SELECT * INTO r FROM idempotency_keys k
                 WHERE k.tenant = v_tenant AND k.scope = v_scope AND k.idempotency_key = v_key;
            ELSE
                EXECUTE format('EXECUTE %I(%L, %L, %L)', 'idempotency_sel_' || v_shard,
                               v_tenant, v_scope, v_key) INTO r;
            END IF;
            v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
            IF r.idempotency_key IS NULL THEN
                rec := idempotency_create_at(v_shard, v_tenant, v_scope, v_key, p_fingerprint[i],
                                             p_request_id[i], p_lease_ms[i], p_max_attempts[i],
                                             p_retention_ms[i], v_now);
                decision := CASE WHEN rec.idempotency_key IS NOT NULL THEN 'PROCEED' END;
            ELSIF r.expires_at > v_now THEN
                decision := idempotency_final_decision(r, p_fingerprint[i]);
                rec := r;
            END IF;
        END IF;
        -- Answered here, or else by the call's single-call function.
        IF decision IS NOT NULL OR outcome IS NOT NULL THEN
            RETURN NEXT;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT * FROM idempotency_call_alone(
            i, '{}', p_acquire, p_tenant, p_scope, p_key, p_fingerprint, p_request_id, p_lease_ms,
            p_max_attempts, p_retention_ms, p_watch_ms, p_token, p_outcome, p_result,
            p_content_type, p_status_code, p_result_ref, p_error, p_permanent,
            p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms, p_clock_offset_ms);
    END LOOP;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_acquire_batch_at(
    p_route           text,
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_fingerprint     text[],
    p_request_id      text[],
    p_lease_ms        bigint[],
    p_max_attempts    integer[],
    p_retention_ms    bigint[],
    p_watch_ms        bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT b.ord, b.decision, b.retry_after_ms, b.rec
          FROM idempotency_call_batch(array_fill(true, ARRAY[cardinality(p_key)]),
                                      p_tenant, p_scope, p_key, p_fingerprint, p_request_id,
                                      p_lease_ms, p_max_attempts, p_retention_ms, p_watch_ms,
                                      NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                      NULL, NULL, true, p_clock_offset_ms) b;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

CREATE OR REPLACE FUNCTION idempotency_complete_batch_at(
    p_route           text,
    p_tenant          text[],
    p_scope           text[],
    p_key             text[],
    p_token           uuid[],
    p_outcome         text[],
    p_result          bytea[],
    p_content_type    text[],
    p_status_code     integer[],
    p_result_ref      text[],
    p_error           text[],
    p_permanent       boolean[],
    p_retry_after_ms  bigint[],
    p_backoff_base_ms bigint[],
    p_backoff_cap_ms  bigint[],
    p_clock_offset_ms bigint,
    p_deadline        timestamptz
)
RETURNS TABLE (ord integer, outcome text, rec idempotency_keys)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
        SELECT b.ord, b.outcome, b.rec
          FROM idempotency_call_batch(array_fill(false, ARRAY[cardinality(p_key)]),
                                      p_tenant, p_scope, p_key, NULL, NULL, NULL, NULL, NULL,
                                      NULL, p_token, p_outcome, p_result, p_content_type,
                                      p_status_code, p_result_ref, p_error, p_permanent,
                                      p_retry_after_ms, p_backoff_base_ms, p_backoff_cap_ms,
                                      true, p_clock_offset_ms) b;
    PERFORM idempotency_in_time(p_deadline, p_clock_offset_ms);
END;
$$;

DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.proname IN ('idempotency_call_batch_at', 'idempotency_acquire_batch_at',
                             'idempotency_complete_batch_at')
           AND p.pronamespace = (SELECT relnamespace FROM pg_class
                                  WHERE oid = 'idempotency_keys'::regclass)
           AND NOT EXISTS (SELECT FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(f, 'p_route',
                                       colocate_with := 'idempotency_keys');
    END LOOP;
END
$$;
