-- Repeatable: flow control (docs/ARCHITECTURE.md, "Concurrency keys and rate limits").
-- A step node is admitted (leased) only when its concurrency key has a free slot and its
-- rate limit a token. Admission runs where nodes are leased, claim_due_nodes and hand_over,
-- inside their transaction: the count of a key's holders is read under the key's
-- advisory lock, a bucket under its row lock, both taken in key order.

-- Keys ------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.key_template_roots()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['data', 'config', 'instance_id'] $$;

COMMENT ON FUNCTION orch8.key_template_roots() IS
'The roots a {{ expr }} placeholder in a concurrency_key may start with: data, config '
'(the instance''s context) and instance_id. A key is rendered in SQL when its node is '
'created (render_key), so it reads nothing a step produces.';

CREATE OR REPLACE FUNCTION orch8.render_key(
    p_template text, p_context jsonb, p_instance_id uuid
)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_match text [];
    v_parts text [];
    v_value jsonb;
    v_text text;
    v_out text := '';
    v_rest text := p_template;
    v_at integer;
BEGIN
    IF p_template IS NULL THEN
        RETURN NULL;
    END IF;
    -- placeholders one at a time, left to right: a rendered value is never rendered again
    LOOP
        v_match := regexp_match(v_rest, orch8.template_placeholder_pattern());
        EXIT WHEN v_match IS NULL;
        v_at := strpos(v_rest, '{{' || v_match[1] || '}}');
        v_parts := regexp_match(btrim(v_match[1], E' \t\r\n'),
                                orch8.template_expression_pattern(orch8.key_template_roots()));
        IF v_parts IS NULL THEN
            v_text := '';  -- the validator refuses it; a key never fails a step
        ELSIF v_parts[1] = 'instance_id' THEN
            v_text := p_instance_id::text;
        ELSE
            v_value := p_context -> v_parts[1]
                       #> coalesce(string_to_array(nullif(substr(v_parts[2], 2), ''), '.'), '{}');
            v_text := CASE WHEN v_value IS NULL OR v_value = 'null' THEN v_parts[3]
                           WHEN jsonb_typeof(v_value) = 'string' THEN v_value #>> '{}'
                           ELSE v_value::text END;
        END IF;
        v_out := v_out || substr(v_rest, 1, v_at - 1) || coalesce(v_text, '');
        v_rest := substr(v_rest, v_at + char_length(v_match[1]) + 4);
    END LOOP;
    -- a key longer than an index entry allows is cut: instances sharing the start of a
    -- very long key are then limited together (more strictly, never less)
    RETURN left(v_out || v_rest, 500);
END
$$;

COMMENT ON FUNCTION orch8.render_key(text, jsonb, uuid) IS
'A concurrency key rendered: each {{ data.x }}, {{ config.x }} or {{ instance_id }} '
'replaced by its value (a string as is, anything else as JSON text); a missing value takes '
'its | ''fallback'', else renders empty, so the instances that lack it share one key and '
'are limited together. At most 500 characters.';

-- Admission -----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.rate_limit_tokens(p_bucket orch8.rate_limits)
RETURNS double precision
LANGUAGE sql
STABLE
AS $$
    SELECT least(
        p_bucket.burst::double precision,
        p_bucket.tokens + greatest(extract(EPOCH FROM orch8.now() - p_bucket.refilled_at), 0)
        * 1000 * p_bucket.rate / p_bucket.per_ms
    )
$$;

COMMENT ON FUNCTION orch8.rate_limit_tokens(orch8.rate_limits) IS
'The tokens a bucket holds at orch8.now(): what it held at refilled_at, refilled at rate '
'per per_ms for the time since, at most burst. The one refill rule (take_rate_tokens, '
'set_rate_limit and rate_limit_status read it).';

CREATE OR REPLACE FUNCTION orch8.take_rate_tokens(
    p_tenant_id text, p_key text, p_wanted integer
)
RETURNS TABLE (granted integer, first_wait_ms double precision, ms_per_token double precision)
LANGUAGE plpgsql
AS $$
DECLARE
    v_bucket orch8.rate_limits;
    v_available double precision;
    v_granted integer;
BEGIN
    SELECT * INTO v_bucket FROM orch8.rate_limits AS r
    WHERE r.tenant_id = p_tenant_id AND r.key = p_key
    FOR UPDATE;
    IF v_bucket.key IS NULL THEN
        RETURN QUERY SELECT 0, NULL::double precision, NULL::double precision;
        RETURN;
    END IF;
    v_available := orch8.rate_limit_tokens(v_bucket);
    v_granted := least(p_wanted, floor(v_available)::integer);
    UPDATE orch8.rate_limits AS r
    SET tokens = v_available - v_granted, refilled_at = orch8.now(),
        admitted = r.admitted + v_granted, deferred = r.deferred + (p_wanted - v_granted)
    WHERE r.tenant_id = p_tenant_id AND r.key = p_key;
    RETURN QUERY SELECT v_granted,
        (1 - (v_available - v_granted)) * v_bucket.per_ms / v_bucket.rate,
        v_bucket.per_ms::double precision / v_bucket.rate;
END
$$;

COMMENT ON FUNCTION orch8.take_rate_tokens(text, text, integer) IS
'Take up to p_wanted tokens from the bucket (p_tenant_id, p_key) under its row lock, '
'after refilling it for the time passed: granted, the milliseconds until the next token '
'(first_wait_ms) and between tokens (ms_per_token), and the counters admitted and '
'deferred moved on. No bucket: granted 0 and NULL waits. Internal to admit_nodes.';

CREATE OR REPLACE FUNCTION orch8.admit_nodes(p_nodes orch8.execution_nodes[])
RETURNS orch8.execution_nodes[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_keep boolean [] := array_fill(true, ARRAY[cardinality(p_nodes)]);
    v_key record;
    v_over integer [];
    v_pos integer;
    v_take record;
BEGIN
    -- Concurrency first (a token is taken only by a node that will run). Three
    -- statements whatever the number of keys: the keys' advisory locks, taken in key
    -- order (one lock order for every claimer, so no deadlock); then, in a statement that
    -- starts after them (so it sees every lease that a claimer holding a lock before us
    -- committed), each key's leased nodes counted and the first (allowed - held) of its
    -- candidates, in the given order, kept.
    IF EXISTS (SELECT 1 FROM unnest(p_nodes) AS c WHERE c.concurrency_key IS NOT NULL) THEN
        PERFORM pg_advisory_xact_lock(k.lock)
        FROM (
            SELECT DISTINCT hashtextextended(
                'orch8.concurrency:' || c.tenant_id || ':' || c.concurrency_key, 0) AS lock
            FROM unnest(p_nodes) AS c
            WHERE c.concurrency_key IS NOT NULL
            ORDER BY 1
        ) AS k;
        WITH candidate AS (
            SELECT i, (p_nodes[i]).tenant_id AS tenant_id,
                   (p_nodes[i]).concurrency_key AS key,
                   row_number() OVER (PARTITION BY (p_nodes[i]).tenant_id,
                                                   (p_nodes[i]).concurrency_key
                                      ORDER BY i) AS rank,
                   min((p_nodes[i]).max_concurrency) OVER (
                       PARTITION BY (p_nodes[i]).tenant_id, (p_nodes[i]).concurrency_key
                   ) AS allowed
            FROM generate_subscripts(p_nodes, 1) AS i
            -- a node deciding on its worker task's failure holds its slot already
            WHERE (p_nodes[i]).concurrency_key IS NOT NULL
              AND (p_nodes[i]).worker_task_id IS NULL
        ),
        held AS (
            SELECT n.tenant_id, n.concurrency_key AS key, count(*) AS held
            FROM orch8.execution_nodes AS n
            WHERE (n.lease_token IS NOT NULL OR n.worker_task_id IS NOT NULL)
              AND n.concurrency_key IS NOT NULL
              AND (n.tenant_id, n.concurrency_key) IN (SELECT c.tenant_id, c.key
                                                       FROM candidate AS c)
            GROUP BY 1, 2
        )
        SELECT array_agg(c.i) INTO v_over
        FROM candidate AS c
        LEFT JOIN held AS h ON h.tenant_id = c.tenant_id AND h.key = c.key
        WHERE c.rank > c.allowed - coalesce(h.held, 0);
        FOREACH v_pos IN ARRAY coalesce(v_over, '{}') LOOP
            v_keep[v_pos] := false;
        END LOOP;
    END IF;
    -- Then rate limits, per key in key order: as many nodes as the bucket has tokens; the
    -- rest deferred, the k-th of them to when the k-th next token will be there
    FOR v_key IN
        SELECT (p_nodes[i]).tenant_id, (p_nodes[i]).rate_limit_key AS key,
               count(*)::integer AS wanted
        FROM generate_subscripts(p_nodes, 1) AS i
        WHERE (p_nodes[i]).rate_limit_key IS NOT NULL AND v_keep[i]
          -- a decision on a worker task's failure took its token when it was dispatched
          AND (p_nodes[i]).worker_task_id IS NULL
        GROUP BY 1, 2
        ORDER BY 1, 2
    LOOP
        SELECT * INTO v_take FROM orch8.take_rate_tokens(v_key.tenant_id, v_key.key,
                                                         v_key.wanted);
        UPDATE orch8.execution_nodes AS n
        SET deferred_by = CASE WHEN v_take.ms_per_token IS NULL THEN 'rate_limit_undefined'
                               ELSE 'rate_limit' END,
            deferrals = n.deferrals + 1,
            next_fire_at = orch8.now() + CASE
                -- no bucket: look again in 10 s (set_rate_limit makes them due at once)
                WHEN v_take.ms_per_token IS NULL THEN interval '10 seconds'
                ELSE (v_take.first_wait_ms + (s.rank - 1 - v_take.granted) * v_take.ms_per_token)
                     * interval '1 millisecond' END,
            updated_at = orch8.now()
        FROM (
            SELECT i, row_number() OVER (ORDER BY i) AS rank
            FROM generate_subscripts(p_nodes, 1) AS i
            WHERE (p_nodes[i]).tenant_id = v_key.tenant_id
              AND (p_nodes[i]).rate_limit_key = v_key.key AND v_keep[i]
              AND (p_nodes[i]).worker_task_id IS NULL
        ) AS s
        WHERE s.rank > v_take.granted
          AND n.tenant_id = (p_nodes[s.i]).tenant_id
          AND n.instance_id = (p_nodes[s.i]).instance_id
          AND n.path = (p_nodes[s.i]).path;
        FOR v_pos IN  -- the position of each node over the limit
            SELECT s.i FROM (
                SELECT i, row_number() OVER (ORDER BY i) AS rank
                FROM generate_subscripts(p_nodes, 1) AS i
                WHERE (p_nodes[i]).tenant_id = v_key.tenant_id
                  AND (p_nodes[i]).rate_limit_key = v_key.key AND v_keep[i]
                  AND (p_nodes[i]).worker_task_id IS NULL
            ) AS s
            WHERE s.rank > v_take.granted
        LOOP
            v_keep[v_pos] := false;
        END LOOP;
    END LOOP;
    RETURN ARRAY(SELECT p_nodes[i] FROM generate_subscripts(p_nodes, 1) AS i
                 WHERE v_keep[i] ORDER BY i);
END
$$;

COMMENT ON FUNCTION orch8.admit_nodes(orch8.execution_nodes[]) IS
'Of ready nodes about to be leased (locked by the caller), the ones that may be: per '
'concurrency key (every key''s transaction advisory lock taken first, sorted by hash) '
'as many as the '
'smallest max_concurrency among them leaves beside the key''s leased nodes of the tenant, '
'in the given order; '
'of those, per rate_limit_key (key order, take_rate_tokens) as many as the bucket has '
'tokens. A node over its rate limit is deferred (deferred_by rate_limit, deferrals + 1, '
'next_fire_at when its token will be); with no bucket for its key, deferred '
'rate_limit_undefined for 10 s. A node over its concurrency stays ready and due. '
'claim_due_nodes and hand_over call it.';

-- Rate limits, defined by people ---------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.set_rate_limit(
    p_tenant_id text,
    p_key text,
    p_rate integer,
    p_per text,
    p_burst integer DEFAULT NULL,
    p_actor text DEFAULT NULL
)
RETURNS orch8.rate_limits
LANGUAGE plpgsql
AS $$
DECLARE
    v_per_ms bigint := orch8.duration_ms(
        CASE WHEN p_per ~ '^[0-9]+$' THEN to_jsonb(p_per::numeric) ELSE to_jsonb(p_per) END);
    v_burst integer := coalesce(p_burst, p_rate);
    v_actor text;
    v_row orch8.rate_limits;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_domain(p_key, 'orch8.identifier', 'key');
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    IF p_rate IS NULL OR p_rate NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'rate must be an integer from 1 to 1000000 (tokens per period)'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'rate')::text;
    END IF;
    IF v_per_ms IS NULL OR v_per_ms < 1 THEN
        RAISE EXCEPTION 'per must be a duration such as 1s, 1m, 1h or milliseconds, '
                        'more than 0 and at most % days', orch8.limit_of('wait_ms') / 86400000
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'per')::text;
    END IF;
    IF v_burst NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'burst must be an integer from 1 to 1000000 (the most tokens held)'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'burst')::text;
    END IF;
    v_actor := orch8.attributed_actor(p_actor);
    -- a changed bucket keeps what it held (refilled at the old rate until now), capped
    INSERT INTO orch8.rate_limits AS r (
        tenant_id, key, rate, per_ms, burst, tokens, refilled_at, created_by, updated_by
    ) VALUES (
        p_tenant_id, p_key, p_rate, v_per_ms, v_burst, v_burst, orch8.now(), v_actor, v_actor
    )
    ON CONFLICT (tenant_id, key) DO UPDATE
    SET rate = excluded.rate, per_ms = excluded.per_ms, burst = excluded.burst,
        tokens = least(excluded.burst::double precision, orch8.rate_limit_tokens(r)),
        refilled_at = orch8.now(), updated_by = excluded.updated_by, updated_at = orch8.now()
    RETURNING r.* INTO v_row;
    -- what this key deferred looks again now, under the new limit (a raised limit lets
    -- it run sooner; a key just defined lets it run at all)
    UPDATE orch8.execution_nodes AS n SET next_fire_at = orch8.now()
    WHERE n.tenant_id = p_tenant_id AND n.rate_limit_key = p_key AND n.state = 'ready'
      AND n.deferred_by IS NOT NULL AND n.next_fire_at > orch8.now();
    PERFORM pg_notify('orch8_work', '');
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.set_rate_limit(text, text, integer, text, integer, text) IS
'Define or change the token bucket (p_tenant_id, p_key): p_rate tokens per p_per (a '
'duration: 1s, 1m, 1h, or milliseconds), holding at most p_burst (default p_rate). A new '
'bucket starts full; a changed one keeps its tokens (capped to the new burst). Steps '
'the key deferred (no token, or no bucket) become due at once, to be admitted under the '
'new limit. Bad input: O8008 with DETAIL '
'{field}. Returns the row; p_actor is recorded (created_by, updated_by).';

CREATE OR REPLACE VIEW orch8.rate_limit_status WITH (security_invoker = true) AS
SELECT
    r.tenant_id,
    r.key::text AS key,
    r.rate,
    r.per_ms,
    r.burst,
    orch8.rate_limit_tokens(r) AS tokens_now,
    r.admitted,
    r.deferred,
    (
        SELECT count(*) FROM orch8.execution_nodes AS n
        WHERE
            n.tenant_id = r.tenant_id AND n.rate_limit_key = r.key AND n.state = 'ready'
            AND n.deferred_by IS NOT NULL
    ) AS waiting,
    r.created_by,
    r.updated_by,
    r.created_at,
    r.updated_at
FROM orch8.rate_limits AS r;

COMMENT ON VIEW orch8.rate_limit_status IS
'Each rate limit with the tokens it holds now, its counters (admitted, deferred: times a '
'node found no token) and how many steps wait on it now (waiting).';

COMMENT ON COLUMN orch8.rate_limit_status.tenant_id IS 'The tenant whose steps the bucket limits.';

COMMENT ON COLUMN orch8.rate_limit_status.key IS
'The rate_limit_key steps name (rate_limits.key).';

COMMENT ON COLUMN orch8.rate_limit_status.rate IS 'Tokens added per per_ms.';

COMMENT ON COLUMN orch8.rate_limit_status.per_ms IS 'The refill period of rate, in milliseconds.';

COMMENT ON COLUMN orch8.rate_limit_status.burst IS 'The most tokens the bucket holds.';

COMMENT ON COLUMN orch8.rate_limit_status.tokens_now IS
'The tokens the bucket holds at orch8.now(): the stored count refilled for the time since '
'refilled_at, at most burst (orch8.rate_limit_tokens).';

COMMENT ON COLUMN orch8.rate_limit_status.admitted IS 'Leases that took a token, ever.';

COMMENT ON COLUMN orch8.rate_limit_status.deferred IS 'Times a node found no token, ever.';

COMMENT ON COLUMN orch8.rate_limit_status.waiting IS
'Ready nodes of the tenant with this key that admission is holding back now.';

COMMENT ON COLUMN orch8.rate_limit_status.created_by IS 'Who defined the bucket.';

COMMENT ON COLUMN orch8.rate_limit_status.updated_by IS 'Who last changed rate, per or burst.';

COMMENT ON COLUMN orch8.rate_limit_status.created_at IS 'When the bucket was defined.';

COMMENT ON COLUMN orch8.rate_limit_status.updated_at IS 'When rate, per or burst last changed.';

-- What the validator says -----------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.flow_control_problems(
    p_object jsonb, p_path text, p_roots text[]
)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
BEGIN
    IF p_object ? 'concurrency_key' THEN
        IF jsonb_typeof(p_object -> 'concurrency_key') <> 'string'
           OR char_length(p_object ->> 'concurrency_key') NOT BETWEEN 1 AND 200 THEN
            RETURN QUERY SELECT p_path || '.concurrency_key',
                'concurrency_key must be a string of 1 to 200 characters (with {{ }} templates '
                'over ' || array_to_string(p_roots, ', ') || ')';
        ELSE
            RETURN QUERY SELECT p_path || '.concurrency_key', m
            FROM orch8.sequence_template_problems(p_object ->> 'concurrency_key', p_roots) AS m;
        END IF;
        IF NOT p_object ? 'max_concurrency' THEN
            RETURN QUERY SELECT p_path || '.max_concurrency',
                'max_concurrency is required with a concurrency_key';
        END IF;
    END IF;
    IF p_object ? 'max_concurrency' THEN
        IF coalesce(orch8.sequence_json_integer(p_object -> 'max_concurrency')
                    NOT BETWEEN 1 AND orch8.limit_of('max_concurrency'), true) THEN
            RETURN QUERY SELECT p_path || '.max_concurrency', format(
                'max_concurrency must be an integer from 1 to %s',
                orch8.limit_of('max_concurrency'));
        ELSIF NOT p_object ? 'concurrency_key' THEN
            RETURN QUERY SELECT p_path || '.max_concurrency',
                'max_concurrency needs a concurrency_key';
        END IF;
    END IF;
    IF p_object ? 'rate_limit_key' AND NOT coalesce(
           jsonb_typeof(p_object -> 'rate_limit_key') = 'string'
           AND orch8.fits_domain(p_object ->> 'rate_limit_key', 'orch8.identifier'), false) THEN
        RETURN QUERY SELECT p_path || '.rate_limit_key',
            'rate_limit_key must be a key of 1 to 100 of A-Z a-z 0-9 _ . - (no templates), '
            'defined per tenant with orch8.set_rate_limit';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.flow_control_problems(jsonb, text, text[]) IS
'The validator''s problems with a step''s (or a definition''s) concurrency_key (1 to 200 '
'characters, templates over p_roots), max_concurrency (an integer from 1 to the limit '
'max_concurrency; each needs the other) and rate_limit_key (an orch8.identifier).';
