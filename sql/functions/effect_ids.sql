-- Repeatable: canonical JSON, hashes and ids: the deterministic ids of the effect ledger,
-- and the time-ordered ids of instances.

CREATE OR REPLACE FUNCTION orch8.canonical_json_at(p_value jsonb, p_depth integer)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_out text;
BEGIN
    IF p_depth > orch8.limit_of('json_depth') THEN
        -- refused before PostgreSQL's own stack limit (54001) is reached
        RAISE EXCEPTION 'JSON nested deeper than % levels', orch8.limit_of('json_depth')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'json',
                                             'limit', orch8.limit_of('json_depth'))::text;
    END IF;
    CASE jsonb_typeof(p_value)
        WHEN 'object' THEN
            SELECT '{' || coalesce(
                string_agg(to_json(e.key)::text || ':'
                           || orch8.canonical_json_at(e.value, p_depth + 1),
                           ',' ORDER BY e.key COLLATE "C"),
                '') || '}'
              INTO v_out
              FROM jsonb_each(p_value) AS e;
        WHEN 'array' THEN
            SELECT '[' || coalesce(
                string_agg(orch8.canonical_json_at(a.value, p_depth + 1), ','
                           ORDER BY a.ordinality),
                '') || ']'
              INTO v_out
              FROM jsonb_array_elements(p_value) WITH ORDINALITY AS a;
        ELSE
            -- strings come out JSON-escaped, numbers as numeric_out prints them
            v_out := p_value::text;
    END CASE;
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION orch8.canonical_json_at(jsonb, integer) IS
'canonical_json of a value found p_depth levels down; deeper than the limit json_depth: '
'O8008.';

CREATE OR REPLACE FUNCTION orch8.canonical_json(p_value jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$ SELECT orch8.canonical_json_at(p_value, 1) $$;

COMMENT ON FUNCTION orch8.canonical_json(jsonb) IS
'The one canonical JSON form hashed by the ledger: object keys sorted by Unicode code '
'point (byte order of their UTF-8), no whitespace, arrays in order, strings JSON-escaped '
'(", \\, \\b \\f \\n \\r \\t, other control characters as \\u00XX, non-ASCII as is), '
'numbers as PostgreSQL prints a jsonb number (1.50 stays 1.50, 1e2 is 100, -0 is 0). '
'Nested deeper than the limit json_depth (64): O8008.';

CREATE OR REPLACE FUNCTION orch8.sha256_hex(p_text text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
BEGIN
    -- PL/pgSQL: convert_to is only stable, so a SQL body would not be inlined, and a SQL
    -- function is planned again on every call
    RETURN encode(sha256(convert_to(p_text, 'UTF8')), 'hex');
END
$$;

COMMENT ON FUNCTION orch8.sha256_hex(text) IS
'Lowercase hex SHA-256 of the UTF-8 bytes of a text.';

CREATE OR REPLACE FUNCTION orch8.uuid_from_digest(p_digest bytea)
RETURNS uuid
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
BEGIN
    IF length(p_digest) < 16 THEN
        RAISE EXCEPTION 'a digest of % bytes is too short for a UUID (16 needed)',
            length(p_digest)
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'digest')::text;
    END IF;
    RETURN encode(
        set_byte(
            set_byte(substring(p_digest FROM 1 FOR 16), 6,
                     (get_byte(p_digest, 6) & 15) | 128),
            8, (get_byte(p_digest, 8) & 63) | 128),
        'hex')::uuid;
END
$$;

COMMENT ON FUNCTION orch8.uuid_from_digest(bytea) IS
'A UUID from the first 16 bytes of a digest, with byte 6 = (b & 0x0f) | 0x80 (version 8) '
'and byte 8 = (b & 0x3f) | 0x80 (RFC 4122 variant). Fewer than 16 bytes: O8008.';

CREATE OR REPLACE FUNCTION orch8.deterministic_effect_id(
    p_continuity_id uuid,
    p_epoch bigint,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer
)
RETURNS uuid
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
BEGIN
    IF p_epoch < 0 OR p_attempt < 0 THEN
        RAISE EXCEPTION 'epoch and attempt must be >= 0 (got epoch %, attempt %)',
            p_epoch, p_attempt USING ERRCODE = 'O8008';
    END IF;
    RETURN orch8.uuid_from_digest(sha256(
        convert_to('orch8-effect-v1', 'UTF8') || '\x00'::bytea
        || uuid_send(p_continuity_id)
        || int8send(p_epoch)
        || uuid_send(p_instance_id)
        || convert_to(p_block_id, 'UTF8')
        || int4send(p_attempt)
    ));
END
$$;

COMMENT ON FUNCTION orch8.deterministic_effect_id(uuid, bigint, uuid, text, integer) IS
'The receipt id of an effect from its position: first 16 bytes of SHA-256 over '
'''orch8-effect-v1''||0x00||continuity_id(16)||epoch(8, big-endian)||instance_id(16)'
'||block_id(UTF-8)||attempt(4, big-endian), as a version-8 UUID. A retry of the same '
'attempt lands on the same receipt; a new attempt gets a new one.';

CREATE OR REPLACE FUNCTION orch8.effect_receipt_id(
    p_version integer,
    p_continuity_id uuid,
    p_epoch bigint,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer
)
RETURNS uuid
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_id uuid := orch8.deterministic_effect_id(p_continuity_id, p_epoch, p_instance_id,
                                               p_block_id, p_attempt);
BEGIN
    CASE p_version
        WHEN 1 THEN
            RETURN v_id;
        WHEN 2 THEN
            -- the instance id's first six bytes (its time, for a time-ordered id) lead, so
            -- a new receipt's entries land at one edge of the indexes keyed by receipt id
            RETURN encode(overlay(uuid_send(v_id)
                                  PLACING substring(uuid_send(p_instance_id) FROM 1 FOR 6)
                                  FROM 1 FOR 6), 'hex')::uuid;
        ELSE
            RAISE EXCEPTION 'effect id version % does not exist (1 or 2)', p_version
                USING ERRCODE = 'O8008',
                      DETAIL = json_build_object('field', 'effect_id_version')::text;
    END CASE;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipt_id(integer, uuid, bigint, uuid, text, integer) IS
'The receipt id of an effect in a scope whose continuity_executions.effect_id_version is '
'p_version: 1 is deterministic_effect_id(continuity, epoch, instance, block, attempt); '
'2 is that id with its first 6 bytes replaced by the instance id''s first 6 (its time, '
'for a time-ordered id). Any other version: O8008. A scope keeps its version for life, '
'so every attempt of a step keeps the key it was first sent under.';

CREATE OR REPLACE FUNCTION orch8.time_ordered_uuid()
RETURNS uuid
LANGUAGE plpgsql
VOLATILE
PARALLEL SAFE
AS $$
DECLARE
    v_bytes bytea := uuid_send(gen_random_uuid());
    v_ms bigint := floor(extract(EPOCH FROM orch8.now()) * 1000);
BEGIN
    -- the first 48 bits are the time, so ids made later sort later and a new row's
    -- entries land at the right edge of every index that leads with the id
    v_bytes := overlay(v_bytes PLACING substring(int8send(v_ms) FROM 3 FOR 6) FROM 1 FOR 6);
    RETURN encode(set_byte(v_bytes, 6, (get_byte(v_bytes, 6) & 15) | 112), 'hex')::uuid;
END
$$;

COMMENT ON FUNCTION orch8.time_ordered_uuid() IS
'A version-7 UUID (RFC 9562): 48 bits of Unix milliseconds from orch8.now(), then 74 '
'random bits from gen_random_uuid(). The id of every new instance: indexes that lead '
'with an instance id then grow at one edge, so their hot pages stay few however much '
'history the table holds.';

CREATE OR REPLACE FUNCTION orch8.effect_scope_id(p_prefix text, p_instance_id uuid)
RETURNS uuid
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_digest bytea := sha256(
        convert_to(p_prefix, 'UTF8') || '\x00'::bytea || uuid_send(p_instance_id));
BEGIN
    -- the instance id's first six bytes (its time, for a time-ordered id) lead, so a
    -- scope's entries land next to its instance's in time order
    RETURN orch8.uuid_from_digest(
        overlay(v_digest PLACING substring(uuid_send(p_instance_id) FROM 1 FOR 6)
                FROM 1 FOR 6));
END
$$;

COMMENT ON FUNCTION orch8.effect_scope_id(text, uuid) IS
'Scope ids derived from an instance id: the instance id''s first 6 bytes (its time, for '
'a time-ordered id), then bytes 7-16 of SHA-256 over prefix||0x00||instance_id(16), as a '
'version-8 UUID. Prefix orch8-effect-scope-v1 gives the continuity id, '
'orch8-effect-runtime-v1 the owner runtime id. Only a new scope is derived: '
'ensure_effect_scope reads an existing one from its row.';

CREATE OR REPLACE FUNCTION orch8.destination_fingerprint(p_handler text, p_params jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT orch8.sha256_hex(orch8.canonical_json(jsonb_build_object(
            'handler', p_handler,
            'destination', CASE WHEN jsonb_typeof(p_params) = 'object' THEN (
                SELECT coalesce(jsonb_object_agg(e.key, e.value), '{}'::jsonb)
                FROM jsonb_each(p_params) AS e
                WHERE e.key IN ('url', 'provider', 'model', 'topic', 'queue', 'resource', 'endpoint')
            ) ELSE '{}'::jsonb END
        )))
    );
END
$$;

COMMENT ON FUNCTION orch8.destination_fingerprint(text, jsonb) IS
'Hex SHA-256 of canonical_json({handler, destination}) where destination holds the '
'top-level params url, provider, model, topic, queue, resource and endpoint that are present.';

CREATE OR REPLACE FUNCTION orch8.request_sha256(p_handler text, p_params jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT orch8.sha256_hex(orch8.canonical_json(jsonb_build_object(
            'handler', p_handler, 'params', coalesce(p_params, 'null'::jsonb)
        )))
    );
END
$$;

COMMENT ON FUNCTION orch8.request_sha256(text, jsonb) IS
'Hex SHA-256 of canonical_json({handler, params}): the content of a request, compared by '
'the commit guard and shown to operators.';

CREATE OR REPLACE FUNCTION orch8.provider_receipt_id(p_output jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT CASE
            WHEN octet_length(v.found) <= orch8.limit_of('provider_receipt_id_bytes') THEN v.found
        END
        FROM (
            SELECT (
                SELECT p_output ->> k.key
                FROM unnest(ARRAY['provider_receipt_id', 'receipt_id', 'request_id'])
                    WITH ORDINALITY AS k (key, pos)
                WHERE jsonb_typeof(p_output) = 'object'
                  AND jsonb_typeof(p_output -> k.key) = 'string'
                ORDER BY k.pos
                LIMIT 1
            ) AS found
        ) AS v
    );
END
$$;

COMMENT ON FUNCTION orch8.provider_receipt_id(jsonb) IS
'The provider''s receipt id in a handler output: the first present string among '
'provider_receipt_id, receipt_id, request_id; NULL when that string is over 256 bytes '
'(it does not fall through to the next key).';
