-- Repeatable: sequence definitions. validate_sequence lists every problem of a definition;
-- create_sequence stores only a clean one, as the next version of (tenant, namespace, name),
-- and declares its invariants for that version.

CREATE OR REPLACE FUNCTION orch8.sequence_path_key(p_key text)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_key ~ '^[A-Za-z_][A-Za-z0-9_]*$' THEN '.' || p_key
        ELSE '[' || to_jsonb(p_key)::text || ']'
    END
$$;

COMMENT ON FUNCTION orch8.sequence_path_key(text) IS
'One step of a problem path for an object key: .key for an identifier, else ["key"] '
'(JSON-quoted). Internal helper of validate_sequence.';

CREATE OR REPLACE FUNCTION orch8.sequence_json_number(p_value jsonb)
RETURNS numeric
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    -- Two steps on purpose: the cast must never be evaluated for a non-number.
    IF jsonb_typeof(p_value) IS DISTINCT FROM 'number' THEN
        RETURN NULL;
    END IF;
    RETURN p_value::numeric;
END
$$;

COMMENT ON FUNCTION orch8.sequence_json_number(jsonb) IS
'The value of a JSON number, NULL for anything else (internal helper).';

CREATE OR REPLACE FUNCTION orch8.sequence_json_integer(p_value jsonb)
RETURNS numeric
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT n.v
    FROM (SELECT orch8.sequence_json_number(p_value) AS v) AS n
    WHERE n.v = trunc(n.v)
$$;

COMMENT ON FUNCTION orch8.sequence_json_integer(jsonb) IS
'The value of a JSON number without a fractional part (1 and 1.0), NULL for anything '
'else (internal helper).';

CREATE OR REPLACE FUNCTION orch8.sequence_template_problems(p_text text)
RETURNS SETOF text
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_rest text := p_text;
    v_at integer;
    v_expr text;
    v_root text;
BEGIN
    LOOP
        v_at := strpos(v_rest, '{{');
        EXIT WHEN v_at = 0;
        v_rest := substr(v_rest, v_at + 2);
        v_at := strpos(v_rest, '}}');
        IF v_at = 0 THEN
            RETURN NEXT 'unclosed template: "{{" without a matching "}}"';
            RETURN;
        END IF;
        v_expr := btrim(substr(v_rest, 1, v_at - 1), E' \t\r\n');
        v_rest := substr(v_rest, v_at + 2);
        CONTINUE WHEN v_expr ~ (
            '^(data|config|outputs|instance_id|runtime)(\.[A-Za-z0-9_-]+)*'
            || '(\s*\|\s*''[^'']*'')?$'
        );
        v_root := substring(v_expr FROM '^[A-Za-z_][A-Za-z0-9_]*');
        IF v_expr = '' THEN
            RETURN NEXT 'empty template "{{ }}"';
        ELSIF v_root IS NULL
              OR v_root NOT IN ('data', 'config', 'outputs', 'instance_id', 'runtime') THEN
            RETURN NEXT format(
                'template "{{ %s }}" has an unknown root %s '
                '(roots: data, config, outputs, instance_id, runtime)',
                v_expr, coalesce('"' || v_root || '"', '(none)'));
        ELSE
            RETURN NEXT format(
                'template "{{ %s }}" is malformed: expected root.segment.segment..., '
                'optionally followed by | ''literal''', v_expr);
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.sequence_template_problems(text) IS
'The problems of the {{ expr }} placeholders in one string, one per bad placeholder. expr '
'is a root (data, config, outputs, instance_id, runtime), then .segment parts '
'([A-Za-z0-9_-]+), then optionally a fallback | ''literal''. An unclosed {{ ends the scan.';

CREATE OR REPLACE FUNCTION orch8.validate_sequence(p_definition jsonb)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    c_max_blocks CONSTANT integer := 5000;
    c_max_depth CONSTANT integer := 64;
    c_max_branches CONSTANT integer := 256;
    c_block_types CONSTANT text[] := ARRAY[
        'step', 'parallel', 'race', 'loop', 'for_each', 'router', 'try_catch',
        'sub_sequence', 'saga'
    ];
    c_top_fields CONSTANT text[] := ARRAY[
        'blocks', 'invariants', 'interceptors', 'input_schema', 'sla', 'on_failure',
        'on_cancel', 'deprecated', 'status',
        -- ignored: the arguments of create_sequence decide these
        'id', 'tenant_id', 'namespace', 'name', 'version', 'created_at'
    ];
    c_step_fields CONSTANT text[] := ARRAY[
        'type', 'id', 'handler', 'params', 'delay', 'retry', 'timeout', 'rate_limit_key',
        'send_window', 'context_access', 'cancellable', 'wait_for_input', 'queue_name',
        'deadline', 'on_deadline_breach', 'fallback_handler', 'cache_key', 'output_schema',
        'when', 'compensation'
    ];
    c_retry_fields CONSTANT text[] := ARRAY[
        'max_attempts', 'initial_backoff', 'max_backoff', 'backoff_multiplier', 'retry_if',
        'non_retryable_codes'
    ];
    c_interceptors CONSTANT text[] := ARRAY[
        'before_step', 'after_step', 'on_signal', 'on_complete', 'on_failure'
    ];
    c_invariant_fields CONSTANT text[] := ARRAY['name', 'type', 'kind', 'commit_guard'];
    c_invariant_types CONSTANT text[] := ARRAY[
        'effect_at_most_once', 'no_unknown_effects', 'terminal_state_in', 'output_path_present'
    ];
    c_effect_kinds CONSTANT text[] := ARRAY[
        'http', 'model', 'message', 'storage', 'custom', 'worker'
    ];
    -- The walk: a stack of frames {kind: list|block, path, value, depth, tree}. Children
    -- are pushed in reverse, so blocks are visited in document order.
    v_stack jsonb[] := '{}';
    v_top integer := 0;
    v_frame jsonb;
    v_children jsonb;
    v_blocks integer := 0;
    -- every well-formed block id with its tree (blocks, on_failure, on_cancel) and path
    v_id_trees text[] := '{}';
    v_ids text[] := '{}';
    v_id_paths text[] := '{}';
    v_invariant_names text[] := '{}';
    v_at text;
    v_value jsonb;
    v_depth integer;
    v_tree text;
    v_type text;
    v_key text;
    v_item jsonb;
    v_item_at text;
    v_i integer;
    v_retry jsonb;
    v_initial numeric;
BEGIN
    IF jsonb_typeof(p_definition) IS DISTINCT FROM 'object' THEN
        RETURN QUERY SELECT '$', 'a sequence definition must be a JSON object';
        RETURN;
    END IF;

    -- 1. Top-level fields ----------------------------------------------------------------
    RETURN QUERY
        SELECT '$' || orch8.sequence_path_key(k.k), 'unknown field'
        FROM jsonb_object_keys(p_definition) AS k (k)
        WHERE k.k <> ALL (c_top_fields)
        ORDER BY k.k;

    IF p_definition ? 'deprecated'
       AND jsonb_typeof(p_definition -> 'deprecated') <> 'boolean' THEN
        RETURN QUERY SELECT '$.deprecated', 'deprecated must be true or false';
    END IF;
    IF p_definition ? 'status' AND NOT coalesce(
        jsonb_typeof(p_definition -> 'status') = 'string'
        AND p_definition ->> 'status' IN ('draft', 'staging', 'production', 'unpublished'),
        false
    ) THEN
        RETURN QUERY SELECT '$.status',
            'status must be one of draft, staging, production, unpublished';
    END IF;
    IF p_definition ? 'input_schema'
       AND jsonb_typeof(p_definition -> 'input_schema') NOT IN ('object', 'boolean') THEN
        RETURN QUERY SELECT '$.input_schema',
            'input_schema must be a JSON Schema (an object or a boolean)';
    END IF;
    IF p_definition ? 'sla' THEN
        IF jsonb_typeof(p_definition -> 'sla') <> 'object' THEN
            RETURN QUERY SELECT '$.sla', 'sla must be a JSON object';
        ELSE
            FOR v_key, v_item IN SELECT e.key, e.value FROM jsonb_each(p_definition -> 'sla') AS e
            LOOP
                IF v_key NOT IN ('max_runtime', 'max_step_runtime') THEN
                    RETURN QUERY SELECT '$.sla' || orch8.sequence_path_key(v_key), 'unknown field';
                ELSIF coalesce(orch8.sequence_json_integer(v_item) < 1, true) THEN
                    RETURN QUERY SELECT '$.sla.' || v_key,
                        v_key || ' must be a positive integer (milliseconds)';
                END IF;
            END LOOP;
        END IF;
    END IF;
    IF p_definition ? 'interceptors' THEN
        IF jsonb_typeof(p_definition -> 'interceptors') <> 'object' THEN
            RETURN QUERY SELECT '$.interceptors', 'interceptors must be a JSON object';
        ELSE
            FOR v_key, v_item IN
                SELECT e.key, e.value FROM jsonb_each(p_definition -> 'interceptors') AS e
            LOOP
                v_item_at := '$.interceptors' || orch8.sequence_path_key(v_key);
                IF v_key <> ALL (c_interceptors) THEN
                    RETURN QUERY SELECT v_item_at, 'unknown field';
                ELSIF jsonb_typeof(v_item) <> 'object' THEN
                    RETURN QUERY SELECT v_item_at,
                        'an interceptor must be a JSON object {handler, params}';
                ELSIF NOT coalesce(
                    jsonb_typeof(v_item -> 'handler') = 'string' AND v_item ->> 'handler' <> '',
                    false
                ) THEN
                    RETURN QUERY SELECT v_item_at || '.handler',
                        'handler is required (a non-empty string)';
                END IF;
            END LOOP;
        END IF;
    END IF;

    IF NOT p_definition ? 'blocks' THEN
        RETURN QUERY SELECT '$.blocks', 'blocks is required (a non-empty array of blocks)';
    ELSIF jsonb_typeof(p_definition -> 'blocks') <> 'array'
          OR jsonb_array_length(p_definition -> 'blocks') = 0 THEN
        RETURN QUERY SELECT '$.blocks', 'blocks must be a non-empty array of blocks';
    END IF;

    -- 2. The block trees: blocks, then on_failure, then on_cancel (ids may repeat across
    -- trees, as the failure and cancel trees run on their own) ---------------------------
    FOREACH v_key IN ARRAY ARRAY['on_cancel', 'on_failure', 'blocks'] LOOP
        IF p_definition ? v_key
           AND (v_key <> 'blocks' OR jsonb_typeof(p_definition -> 'blocks') = 'array') THEN
            v_top := v_top + 1;
            v_stack[v_top] := jsonb_build_object(
                'kind', 'list', 'path', '$.' || v_key, 'value', p_definition -> v_key,
                'depth', 1, 'tree', v_key);
        END IF;
    END LOOP;

    WHILE v_top > 0 LOOP
        v_frame := v_stack[v_top];
        v_top := v_top - 1;
        v_at := v_frame ->> 'path';
        v_value := v_frame -> 'value';
        v_depth := (v_frame ->> 'depth')::integer;
        v_tree := v_frame ->> 'tree';

        IF v_frame ->> 'kind' = 'list' THEN
            IF jsonb_typeof(v_value) IS DISTINCT FROM 'array' THEN
                RETURN QUERY SELECT v_at, 'must be an array of blocks';
            ELSE
                FOR v_i IN REVERSE jsonb_array_length(v_value) - 1 .. 0 LOOP
                    v_top := v_top + 1;
                    v_stack[v_top] := jsonb_build_object(
                        'kind', 'block', 'path', v_at || '[' || v_i || ']',
                        'value', v_value -> v_i, 'depth', v_depth, 'tree', v_tree);
                END LOOP;
            END IF;
            CONTINUE;
        END IF;

        v_blocks := v_blocks + 1;
        IF v_blocks > c_max_blocks THEN
            RETURN QUERY SELECT '$',
                format('more than %s blocks in total (nested blocks count)', c_max_blocks);
            EXIT;
        END IF;
        IF jsonb_typeof(v_value) IS DISTINCT FROM 'object' THEN
            RETURN QUERY SELECT v_at, 'a block must be a JSON object';
            CONTINUE;
        END IF;

        IF NOT v_value ? 'id' THEN
            RETURN QUERY SELECT v_at || '.id', 'id is required (a non-empty string)';
        ELSIF jsonb_typeof(v_value -> 'id') <> 'string' OR v_value ->> 'id' = '' THEN
            RETURN QUERY SELECT v_at || '.id', 'id must be a non-empty string';
        ELSIF length(v_value ->> 'id') > 200 THEN
            RETURN QUERY SELECT v_at || '.id', 'id is longer than 200 characters';
        ELSE
            v_id_trees := v_id_trees || v_tree;
            v_ids := v_ids || (v_value ->> 'id');
            v_id_paths := v_id_paths || v_at;
        END IF;

        IF NOT v_value ? 'type' THEN
            RETURN QUERY SELECT v_at || '.type',
                'type is required (one of ' || array_to_string(c_block_types, ', ') || ')';
            CONTINUE;
        END IF;
        v_type := CASE
            WHEN jsonb_typeof(v_value -> 'type') = 'string' THEN v_value ->> 'type'
        END;
        IF v_type IS NULL OR v_type <> ALL (c_block_types) THEN
            RETURN QUERY SELECT v_at || '.type',
                format('unknown block type %s (known: %s)',
                       v_value -> 'type', array_to_string(c_block_types, ', '));
            CONTINUE;
        END IF;

        v_children := '[]';
        CASE v_type
        WHEN 'step' THEN
            IF NOT v_value ? 'handler' THEN
                RETURN QUERY SELECT v_at || '.handler', 'handler is required (a non-empty string)';
            ELSIF jsonb_typeof(v_value -> 'handler') <> 'string' OR v_value ->> 'handler' = '' THEN
                RETURN QUERY SELECT v_at || '.handler', 'handler must be a non-empty string';
            END IF;

            IF v_value ? 'params' THEN
                IF jsonb_typeof(v_value -> 'params') <> 'object' THEN
                    RETURN QUERY SELECT v_at || '.params', 'params must be a JSON object';
                ELSE
                    -- every string anywhere inside params, with its path
                    RETURN QUERY
                        WITH RECURSIVE walk (at, val) AS (
                            SELECT v_at || '.params', v_value -> 'params'
                            UNION ALL
                            SELECT w.at || c.step, c.val
                            FROM walk AS w
                            CROSS JOIN LATERAL (
                                SELECT orch8.sequence_path_key(o.key) AS step, o.value AS val
                                FROM jsonb_each(
                                    CASE WHEN jsonb_typeof(w.val) = 'object' THEN w.val END
                                ) AS o
                                UNION ALL
                                SELECT '[' || (a.n - 1) || ']', a.value
                                FROM jsonb_array_elements(
                                    CASE WHEN jsonb_typeof(w.val) = 'array' THEN w.val END
                                ) WITH ORDINALITY AS a (value, n)
                            ) AS c
                        )
                        SELECT w.at, t.problem
                        FROM walk AS w
                        CROSS JOIN LATERAL orch8.sequence_template_problems(w.val #>> '{}')
                            AS t (problem)
                        WHERE jsonb_typeof(w.val) = 'string';
                END IF;
            END IF;

            IF v_value ? 'timeout'
               AND coalesce(orch8.sequence_json_integer(v_value -> 'timeout') < 1, true) THEN
                RETURN QUERY SELECT v_at || '.timeout',
                    'timeout must be a positive integer (milliseconds)';
            END IF;

            IF v_value ? 'retry' THEN
                v_retry := v_value -> 'retry';
                IF jsonb_typeof(v_retry) <> 'object' THEN
                    RETURN QUERY SELECT v_at || '.retry', 'retry must be a JSON object';
                ELSE
                    RETURN QUERY
                        SELECT v_at || '.retry' || orch8.sequence_path_key(k.k), 'unknown field'
                        FROM jsonb_object_keys(v_retry) AS k (k)
                        WHERE k.k <> ALL (c_retry_fields)
                        ORDER BY k.k;
                    IF v_retry ? 'max_attempts' AND coalesce(
                        orch8.sequence_json_integer(v_retry -> 'max_attempts')
                        NOT BETWEEN 1 AND 100, true
                    ) THEN
                        RETURN QUERY SELECT v_at || '.retry.max_attempts',
                            'max_attempts must be an integer from 1 to 100';
                    END IF;
                    v_initial := orch8.sequence_json_integer(v_retry -> 'initial_backoff');
                    IF v_retry ? 'initial_backoff' AND coalesce(v_initial < 0, true) THEN
                        RETURN QUERY SELECT v_at || '.retry.initial_backoff',
                            'initial_backoff must be an integer >= 0 (milliseconds)';
                        v_initial := NULL;
                    END IF;
                    IF v_retry ? 'max_backoff' AND coalesce(
                        orch8.sequence_json_integer(v_retry -> 'max_backoff')
                        < coalesce(v_initial, 0), true
                    ) THEN
                        RETURN QUERY SELECT v_at || '.retry.max_backoff',
                            'max_backoff must be an integer >= initial_backoff (milliseconds)';
                    END IF;
                    IF v_retry ? 'backoff_multiplier' AND coalesce(
                        orch8.sequence_json_number(v_retry -> 'backoff_multiplier') < 1, true
                    ) THEN
                        RETURN QUERY SELECT v_at || '.retry.backoff_multiplier',
                            'backoff_multiplier must be a number >= 1';
                    END IF;
                    IF v_retry ? 'retry_if' AND jsonb_typeof(v_retry -> 'retry_if') <> 'string' THEN
                        RETURN QUERY SELECT v_at || '.retry.retry_if',
                            'retry_if must be a string (an expression)';
                    END IF;
                    IF v_retry ? 'non_retryable_codes' AND (
                        jsonb_typeof(v_retry -> 'non_retryable_codes') <> 'array'
                        OR EXISTS (
                            SELECT 1
                            FROM jsonb_array_elements(v_retry -> 'non_retryable_codes') AS e
                            WHERE jsonb_typeof(e.value) <> 'string'
                        )
                    ) THEN
                        RETURN QUERY SELECT v_at || '.retry.non_retryable_codes',
                            'non_retryable_codes must be an array of strings';
                    END IF;
                END IF;
            END IF;

            RETURN QUERY
                SELECT v_at || orch8.sequence_path_key(k.k), 'unknown field'
                FROM jsonb_object_keys(v_value) AS k (k)
                WHERE k.k <> ALL (c_step_fields)
                ORDER BY k.k;

        WHEN 'parallel', 'race' THEN
            IF NOT v_value ? 'branches' THEN
                RETURN QUERY SELECT v_at || '.branches',
                    'branches is required (an array of arrays of blocks)';
            ELSIF jsonb_typeof(v_value -> 'branches') <> 'array'
                  OR jsonb_array_length(v_value -> 'branches') = 0 THEN
                RETURN QUERY SELECT v_at || '.branches',
                    'branches must be a non-empty array of arrays of blocks';
            ELSIF jsonb_array_length(v_value -> 'branches') > c_max_branches THEN
                RETURN QUERY SELECT v_at || '.branches',
                    format('more than %s branches', c_max_branches);
            ELSE
                SELECT jsonb_agg(jsonb_build_object(
                    'kind', 'list', 'path', v_at || '.branches[' || (b.n - 1) || ']',
                    'value', b.value) ORDER BY b.n)
                INTO v_children
                FROM jsonb_array_elements(v_value -> 'branches') WITH ORDINALITY AS b (value, n);
            END IF;
            IF v_type = 'race' AND v_value ? 'semantics' AND NOT coalesce(
                v_value -> 'semantics' IN ('"first_to_resolve"', '"first_to_succeed"'), false
            ) THEN
                RETURN QUERY SELECT v_at || '.semantics',
                    'semantics must be first_to_resolve or first_to_succeed';
            END IF;

        WHEN 'loop', 'for_each' THEN
            v_key := CASE v_type WHEN 'loop' THEN 'condition' ELSE 'collection' END;
            IF NOT coalesce(
                jsonb_typeof(v_value -> v_key) = 'string' AND v_value ->> v_key <> '', false
            ) THEN
                RETURN QUERY SELECT v_at || '.' || v_key,
                    v_key || ' is required (a non-empty string)';
            END IF;
            IF v_type = 'for_each' AND v_value ? 'item_var' AND NOT coalesce(
                jsonb_typeof(v_value -> 'item_var') = 'string' AND v_value ->> 'item_var' <> '',
                false
            ) THEN
                RETURN QUERY SELECT v_at || '.item_var', 'item_var must be a non-empty string';
            END IF;
            IF v_value ? 'max_iterations' AND coalesce(
                orch8.sequence_json_integer(v_value -> 'max_iterations')
                NOT BETWEEN 1 AND 100000, true
            ) THEN
                RETURN QUERY SELECT v_at || '.max_iterations',
                    'max_iterations must be an integer from 1 to 100000';
            END IF;
            IF v_value ? 'body' THEN
                v_children := jsonb_build_array(jsonb_build_object(
                    'kind', 'list', 'path', v_at || '.body', 'value', v_value -> 'body'));
            ELSE
                RETURN QUERY SELECT v_at || '.body', 'body is required (an array of blocks)';
            END IF;

        WHEN 'router' THEN
            IF NOT v_value ? 'routes' THEN
                RETURN QUERY SELECT v_at || '.routes',
                    'routes is required (an array of {condition, blocks})';
            ELSIF jsonb_typeof(v_value -> 'routes') <> 'array' THEN
                RETURN QUERY SELECT v_at || '.routes',
                    'routes must be an array of {condition, blocks}';
            ELSE
                FOR v_item, v_i IN
                    SELECT r.value, r.n - 1
                    FROM jsonb_array_elements(v_value -> 'routes') WITH ORDINALITY AS r (value, n)
                LOOP
                    v_item_at := v_at || '.routes[' || v_i || ']';
                    IF jsonb_typeof(v_item) <> 'object' THEN
                        RETURN QUERY SELECT v_item_at,
                            'a route must be a JSON object {condition, blocks}';
                        CONTINUE;
                    END IF;
                    IF NOT coalesce(
                        jsonb_typeof(v_item -> 'condition') = 'string'
                        AND v_item ->> 'condition' <> '', false
                    ) THEN
                        RETURN QUERY SELECT v_item_at || '.condition',
                            'condition is required (a non-empty string)';
                    END IF;
                    IF v_item ? 'blocks' THEN
                        v_children := v_children || jsonb_build_array(jsonb_build_object(
                            'kind', 'list', 'path', v_item_at || '.blocks',
                            'value', v_item -> 'blocks'));
                    ELSE
                        RETURN QUERY SELECT v_item_at || '.blocks',
                            'blocks is required (an array of blocks)';
                    END IF;
                END LOOP;
            END IF;
            IF v_value ? 'default' THEN
                v_children := v_children || jsonb_build_array(jsonb_build_object(
                    'kind', 'list', 'path', v_at || '.default', 'value', v_value -> 'default'));
            END IF;

        WHEN 'try_catch' THEN
            FOREACH v_key IN ARRAY ARRAY['try_block', 'catch_block', 'finally_block'] LOOP
                IF v_value ? v_key THEN
                    v_children := v_children || jsonb_build_array(jsonb_build_object(
                        'kind', 'list', 'path', v_at || '.' || v_key, 'value', v_value -> v_key));
                ELSIF v_key <> 'finally_block' THEN
                    RETURN QUERY SELECT v_at || '.' || v_key,
                        v_key || ' is required (an array of blocks)';
                END IF;
            END LOOP;

        WHEN 'sub_sequence' THEN
            IF NOT coalesce(
                jsonb_typeof(v_value -> 'sequence_name') = 'string'
                AND v_value ->> 'sequence_name' ~ '^[A-Za-z0-9_.-]{1,200}$', false
            ) THEN
                RETURN QUERY SELECT v_at || '.sequence_name',
                    'sequence_name is required (1 to 200 characters among A-Z a-z 0-9 _ . -)';
            END IF;
            IF v_value ? 'version'
               AND coalesce(orch8.sequence_json_integer(v_value -> 'version') < 1, true) THEN
                RETURN QUERY SELECT v_at || '.version', 'version must be a positive integer';
            END IF;
            IF v_value ? 'input' AND jsonb_typeof(v_value -> 'input') <> 'object' THEN
                RETURN QUERY SELECT v_at || '.input', 'input must be a JSON object';
            END IF;

        WHEN 'saga' THEN
            IF NOT v_value ? 'steps' THEN
                RETURN QUERY SELECT v_at || '.steps',
                    'steps is required (an array of {id, action, compensation})';
            ELSIF jsonb_typeof(v_value -> 'steps') <> 'array'
                  OR jsonb_array_length(v_value -> 'steps') = 0 THEN
                RETURN QUERY SELECT v_at || '.steps',
                    'steps must be a non-empty array of {id, action, compensation}';
            ELSE
                FOR v_item, v_i IN
                    SELECT s.value, s.n - 1
                    FROM jsonb_array_elements(v_value -> 'steps') WITH ORDINALITY AS s (value, n)
                LOOP
                    v_item_at := v_at || '.steps[' || v_i || ']';
                    IF jsonb_typeof(v_item) <> 'object' THEN
                        RETURN QUERY SELECT v_item_at,
                            'a saga step must be a JSON object {id, action, compensation}';
                        CONTINUE;
                    END IF;
                    IF NOT coalesce(
                        jsonb_typeof(v_item -> 'id') = 'string' AND v_item ->> 'id' <> '', false
                    ) THEN
                        RETURN QUERY SELECT v_item_at || '.id',
                            'id is required (a non-empty string)';
                    END IF;
                    IF NOT v_item ? 'action' THEN
                        RETURN QUERY SELECT v_item_at || '.action',
                            'action is required (a block)';
                    END IF;
                    FOREACH v_key IN ARRAY ARRAY['action', 'compensation'] LOOP
                        IF v_item ? v_key THEN
                            v_children := v_children || jsonb_build_array(jsonb_build_object(
                                'kind', 'block', 'path', v_item_at || '.' || v_key,
                                'value', v_item -> v_key));
                        END IF;
                    END LOOP;
                END LOOP;
            END IF;
        END CASE;

        IF jsonb_array_length(v_children) > 0 THEN
            IF v_depth >= c_max_depth THEN
                RETURN QUERY SELECT v_at,
                    format('blocks are nested more than %s levels deep', c_max_depth);
            ELSE
                FOR v_i IN REVERSE jsonb_array_length(v_children) - 1 .. 0 LOOP
                    v_top := v_top + 1;
                    v_stack[v_top] := (v_children -> v_i)
                        || jsonb_build_object('depth', v_depth + 1, 'tree', v_tree);
                END LOOP;
            END IF;
        END IF;
    END LOOP;

    -- 3. Block ids are unique within each tree ------------------------------------------
    RETURN QUERY
        SELECT d.at || '.id',
               format('duplicate block id "%s" (first used at %s)', d.block_id, d.first_at)
        FROM (
            SELECT
                u.block_id,
                u.at,
                u.n,
                first_value(u.at) OVER same_id AS first_at,
                row_number() OVER same_id AS nth
            FROM unnest(v_id_trees, v_ids, v_id_paths) WITH ORDINALITY AS u (tree, block_id, at, n)
            WINDOW same_id AS (PARTITION BY u.tree, u.block_id ORDER BY u.n)
        ) AS d
        WHERE d.nth > 1
        ORDER BY d.n;

    -- 4. Declared invariants ------------------------------------------------------------
    IF p_definition ? 'invariants' THEN
        IF jsonb_typeof(p_definition -> 'invariants') <> 'array' THEN
            RETURN QUERY SELECT '$.invariants', 'invariants must be an array';
            RETURN;
        END IF;
        FOR v_item, v_i IN
            SELECT e.value, e.n - 1
            FROM jsonb_array_elements(p_definition -> 'invariants') WITH ORDINALITY AS e (value, n)
        LOOP
            v_item_at := '$.invariants[' || v_i || ']';
            IF jsonb_typeof(v_item) <> 'object' THEN
                RETURN QUERY SELECT v_item_at,
                    'an invariant must be a JSON object {name, type, kind, commit_guard}';
                CONTINUE;
            END IF;
            RETURN QUERY
                SELECT v_item_at || orch8.sequence_path_key(k.k), 'unknown field'
                FROM jsonb_object_keys(v_item) AS k (k)
                WHERE k.k <> ALL (c_invariant_fields)
                ORDER BY k.k;

            IF NOT coalesce(
                jsonb_typeof(v_item -> 'name') = 'string' AND v_item ->> 'name' <> '', false
            ) THEN
                RETURN QUERY SELECT v_item_at || '.name', 'name is required (a non-empty string)';
            ELSIF v_item ->> 'name' = ANY (v_invariant_names) THEN
                RETURN QUERY SELECT v_item_at || '.name',
                    format('duplicate invariant name "%s"', v_item ->> 'name');
            ELSE
                v_invariant_names := v_invariant_names || (v_item ->> 'name');
            END IF;

            v_type := CASE
                WHEN jsonb_typeof(v_item -> 'type') = 'string' THEN v_item ->> 'type'
            END;
            IF NOT v_item ? 'type' THEN
                RETURN QUERY SELECT v_item_at || '.type',
                    'type is required (one of ' || array_to_string(c_invariant_types, ', ') || ')';
            ELSIF v_type IS NULL OR v_type <> ALL (c_invariant_types) THEN
                RETURN QUERY SELECT v_item_at || '.type',
                    format('unknown invariant type %s (known: %s)',
                           v_item -> 'type', array_to_string(c_invariant_types, ', '));
                v_type := NULL;
            END IF;

            IF v_type = 'effect_at_most_once' AND NOT v_item ? 'kind' THEN
                RETURN QUERY SELECT v_item_at || '.kind',
                    'kind is required for effect_at_most_once (one of '
                    || array_to_string(c_effect_kinds, ', ') || ')';
            ELSIF v_item ? 'kind' AND NOT coalesce(
                jsonb_typeof(v_item -> 'kind') = 'string'
                AND v_item ->> 'kind' = ANY (c_effect_kinds), false
            ) THEN
                RETURN QUERY SELECT v_item_at || '.kind',
                    format('unknown effect kind %s (known: %s)',
                           v_item -> 'kind', array_to_string(c_effect_kinds, ', '));
            END IF;

            IF v_item ? 'commit_guard' THEN
                IF jsonb_typeof(v_item -> 'commit_guard') <> 'boolean' THEN
                    RETURN QUERY SELECT v_item_at || '.commit_guard',
                        'commit_guard must be true or false';
                ELSIF (v_item -> 'commit_guard') = 'true'
                      AND v_type IS DISTINCT FROM 'effect_at_most_once' AND v_type IS NOT NULL THEN
                    RETURN QUERY SELECT v_item_at || '.commit_guard',
                        'only effect_at_most_once may have commit_guard';
                END IF;
            END IF;
        END LOOP;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.validate_sequence(jsonb) IS
'Every problem of a sequence definition, one row per problem: (path, message), path being '
'JSON-path-like ($.blocks[1].retry.max_attempts). No rows: the definition is valid. Checks '
'the top-level fields, the block trees (blocks, on_failure, on_cancel; ids unique per tree; '
'types step, parallel, race, loop, for_each, router, try_catch, sub_sequence, saga; nesting '
'<= 64; <= 5000 blocks), steps (handler, params templates, timeout, retry, unknown '
'fields) and declared invariants. Rows come in document order; duplicate ids after the '
'other block problems, invariants last.';

CREATE OR REPLACE FUNCTION orch8.create_sequence(
    p_tenant_id text,
    p_namespace text,
    p_name text,
    p_definition jsonb
)
RETURNS orch8.sequences
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer;
    v_problems jsonb;
    v_row orch8.sequences;
    v_invariant jsonb;
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id = '' THEN
        RAISE EXCEPTION 'create_sequence needs a tenant id' USING ERRCODE = 'O8008';
    END IF;
    IF p_namespace IS NULL OR p_namespace !~ '^[A-Za-z0-9_.-]{1,100}$' THEN
        RAISE EXCEPTION 'invalid sequence namespace %: use 1 to 100 characters among '
                        'A-Z a-z 0-9 _ . -', coalesce(quote_literal(p_namespace), 'NULL')
            USING ERRCODE = 'O8008';
    END IF;
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.-]{1,200}$' THEN
        RAISE EXCEPTION 'invalid sequence name %: use 1 to 200 characters among '
                        'A-Z a-z 0-9 _ . -', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'O8008';
    END IF;

    SELECT
        count(*),
        jsonb_agg(jsonb_build_object('path', v.path, 'message', v.message) ORDER BY v.n)
    INTO v_count, v_problems
    FROM orch8.validate_sequence(p_definition) WITH ORDINALITY AS v (path, message, n);
    IF v_count > 0 THEN
        RAISE EXCEPTION 'sequence definition has % problem(s)', v_count
            USING ERRCODE = 'O8008',
                  DETAIL = v_problems::text,
                  HINT = 'the detail is a JSON array of {path, message}; '
                         'orch8.validate_sequence(definition) lists the same as rows';
    END IF;

    -- One creator at a time per name: the next statement's snapshot (READ COMMITTED) sees
    -- the version the previous holder committed.
    PERFORM pg_advisory_xact_lock(
        hashtextextended('sequence|' || p_tenant_id || '|' || p_namespace || '|' || p_name, 0)
    );
    INSERT INTO orch8.sequences AS s (tenant_id, namespace, name, version, definition)
    SELECT
        p_tenant_id,
        p_namespace,
        p_name,
        coalesce(max(q.version), 0) + 1,
        p_definition - ARRAY['id', 'tenant_id', 'namespace', 'name', 'version', 'created_at']
    FROM orch8.sequences AS q
    WHERE q.tenant_id = p_tenant_id AND q.namespace = p_namespace AND q.name = p_name
    RETURNING s.* INTO v_row;

    FOR v_invariant IN SELECT jsonb_array_elements(p_definition -> 'invariants') LOOP
        PERFORM orch8.declare_invariant(
            p_tenant_id,
            v_invariant ->> 'name',
            jsonb_strip_nulls(jsonb_build_object(
                'type', v_invariant -> 'type', 'kind', v_invariant -> 'kind'
            )),
            coalesce((v_invariant ->> 'commit_guard')::boolean, false),
            p_sequence_id => v_row.id,
            p_sequence_version => v_row.version
        );
    END LOOP;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.create_sequence(text, text, text, jsonb) IS
'Validate a definition and store it as the next version of (tenant, namespace, name): 1 for '
'a new name, else max(version) + 1, serialised per name by pg_advisory_xact_lock on '
'sequence|tenant|namespace|name. Any problem: O8008 "sequence definition has N '
'problem(s)" with DETAIL the JSON array of {path, message}, nothing stored. Bad tenant, '
'namespace or name: O8008. The document''s own id, tenant_id, namespace, name, version and '
'created_at are dropped. Each declared invariant is declared for the new version.';

CREATE OR REPLACE FUNCTION orch8.get_sequence(
    p_tenant_id text,
    p_namespace text,
    p_name text,
    p_version integer DEFAULT NULL
)
RETURNS orch8.sequences
LANGUAGE sql
STABLE
AS $$
    SELECT s.*
    FROM orch8.sequences AS s
    WHERE
        s.tenant_id = p_tenant_id
        AND s.namespace = p_namespace
        AND s.name = p_name
        AND (p_version IS NULL OR s.version = p_version)
    ORDER BY s.version DESC
    LIMIT 1
$$;

COMMENT ON FUNCTION orch8.get_sequence(text, text, text, integer) IS
'One version of a sequence, the latest when version is NULL; a row of NULLs when there is '
'none (test id IS NULL).';
