-- Repeatable: per-instance key-value state. Writes are fenced by the lease token like
-- every other runner write; reads are not (a stale reader learns nothing it may act on).

CREATE OR REPLACE FUNCTION orch8.set_instance_state(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_key text,
    p_value jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_value jsonb := coalesce(p_value, 'null'::jsonb);
    v_limit integer := coalesce(
        nullif(current_setting('orch8.max_state_value_bytes', true), '')::integer,
        orch8.limit_of('state_value_bytes'));
BEGIN
    PERFORM orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    IF p_key IS NULL OR octet_length(p_key) NOT BETWEEN 1 AND orch8.limit_of('state_key_bytes')
    THEN
        RAISE EXCEPTION 'a state key is a string of 1 to % bytes',
            orch8.limit_of('state_key_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'key',
                                             'limit', orch8.limit_of('state_key_bytes'))::text;
    END IF;
    IF octet_length(v_value::text) > v_limit THEN
        RAISE EXCEPTION 'state value for key % is % bytes, over the limit of % bytes',
            p_key, octet_length(v_value::text), v_limit
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'value', 'limit', v_limit,
                                             'size', octet_length(v_value::text))::text,
                  HINT = 'store large payloads elsewhere and keep a reference '
                         '(the limit is the setting orch8.max_state_value_bytes)';
    END IF;
    INSERT INTO orch8.instance_kv_state AS s (tenant_id, instance_id, key, value)
    VALUES (p_tenant_id, p_instance_id, p_key, v_value)
    ON CONFLICT (tenant_id, instance_id, key)
    DO UPDATE SET value = excluded.value, updated_at = orch8.now();
END
$$;

COMMENT ON FUNCTION orch8.set_instance_state(text, uuid, uuid, text, jsonb) IS
'Upsert one key of an instance''s key-value state, for the lease holder: a stale token '
'raises O8001 and nothing is written. A key is 1 to state_key_bytes (256) bytes and a '
'value at most orch8.max_state_value_bytes (default: the limit state_value_bytes, 262144), '
'else O8008. SQL NULL is stored as JSON null.';

CREATE OR REPLACE FUNCTION orch8.get_instance_state(
    p_tenant_id text, p_instance_id uuid, p_key text
)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT s.value
    FROM orch8.instance_kv_state AS s
    WHERE s.tenant_id = p_tenant_id AND s.instance_id = p_instance_id AND s.key = p_key
$$;

COMMENT ON FUNCTION orch8.get_instance_state(text, uuid, text) IS
'The value stored under p_key for the instance, or SQL NULL when the key was never set '
'(a stored JSON null comes back as ''null''::jsonb). Not fenced: reads need no lease.';

CREATE OR REPLACE FUNCTION orch8.delete_instance_state(
    p_tenant_id text, p_instance_id uuid, p_lease_token uuid, p_key text
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_deleted boolean;
BEGIN
    PERFORM orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    DELETE FROM orch8.instance_kv_state AS s
    WHERE s.tenant_id = p_tenant_id AND s.instance_id = p_instance_id AND s.key = p_key;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

COMMENT ON FUNCTION orch8.delete_instance_state(text, uuid, uuid, text) IS
'Remove one key of an instance''s key-value state, for the lease holder (a stale token '
'raises O8001). Returns whether the key existed; deleting a missing key is not an error.';

CREATE OR REPLACE FUNCTION orch8.merge_instance_state(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_key text,
    p_patch jsonb
)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_current jsonb;
    v_merged jsonb;
BEGIN
    -- The lease row lock serialises every writer of this instance's state, so the read
    -- and the write below cannot interleave with another merge.
    PERFORM orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    IF p_patch IS NULL OR jsonb_typeof(p_patch) <> 'object' THEN
        RAISE EXCEPTION 'merge_instance_state needs a JSON object to merge, got %',
            coalesce(jsonb_typeof(p_patch), 'NULL') USING ERRCODE = 'O8008';
    END IF;
    SELECT s.value INTO v_current
    FROM orch8.instance_kv_state AS s
    WHERE s.tenant_id = p_tenant_id AND s.instance_id = p_instance_id AND s.key = p_key;
    IF v_current IS NOT NULL AND jsonb_typeof(v_current) <> 'object' THEN
        RAISE EXCEPTION 'state key % holds a JSON %, not an object: nothing to merge into',
            p_key, jsonb_typeof(v_current)
            USING ERRCODE = 'O8008', HINT = 'replace it with set_instance_state';
    END IF;
    v_merged := coalesce(v_current, '{}'::jsonb) || p_patch;
    -- the key and size rules, and the write, are set_instance_state's
    PERFORM orch8.set_instance_state(p_tenant_id, p_instance_id, p_lease_token, p_key, v_merged);
    RETURN v_merged;
END
$$;

COMMENT ON FUNCTION orch8.merge_instance_state(text, uuid, uuid, text, jsonb) IS
'Shallow-merge a JSON object into the object stored under p_key (top-level keys of the '
'patch replace the stored ones; a missing key starts from {}), for the lease holder (a '
'stale token raises O8001). Returns the merged value. A stored value that is not an '
'object, a patch that is not an object, or a result over orch8.max_state_value_bytes: '
'O8008, nothing written.';
