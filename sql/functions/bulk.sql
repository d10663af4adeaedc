-- Repeatable: bulk operator actions by filter (docs/ARCHITECTURE.md, "Bulk operator
-- actions"). One filter shape (bulk_filter_fields, checked by bulk_filter, matched by
-- bulk_matches), a dry-run count, and batches in keyset order whose every instance moves
-- through its single-instance function in a subtransaction of its own.

CREATE OR REPLACE FUNCTION orch8.bulk_actions()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['retry', 'cancel', 'pause', 'resume']
$$;

COMMENT ON FUNCTION orch8.bulk_actions() IS
'The actions bulk_apply takes, each the single-instance function of that name: retry '
'(retry_instance), cancel (cancel_instance), pause (pause_instance), resume '
'(resume_instance).';

CREATE OR REPLACE FUNCTION orch8.bulk_filter_fields()
RETURNS TABLE (field text, type text, description text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    ('sequence', 'sequence_name', 'the sequence''s name (any version)'),
    ('namespace', 'identifier', 'the sequence''s namespace'),
    ('state', 'instance_state or a list of them', 'the instance''s state is one of these'),
    ('error_contains', 'text', 'the instance''s error contains this text, ignoring case'),
    ('created_after', 'timestamptz', 'created at or after'),
    ('created_before', 'timestamptz', 'created before'),
    ('updated_after', 'timestamptz', 'last changed at or after'),
    ('updated_before', 'timestamptz', 'last changed before')
$$;

COMMENT ON FUNCTION orch8.bulk_filter_fields() IS
'The keys of a bulk filter (bulk_filter checks them, bulk_matches applies them), with '
'their types. Every key given must hold; at least one is needed.';

CREATE OR REPLACE FUNCTION orch8.bulk_filter_refuse(p_key text, p_message text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'bulk filter %: %', p_key, p_message
        USING ERRCODE = 'O8008',
              DETAIL = json_build_object('field', 'filter.' || p_key)::text;
END
$$;

COMMENT ON FUNCTION orch8.bulk_filter_refuse(text, text) IS
'O8008 "bulk filter <key>: <message>" with DETAIL {field: filter.<key>} (bulk_filter''s '
'one way to refuse a value).';

CREATE OR REPLACE FUNCTION orch8.bulk_filter(p_filter jsonb)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_allowed text [] := ARRAY(SELECT f.field FROM orch8.bulk_filter_fields() AS f);
    v_key text;
    v_value jsonb;
    v_states jsonb;
    v_out jsonb := '{}'::jsonb;
BEGIN
    IF jsonb_typeof(p_filter) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a bulk filter must be a JSON object, got %',
            coalesce(jsonb_typeof(p_filter), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'filter')::text;
    END IF;
    SELECT k INTO v_key FROM jsonb_object_keys(p_filter) AS k WHERE k <> ALL (v_allowed)
    ORDER BY k LIMIT 1;
    IF v_key IS NOT NULL THEN
        RAISE EXCEPTION 'bulk filter: unknown key %', quote_literal(v_key)
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'filter.' || v_key,
                                             'allowed', v_allowed)::text;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jsonb_each(p_filter) AS e WHERE e.value <> 'null') THEN
        RAISE EXCEPTION 'a bulk filter needs at least one of %', array_to_string(v_allowed, ', ')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'filter', 'allowed', v_allowed)::text;
    END IF;
    FOR v_key, v_value IN
        SELECT e.key, e.value FROM jsonb_each(p_filter) AS e WHERE e.value <> 'null'
        ORDER BY e.key
    LOOP
        IF v_key = 'state' THEN
            v_states := CASE jsonb_typeof(v_value) WHEN 'string' THEN jsonb_build_array(v_value)
                                                   ELSE v_value END;
            IF jsonb_typeof(v_states) <> 'array' OR jsonb_array_length(v_states) = 0
               OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_states) AS s (v)
                          WHERE jsonb_typeof(s.v) <> 'string'
                             OR (s.v #>> '{}') <> ALL (enum_range(NULL::orch8.instance_state)::text []))
            THEN
                PERFORM orch8.bulk_filter_refuse(v_key, format(
                    'must be one of %s, or a non-empty list of them',
                    array_to_string(enum_range(NULL::orch8.instance_state)::text [], ', ')));
            END IF;
            v_out := v_out || jsonb_build_object(v_key, v_states);
            CONTINUE;
        END IF;
        IF jsonb_typeof(v_value) <> 'string' THEN
            PERFORM orch8.bulk_filter_refuse(v_key, 'must be a string');
        END IF;
        IF v_key = 'sequence'
           AND NOT orch8.fits_domain(v_value #>> '{}', 'orch8.sequence_name') THEN
            PERFORM orch8.bulk_filter_refuse(v_key, 'a sequence name is '
                || obj_description('orch8.sequence_name'::regtype, 'pg_type'));
        ELSIF v_key = 'namespace'
              AND NOT orch8.fits_domain(v_value #>> '{}', 'orch8.identifier') THEN
            PERFORM orch8.bulk_filter_refuse(v_key, 'a namespace is '
                || obj_description('orch8.identifier'::regtype, 'pg_type'));
        ELSIF v_key = 'error_contains'
              AND (v_value #>> '{}' = ''
                   OR char_length(v_value #>> '{}') > orch8.limit_of('error_chars')) THEN
            PERFORM orch8.bulk_filter_refuse(v_key, format('must be 1 to %s characters',
                                                           orch8.limit_of('error_chars')));
        ELSIF v_key LIKE '%\_after' OR v_key LIKE '%\_before' THEN
            BEGIN
                -- with its offset: what a time without one means is not the server's guess
                IF (v_value #>> '{}')
                   !~ '[0-9]:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?\s*([zZ]|[+-][0-9]{2}(:?[0-9]{2})?)$'
                THEN
                    RAISE EXCEPTION USING ERRCODE = 'invalid_datetime_format';
                END IF;
                v_value := to_jsonb((v_value #>> '{}')::timestamptz);
            EXCEPTION WHEN data_exception THEN
                PERFORM orch8.bulk_filter_refuse(v_key, format(
                    'must be a timestamp with its offset, e.g. 2030-01-31T12:00:00Z, got %s',
                    v_value));
            END;
        END IF;
        v_out := v_out || jsonb_build_object(v_key, v_value);
    END LOOP;
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION orch8.bulk_filter(jsonb) IS
'A bulk filter checked and normalised (state always a list, times as timestamptz JSON): '
'a JSON object of the keys of bulk_filter_fields (a null value is "not given"), at least '
'one given. Not an object, an unknown key, no key, a state that is not an instance_state, '
'a sequence name or namespace that breaks its pattern, an error_contains empty or over '
'error_chars, a time that is not a timestamp: O8008 with DETAIL {field: filter or '
'filter.<key>} (allowed: the keys, for an unknown one or none). A time needs its offset '
'(Z or +hh:mm).';

CREATE OR REPLACE FUNCTION orch8.bulk_matches(p_inst orch8.task_instances, p_filter jsonb)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    -- never NULL (an instance without an error, say): NOT of it must mean "does not match"
    SELECT coalesce((p_filter -> 'state' IS NULL
            OR (p_inst).state::text IN (SELECT jsonb_array_elements_text(p_filter -> 'state')))
       AND (p_filter ->> 'error_contains' IS NULL
            OR strpos(lower((p_inst).error), lower(p_filter ->> 'error_contains')) > 0)
       AND (p_filter ->> 'created_after' IS NULL
            OR (p_inst).created_at >= (p_filter ->> 'created_after')::timestamptz)
       AND (p_filter ->> 'created_before' IS NULL
            OR (p_inst).created_at < (p_filter ->> 'created_before')::timestamptz)
       AND (p_filter ->> 'updated_after' IS NULL
            OR (p_inst).updated_at >= (p_filter ->> 'updated_after')::timestamptz)
       AND (p_filter ->> 'updated_before' IS NULL
            OR (p_inst).updated_at < (p_filter ->> 'updated_before')::timestamptz)
       AND (p_filter ->> 'sequence' IS NULL AND p_filter ->> 'namespace' IS NULL
            OR EXISTS (
                SELECT 1 FROM orch8.sequences AS s
                WHERE s.tenant_id = (p_inst).tenant_id AND s.id = (p_inst).sequence_id
                  AND (p_filter ->> 'sequence' IS NULL OR s.name = p_filter ->> 'sequence')
                  AND (p_filter ->> 'namespace' IS NULL
                       OR s.namespace = p_filter ->> 'namespace'))), false)
$$;

COMMENT ON FUNCTION orch8.bulk_matches(orch8.task_instances, jsonb) IS
'Whether an instance matches a filter bulk_filter normalised (true or false, never NULL): '
'every key given holds '
'(error_contains is a literal, case-insensitive; after is inclusive, before exclusive). '
'The one predicate of bulk_count, of bulk_apply''s selection and of its re-check on the '
'locked row.';

CREATE OR REPLACE FUNCTION orch8.bulk_count(p_tenant_id text, p_filter jsonb)
RETURNS bigint
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_filter jsonb := orch8.bulk_filter(p_filter);
    v_count bigint;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    SELECT count(*) INTO v_count FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND orch8.bulk_matches(t, v_filter);
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.bulk_count(text, jsonb) IS
'The dry run of a bulk action: how many instances of the tenant match the filter now '
'(bulk_filter: O8008 for a bad one; the web role only in its sealed tenant, O8009).';

CREATE OR REPLACE FUNCTION orch8.bulk_apply_one(
    p_tenant_id text,
    p_action text,
    p_filter jsonb,
    p_instance_id uuid,
    p_actor text,
    p_reason text
)
RETURNS TABLE (applied boolean, outcome text, reason text, detail jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_outcome text;
    v_message text;
    v_detail text;
    v_code text;
BEGIN
    -- its own subtransaction: a refusal undoes this instance's move only
    BEGIN
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
        FOR UPDATE;
        IF v_inst.id IS NULL OR NOT orch8.bulk_matches(v_inst, p_filter) THEN
            RETURN QUERY SELECT false, 'skipped'::text, 'no longer matches the filter'::text,
                jsonb_build_object('instance_id', p_instance_id,
                                   'current_state', v_inst.state);
            RETURN;
        END IF;
        v_outcome := CASE p_action
            WHEN 'cancel' THEN orch8.cancel_instance(p_tenant_id, p_instance_id, p_actor,
                                                     p_reason)
            WHEN 'pause' THEN orch8.pause_instance(p_tenant_id, p_instance_id, p_actor,
                                                   p_reason)
            WHEN 'resume' THEN orch8.resume_instance(p_tenant_id, p_instance_id, p_actor,
                                                     p_reason)
        END;
        IF p_action = 'retry' THEN
            SELECT string_agg(DISTINCT r.outcome, ',') INTO v_outcome
            FROM orch8.retry_instance(p_tenant_id, p_instance_id, p_actor) AS r;
        END IF;
        IF v_outcome = 'unchanged' THEN
            RETURN QUERY SELECT false, v_outcome, format('already %s', CASE p_action
                    WHEN 'pause' THEN 'paused (or a pause was asked)'
                    ELSE 'cancelled (or a cancel was asked)' END),
                jsonb_build_object('instance_id', p_instance_id, 'current_state', v_inst.state);
            RETURN;
        END IF;
        RETURN QUERY SELECT true, v_outcome, NULL::text, NULL::jsonb;
    EXCEPTION WHEN SQLSTATE 'O8000' THEN  -- the engine's refusals, the whole class
        GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL,
                                v_code = RETURNED_SQLSTATE;
        RETURN QUERY SELECT false, 'refused'::text,
            -- without the instance's id, so that one refusal groups across instances
            trim(regexp_replace(v_message,
                 '\s*[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '', 'g')),
            jsonb_build_object('instance_id', p_instance_id, 'error', v_code)
            || CASE WHEN v_detail LIKE '{%' THEN v_detail::jsonb ELSE '{}' END;
    END;
END
$$;

COMMENT ON FUNCTION orch8.bulk_apply_one(text, text, jsonb, uuid, text, text) IS
'bulk_apply''s move of one instance, in a subtransaction of its own: lock the row, '
're-check it against the (normalised) filter, call the action''s single-instance '
'function. applied, with the function''s outcome; or skipped with a reason: no longer '
'matches the filter, already paused or cancelled (unchanged), or an engine refusal '
'(SQLSTATE class O8, its message without instance ids) whose move is undone. detail: '
'the instance id, the SQLSTATE (error) and the refusal''s DETAIL.';

CREATE OR REPLACE FUNCTION orch8.bulk_apply(
    p_tenant_id text,
    p_action text,
    p_filter jsonb,
    p_actor text,
    p_reason text DEFAULT NULL,
    p_after_id uuid DEFAULT NULL,
    p_batch integer DEFAULT 50
)
RETURNS TABLE (
    processed integer,
    applied integer,
    skipped integer,
    last_id uuid,
    skip_reasons jsonb,
    skip_sample jsonb
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_filter jsonb := orch8.bulk_filter(p_filter);
    v_id uuid;
    v_one record;
    v_processed integer := 0;
    v_applied integer := 0;
    v_last uuid;
    v_reasons jsonb := '{}'::jsonb;
    v_sample jsonb := '[]'::jsonb;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    IF p_action IS NULL OR p_action <> ALL (orch8.bulk_actions()) THEN
        RAISE EXCEPTION 'a bulk action is one of %, got %',
            array_to_string(orch8.bulk_actions(), ', '), coalesce(p_action, 'NULL')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'action',
                                             'allowed', orch8.bulk_actions())::text;
    END IF;
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > orch8.limit_of('bulk_batch') THEN
        RAISE EXCEPTION 'a bulk batch is 1 to % instances, got %', orch8.limit_of('bulk_batch'),
            coalesce(p_batch::text, 'NULL')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'batch',
                                             'limit', orch8.limit_of('bulk_batch'))::text;
    END IF;
    IF p_reason IS NOT NULL AND p_action NOT IN ('cancel', 'pause') THEN
        RAISE EXCEPTION 'a reason is recorded by cancel and pause only, not by %', p_action
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'reason')::text;
    END IF;
    IF p_actor IS NULL OR btrim(p_actor) = '' THEN
        RAISE EXCEPTION 'a bulk action names its actor'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'actor')::text;
    END IF;
    -- refused once here rather than once per instance
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor)),
            orch8.require_size('reason', 'note_bytes', octet_length(p_reason));
    FOR v_id IN
        SELECT t.id FROM orch8.task_instances AS t
        WHERE t.tenant_id = p_tenant_id AND (p_after_id IS NULL OR t.id > p_after_id)
          AND orch8.bulk_matches(t, v_filter)
        ORDER BY t.id
        LIMIT p_batch
    LOOP
        v_processed := v_processed + 1;
        v_last := v_id;
        SELECT * INTO v_one FROM orch8.bulk_apply_one(p_tenant_id, p_action, v_filter, v_id,
                                                      p_actor, p_reason);
        IF v_one.applied THEN
            v_applied := v_applied + 1;
        ELSE
            v_reasons := jsonb_set(v_reasons, ARRAY[v_one.reason],
                to_jsonb(coalesce((v_reasons ->> v_one.reason)::integer, 0) + 1));
            IF jsonb_array_length(v_sample) < 5 THEN
                v_sample := v_sample || jsonb_build_array(
                    jsonb_build_object('reason', v_one.reason) || v_one.detail);
            END IF;
        END IF;
    END LOOP;
    RETURN QUERY SELECT v_processed, v_applied, v_processed - v_applied, v_last, v_reasons,
                        v_sample;
END
$$;

COMMENT ON FUNCTION orch8.bulk_apply(text, text, jsonb, text, text, uuid, integer) IS
'One batch of a bulk action: up to p_batch instances of the tenant that match the filter '
'(bulk_filter) with an id after p_after_id, in id order, each moved by bulk_apply_one '
'(its own subtransaction: re-checked on the locked row, a refusal skipped with its '
'reason, never aborting the batch). Answers processed, applied, skipped, last_id (the '
'cursor for the next call; NULL when none was left) and skip_reasons {reason: count} '
'with skip_sample (up to 5 skipped instances with their reason and facts). A batch '
'shorter than p_batch is the last. An action not of bulk_actions, a batch outside 1 to '
'bulk_batch, a reason for retry or resume (they record none), no actor, an actor over '
'actor_chars or a reason over note_bytes: O8008; the web role only in its sealed tenant '
'(O8009).';
