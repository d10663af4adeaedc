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

-- The template grammar, once: the runner (orch8_py/templates.py, through the generated
-- orch8_py/rules.py) and the validator below use these two patterns.

CREATE OR REPLACE FUNCTION orch8.template_roots()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['data', 'config', 'outputs', 'instance_id', 'runtime'] $$;

COMMENT ON FUNCTION orch8.template_roots() IS
'The roots a {{ expr }} placeholder in a step''s params may start with: data, config, '
'outputs, instance_id, runtime.';

CREATE OR REPLACE FUNCTION orch8.verify_template_roots()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['effect', 'params', 'data', 'config', 'instance_id'] $$;

COMMENT ON FUNCTION orch8.verify_template_roots() IS
'The roots a {{ expr }} placeholder in a verifier''s lookup (verify.http) may start with: '
'effect (the receipt: id, idempotency_key, provider_receipt_id, attempt, block_id), '
'params (the step''s params as sent), data, config, instance_id.';

CREATE OR REPLACE FUNCTION orch8.verify_expression_roots()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['response', 'effect', 'params', 'data', 'config'] $$;

COMMENT ON FUNCTION orch8.verify_expression_roots() IS
'The names verify.applied_if and verify.not_applied_if may use: response (the lookup''s '
'output: status, headers, json, body), effect, params, data, config.';

CREATE OR REPLACE FUNCTION orch8.template_placeholder_pattern()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT '\{\{(.*?)\}\}' $$;

COMMENT ON FUNCTION orch8.template_placeholder_pattern() IS
'The regular expression of one placeholder: {{, the shortest text up to the next }}, }} '
'(group 1 is the expression). A {{ left after removing every match is unclosed. The same '
'pattern works in PostgreSQL and Python (with re.DOTALL).';

CREATE OR REPLACE FUNCTION orch8.template_expression_pattern(
    p_roots text[] DEFAULT orch8.template_roots()
)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT '^(' || array_to_string(p_roots, '|') || ')'
           || '((?:\.[A-Za-z0-9_-]+)*)'
           || '(?:\s*\|\s*''([^'']*)'')?$'
$$;

COMMENT ON FUNCTION orch8.template_expression_pattern(text[]) IS
'The regular expression an expression (trimmed of spaces, tabs and line breaks) must '
'match: one of p_roots (template_roots() for params, verify_template_roots() for a '
'verifier''s lookup; group 1), then .segment parts of A-Z a-z 0-9 _ - (group 2), then '
'optionally | ''fallback literal'' (group 3).';

CREATE OR REPLACE FUNCTION orch8.block_id_pattern()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT '^[A-Za-z0-9_-]+$'
$$;

COMMENT ON FUNCTION orch8.block_id_pattern() IS
'The characters a block id may hold: A-Z a-z 0-9 _ - (its length is the limit '
'block_id_chars). They are the characters a template path segment reaches '
'(outputs.<id>), and they leave / # [ ] . ~ free to join ids into execution paths '
'(docs/ARCHITECTURE.md). Checked by validate_sequence for new definitions only.';

CREATE OR REPLACE FUNCTION orch8.sequence_template_problems(
    p_text text, p_roots text[] DEFAULT orch8.template_roots()
)
RETURNS SETOF text
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_match text [];
    v_expr text;
    v_root text;
BEGIN
    FOR v_match IN
        SELECT m.m FROM regexp_matches(p_text, orch8.template_placeholder_pattern(), 'g') AS m (m)
    LOOP
        v_expr := btrim(v_match[1], E' \t\r\n');
        CONTINUE WHEN v_expr ~ orch8.template_expression_pattern(p_roots);
        v_root := substring(v_expr FROM '^[A-Za-z_][A-Za-z0-9_]*');
        IF v_expr = '' THEN
            RETURN NEXT 'empty template "{{ }}"';
        ELSIF v_root IS NULL OR v_root <> ALL (p_roots) THEN
            RETURN NEXT format(
                'template "{{ %s }}" has an unknown root %s (roots: %s)',
                v_expr, coalesce('"' || v_root || '"', '(none)'),
                array_to_string(p_roots, ', '));
        ELSE
            RETURN NEXT format(
                'template "{{ %s }}" is malformed: expected root.segment.segment..., '
                'optionally followed by | ''literal''', v_expr);
        END IF;
    END LOOP;
    IF strpos(regexp_replace(p_text, orch8.template_placeholder_pattern(), '', 'g'), '{{') > 0
    THEN
        RETURN NEXT 'unclosed template: "{{" without a matching "}}"';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_template_problems(text, text[]) IS
'The problems of the {{ expr }} placeholders in one string, one per bad placeholder, in '
'order, then one for an unclosed {{. The grammar is template_placeholder_pattern() and '
'template_expression_pattern(p_roots).';

-- The language: every field, and whether this engine runs it ------------------------------

CREATE OR REPLACE FUNCTION orch8.sequence_language()
RETURNS TABLE (scope text, field text, supported boolean, note text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    -- the document
    ('definition', 'blocks', true, 'a non-empty array of blocks, run in order'),
    ('definition', 'invariants', true, 'declared invariants'),
    ('definition', 'interceptors', false, 'not supported yet'),
    ('definition', 'input_schema', true,
     'a JSON Schema the instance''s data must match when it starts'),
    ('definition', 'output_schema', false, 'not supported yet'),
    ('definition', 'sla', true,
     'a duration from when the instance is due to start: not ended by then, it missed its '
     'sla (an instance.sla_breached webhook; on_sla_breach says what else)'),
    ('definition', 'on_sla_breach', true,
     'fail (the default: open blocks are withdrawn and the instance fails with code sla, '
     'running on_failure) or notify (the webhook only; the instance goes on)'),
    ('definition', 'concurrency_key', true,
     'a key ({{ data.x }}, {{ config.x }} templates, rendered when the instance is created) '
     'each of its steps that declares none holds while it runs'),
    ('definition', 'max_concurrency', true,
     'how many steps of the tenant may hold the definition''s concurrency_key at once'),
    ('definition', 'on_failure', true,
     'blocks run when the instance fails ({{ error }} bound), before it ends failed'),
    ('definition', 'on_cancel', true,
     'blocks run when the instance is cancelled, before it ends cancelled'),
    ('definition', 'deprecated', false, 'not supported yet'),
    ('definition', 'status', false, 'not supported yet'),
    ('definition', 'id', false, 'set by create_sequence, not by the document'),
    ('definition', 'tenant_id', false, 'set by create_sequence, not by the document'),
    ('definition', 'namespace', false, 'set by create_sequence, not by the document'),
    ('definition', 'name', false, 'set by create_sequence, not by the document'),
    ('definition', 'version', false, 'set by create_sequence, not by the document'),
    ('definition', 'created_at', false, 'set by create_sequence, not by the document'),
    -- block types
    ('block_type', 'step', true, 'runs one handler'),
    ('block_type', 'parallel', true, 'runs its branches at once'),
    ('block_type', 'race', true, 'runs its branches at once; the first to end wins'),
    ('block_type', 'loop', true, 'runs its body while a condition holds'),
    ('block_type', 'for_each', true, 'runs its body once per item of a collection'),
    ('block_type', 'router', true, 'runs the blocks of the first route whose condition holds'),
    ('block_type', 'try_catch', true, 'runs catch blocks when the try blocks fail, then finally'),
    ('block_type', 'sub_sequence', true, 'runs another sequence as a child instance'),
    ('block_type', 'saga', true,
     'runs its blocks in order; when one fails, compensates the completed steps'),
    ('block_type', 'sleep', true, 'waits for a duration, holding no runner'),
    ('block_type', 'wait_for_signal', true, 'waits for a named signal, with a timeout'),
    ('block_type', 'wait_for_input', true,
     'waits for a person to answer a prompt with one of its choices, with a timeout'),
    ('block_type', 'a_b_split', false, 'not supported yet'),
    ('block_type', 'cancellation_scope', false, 'not supported yet'),
    -- a step
    ('step', 'type', true, 'step'),
    ('step', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('step', 'handler', true, 'the handler to run'),
    ('step', 'params', true, 'the handler''s parameters, with {{ }} templates'),
    ('step', 'timeout', true, 'milliseconds the handler may run'),
    ('step', 'retry', true, 'the retry policy'),
    ('step', 'provider_idempotency', true,
     'the provider deduplicates by the idempotency key: one key for every attempt, and a '
     'retry after an ambiguous outcome resends under it'),
    ('step', 'verify', true, 'how to settle an unknown outcome without a person'),
    ('step', 'delay', true,
     'a duration to wait before the first attempt (ms, or 30s, 15m, 2h, 3d)'),
    ('step', 'rate_limit_key', true,
     'the tenant''s rate limit (orch8.set_rate_limit) the step takes a token from before it '
     'starts; without one it is deferred to when one will be, never failed'),
    ('step', 'concurrency_key', true,
     'a key ({{ data.x }}, {{ config.x }}, {{ instance_id }} templates, rendered when the '
     'step becomes ready) the step holds while it runs'),
    ('step', 'max_concurrency', true,
     'how many steps of the tenant may hold its concurrency_key at once'),
    ('step', 'send_window', true,
     'days and hours in a time zone when the step may start; outside them it waits for '
     'the next opening (the first attempt and each retry)'),
    ('step', 'context_access', false, 'not supported yet'),
    ('step', 'cancellable', false, 'not supported yet'),
    ('step', 'wait_for_input', false,
     'not a step field here: a person''s answer is the wait_for_input block'),
    ('step', 'queue_name', false, 'not supported yet'),
    ('step', 'deadline', true,
     'a duration from when the step starts (delay included): not completed by then, it '
     'fails with code deadline'),
    ('step', 'on_deadline_breach', true, 'what a missed deadline does: fail (the only one)'),
    ('step', 'fallback_handler', false, 'not supported yet'),
    ('step', 'cache_key', false, 'not supported yet'),
    ('step', 'output_schema', true,
     'a JSON Schema the handler''s output must match (else a failure no retry repairs)'),
    ('step', 'when', true, 'an expression: when false, the step is skipped'),
    ('step', 'compensation', true, 'in a saga: the handler call that undoes this step'),
    -- a step's send window
    ('send_window', 'timezone', true,
     'the time zone of days, start and end (pg_timezone_names)'),
    ('send_window', 'days', true,
     'the days it is open: mon tue wed thu fri sat sun (all when omitted)'),
    ('send_window', 'start', true, 'the local time it opens, HH:MM'),
    ('send_window', 'end', true,
     'the local time it closes, HH:MM up to 24:00, after start (not across midnight)'),
    -- a step's retry policy
    ('retry', 'max_attempts', true, 'attempts in all, the first included'),
    ('retry', 'initial_backoff', true, 'milliseconds before the second attempt'),
    ('retry', 'max_backoff', true, 'the longest wait, in milliseconds'),
    ('retry', 'backoff_multiplier', true, 'how the wait grows per attempt'),
    ('retry', 'non_retryable_codes', true, 'error codes that fail the step at once'),
    ('retry', 'on_ambiguous', true,
     'after an ambiguous outcome: same_key, new_attempt or settle (orch8.ambiguity_modes)'),
    ('retry', 'retry_if', true,
     'an expression over error (message, code, attempt): false fails the step at once'),
    -- composite blocks
    ('parallel', 'type', true, 'parallel'),
    ('parallel', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('parallel', 'branches', true, 'an array of branches, each a non-empty array of blocks'),
    ('parallel', 'on_branch_failure', true,
     'fail (default: the first failed branch fails the block and cancels the others) or '
     'continue (every branch runs; the output lists each one''s output or error)'),
    ('race', 'type', true, 'race'),
    ('race', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('race', 'branches', true, 'two or more branches, each a non-empty array of blocks'),
    ('race', 'semantics', true,
     'first_to_resolve (default: the first branch to complete or fail decides) or '
     'first_to_succeed (the first to complete; fails when every branch failed)'),
    ('loop', 'type', true, 'loop'),
    ('loop', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('loop', 'condition', true, 'an expression asked before each iteration'),
    ('loop', 'body', true, 'the blocks of one iteration ({{ iteration }} is its number)'),
    ('loop', 'max_iterations', true,
     'at most this many iterations (default 1000): a condition still true then fails the loop'),
    ('loop', 'break_on', true, 'an expression asked after each iteration: true ends the loop'),
    ('for_each', 'type', true, 'for_each'),
    ('for_each', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('for_each', 'collection', true, 'an expression whose value is the list of items'),
    ('for_each', 'body', true, 'the blocks run for one item'),
    ('for_each', 'item_var', true, 'the name the item has in the body (default item)'),
    ('for_each', 'index_var', true, 'the name of the item''s position (default index)'),
    ('for_each', 'max_iterations', true,
     'at most this many items (default 1000): a longer collection fails the block'),
    ('for_each', 'concurrency', true, 'how many items run at once (default 1)'),
    ('router', 'type', true, 'router'),
    ('router', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('router', 'routes', true, 'an array of {condition, blocks}, asked in order'),
    ('router', 'default', true, 'the blocks run when no route''s condition holds'),
    ('route', 'condition', true, 'an expression'),
    ('route', 'blocks', true, 'the blocks run when it is the first that holds'),
    ('try_catch', 'type', true, 'try_catch'),
    ('try_catch', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('try_catch', 'try_block', true, 'the blocks tried'),
    ('try_catch', 'catch_block', true,
     'the blocks run when the try blocks fail ({{ error }}: message, code, path)'),
    ('try_catch', 'finally_block', true, 'the blocks run after the try or catch blocks'),
    ('saga', 'type', true, 'saga'),
    ('saga', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('saga', 'blocks', true, 'the blocks run in order; its steps may declare a compensation'),
    ('sub_sequence', 'type', true, 'sub_sequence'),
    ('sub_sequence', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('sub_sequence', 'sequence_name', true, 'the sequence the child instance runs'),
    ('sub_sequence', 'namespace', true, 'its namespace (default: the parent''s)'),
    ('sub_sequence', 'version', true, 'its version (default: the latest when the child starts)'),
    ('sub_sequence', 'input', true, 'the child''s data, with {{ }} templates'),
    ('sleep', 'type', true, 'sleep'),
    ('sleep', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('sleep', 'duration', true, 'how long (ms, or 30s, 15m, 2h, 3d, 1h30m)'),
    ('wait_for_signal', 'type', true, 'wait_for_signal'),
    ('wait_for_signal', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('wait_for_signal', 'signal', true,
     'the signal''s name (a custom one: not cancel, pause, resume, update_context, input)'),
    ('wait_for_signal', 'timeout', true, 'how long to wait (a duration); none: forever'),
    ('wait_for_signal', 'on_timeout', true,
     'the blocks run when it times out (without them, a timeout fails the block)'),
    ('wait_for_input', 'type', true, 'wait_for_input'),
    ('wait_for_input', 'id', true, 'unique among the blocks; A-Z a-z 0-9 _ -'),
    ('wait_for_input', 'prompt', true, 'what the person is asked, with {{ }} templates'),
    ('wait_for_input', 'choices', true, 'the answers they may give: 1 to 20 distinct strings'),
    ('wait_for_input', 'timeout', true, 'how long to wait (a duration); none: forever'),
    ('wait_for_input', 'on_timeout', true,
     'the blocks run when nobody answered in time: escalation (without them, a timeout '
     'fails the block)'),
    ('compensation', 'handler', true, 'the handler that undoes the step'),
    ('compensation', 'params', true, 'its parameters, with {{ }} templates'),
    ('compensation', 'timeout', true, 'milliseconds the handler may run'),
    ('compensation', 'retry', true, 'its retry policy'),
    -- a step's verifier: exactly one of http, replay, handler
    ('verify', 'http', true, 'a lookup request {method, url, headers} with {{ }} templates'),
    ('verify', 'applied_if', true,
     'http: an expression over response, effect, params that is true when it happened'),
    ('verify', 'not_applied_if', true,
     'http: an expression that is true when it did not happen (else inconclusive)'),
    ('verify', 'receipt_path', true,
     'http: where the provider receipt id is in the lookup''s output, e.g. json.id'),
    ('verify', 'replay', true,
     'true: resend the identical request under the same key (needs provider_idempotency)'),
    ('verify', 'handler', true, 'true: the Python verifier registered beside the handler'),
    ('verify', 'schedule', true,
     'milliseconds before each try; after the last inconclusive one, escalated'),
    ('verify', 'on_verified', true, 'continue (default) or stop'),
    ('verify', 'on_not_applied', true, 'retry (default, within retry.max_attempts) or stop'),
    ('verify_http', 'method', true, 'GET (default) or POST'),
    ('verify_http', 'url', true, 'the lookup URL'),
    ('verify_http', 'headers', true, 'an object of header name -> string'),
    -- a declared invariant
    ('invariant', 'name', true, 'unique among the invariants'),
    ('invariant', 'type', true, 'the rule'),
    ('invariant', 'kind', true, 'the effect kind it guards'),
    ('invariant', 'commit_guard', true, 'checked before dispatch'),
    ('invariant_type', 'effect_at_most_once', true,
     'a commit guard: identical content of this kind is dispatched at most once'),
    ('invariant_type', 'no_unknown_effects', false, 'not supported yet'),
    ('invariant_type', 'terminal_state_in', false, 'not supported yet'),
    ('invariant_type', 'output_path_present', false, 'not supported yet')
$$;

COMMENT ON FUNCTION orch8.sequence_language() IS
'Every field of the sequence language, by scope (definition, block_type, step, retry, '
'verify, verify_http, send_window, invariant, invariant_type, and each composite block type: '
'parallel, race, loop, for_each, router, route, try_catch, saga, sub_sequence, '
'compensation, sleep, wait_for_signal, wait_for_input), and whether this engine runs it. '
'validate_sequence accepts exactly the supported ones and refuses the others with their '
'note ("not supported yet"); a name not listed is "unknown".';

CREATE OR REPLACE FUNCTION orch8.sequence_field_problems(
    p_scope text, p_object jsonb, p_path text
)
RETURNS TABLE (path text, message text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT
        p_path || orch8.sequence_path_key(k.k),
        coalesce(k.k || ' is ' || l.note, 'unknown field')
    FROM jsonb_object_keys(p_object) AS k (k)
    LEFT JOIN orch8.sequence_language() AS l ON l.scope = p_scope AND l.field = k.k
    WHERE l.supported IS NOT true
    ORDER BY k.k
$$;

COMMENT ON FUNCTION orch8.sequence_field_problems(text, jsonb, text) IS
'The keys of an object that the language does not accept in p_scope: a known one as '
'"<key> is <note>" (not supported yet), any other as unknown field. Internal helper of '
'validate_sequence.';

-- validate_sequence, one helper per concern -----------------------------------------------

CREATE OR REPLACE FUNCTION orch8.sequence_top_problems(p_definition jsonb)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_field text;
BEGIN
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems('definition', p_definition, '$');
    IF NOT p_definition ? 'blocks' THEN
        RETURN QUERY SELECT '$.blocks', 'blocks is required (a non-empty array of blocks)';
    ELSIF jsonb_typeof(p_definition -> 'blocks') <> 'array'
          OR jsonb_array_length(p_definition -> 'blocks') = 0 THEN
        RETURN QUERY SELECT '$.blocks', 'blocks must be a non-empty array of blocks';
    ELSIF (SELECT count(*) FROM orch8.definition_blocks(p_definition))
          > orch8.limit_of('sequence_blocks') THEN
        RETURN QUERY SELECT '$.blocks',
            format('more than %s blocks', orch8.limit_of('sequence_blocks'));
    END IF;
    FOREACH v_field IN ARRAY ARRAY['on_failure', 'on_cancel'] LOOP
        IF p_definition ? v_field AND (jsonb_typeof(p_definition -> v_field) <> 'array'
                                       OR jsonb_array_length(p_definition -> v_field) = 0) THEN
            RETURN QUERY SELECT '$.' || v_field, v_field || ' must be a non-empty array of blocks';
        END IF;
    END LOOP;
    IF p_definition ? 'sla' THEN
        RETURN QUERY SELECT '$.sla', m
        FROM orch8.duration_problem(p_definition -> 'sla', 'sla') AS m WHERE m IS NOT NULL;
    END IF;
    IF p_definition ? 'on_sla_breach' THEN
        IF NOT coalesce(p_definition ->> 'on_sla_breach' IN ('fail', 'notify')
                        AND jsonb_typeof(p_definition -> 'on_sla_breach') = 'string', false) THEN
            RETURN QUERY SELECT '$.on_sla_breach', 'on_sla_breach must be fail or notify';
        ELSIF NOT p_definition ? 'sla' THEN
            RETURN QUERY SELECT '$.on_sla_breach', 'on_sla_breach needs an sla';
        END IF;
    END IF;
    -- a definition's key is rendered before the instance has an id
    RETURN QUERY SELECT * FROM orch8.flow_control_problems(p_definition, '$', ARRAY['data', 'config']);
    IF p_definition ? 'input_schema' AND jsonb_typeof(p_definition -> 'input_schema') <> 'object'
    THEN
        RETURN QUERY SELECT '$.input_schema', 'input_schema must be a JSON Schema (an object)';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_top_problems(jsonb) IS
'Problems of a definition''s top level: fields the language does not accept; blocks '
'missing, empty or not an array, or more than sequence_blocks at every depth; '
'concurrency_key and max_concurrency (flow_control_problems, templates over data and '
'config); sla (a duration) and on_sla_breach (fail or notify, with an sla); on_failure '
'and on_cancel not non-empty arrays; input_schema not an object (its being a JSON Schema '
'is checked by orch8_py before storing).';

CREATE OR REPLACE FUNCTION orch8.sequence_params_problems(
    p_params jsonb, p_path text, p_roots text[] DEFAULT orch8.template_roots()
)
RETURNS TABLE (path text, message text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    -- every string anywhere inside params, with its path
    WITH RECURSIVE walk (at, val) AS (
        SELECT p_path, p_params
        UNION ALL
        SELECT w.at || c.step, c.val
        FROM walk AS w
        CROSS JOIN LATERAL (
            SELECT orch8.sequence_path_key(o.key) AS step, o.value AS val
            FROM jsonb_each(CASE WHEN jsonb_typeof(w.val) = 'object' THEN w.val END) AS o
            UNION ALL
            SELECT '[' || (a.n - 1) || ']', a.value
            FROM jsonb_array_elements(
                CASE WHEN jsonb_typeof(w.val) = 'array' THEN w.val END
            ) WITH ORDINALITY AS a (value, n)
        ) AS c
    )
    SELECT w.at, t.problem
    FROM walk AS w
    CROSS JOIN LATERAL orch8.sequence_template_problems(w.val #>> '{}', p_roots) AS t (problem)
    WHERE jsonb_typeof(w.val) = 'string'
$$;

COMMENT ON FUNCTION orch8.sequence_params_problems(jsonb, text, text[]) IS
'The template problems of every string anywhere inside a step''s params, or a verifier''s '
'lookup (objects and arrays walked), each at its path, with the roots p_roots.';

CREATE OR REPLACE FUNCTION orch8.sequence_retry_problems(p_retry jsonb, p_path text)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_initial numeric := orch8.sequence_json_integer(p_retry -> 'initial_backoff');
BEGIN
    IF jsonb_typeof(p_retry) <> 'object' THEN
        RETURN QUERY SELECT p_path, 'retry must be a JSON object';
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems('retry', p_retry, p_path);
    IF p_retry ? 'max_attempts' AND coalesce(
        orch8.sequence_json_integer(p_retry -> 'max_attempts')
        NOT BETWEEN 1 AND orch8.limit_of('retry_max_attempts'), true
    ) THEN
        RETURN QUERY SELECT p_path || '.max_attempts',
            format('max_attempts must be an integer from 1 to %s',
                   orch8.limit_of('retry_max_attempts'));
    END IF;
    IF p_retry ? 'initial_backoff' AND coalesce(v_initial < 0, true) THEN
        RETURN QUERY SELECT p_path || '.initial_backoff',
            'initial_backoff must be an integer >= 0 (milliseconds)';
        v_initial := NULL;
    END IF;
    IF p_retry ? 'max_backoff' AND coalesce(
        orch8.sequence_json_integer(p_retry -> 'max_backoff') < coalesce(v_initial, 0), true
    ) THEN
        RETURN QUERY SELECT p_path || '.max_backoff',
            'max_backoff must be an integer >= initial_backoff (milliseconds)';
    END IF;
    IF p_retry ? 'backoff_multiplier' AND coalesce(
        orch8.sequence_json_number(p_retry -> 'backoff_multiplier') < 1, true
    ) THEN
        RETURN QUERY SELECT p_path || '.backoff_multiplier',
            'backoff_multiplier must be a number >= 1';
    END IF;
    IF p_retry ? 'on_ambiguous'
       AND coalesce(p_retry ->> 'on_ambiguous' <> ALL (orch8.ambiguity_modes()), true) THEN
        RETURN QUERY SELECT p_path || '.on_ambiguous', format(
            'on_ambiguous must be one of %s', array_to_string(orch8.ambiguity_modes(), ', '));
    END IF;
    IF p_retry ? 'non_retryable_codes' AND (
        jsonb_typeof(p_retry -> 'non_retryable_codes') <> 'array'
        OR EXISTS (
            SELECT 1 FROM jsonb_array_elements(p_retry -> 'non_retryable_codes') AS e
            WHERE jsonb_typeof(e.value) <> 'string'
        )
    ) THEN
        RETURN QUERY SELECT p_path || '.non_retryable_codes',
            'non_retryable_codes must be an array of strings';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_retry_problems(jsonb, text) IS
'Problems of a step''s retry object: its fields (language scope retry), max_attempts '
'1..retry_max_attempts, initial_backoff >= 0, max_backoff >= initial_backoff, '
'backoff_multiplier >= 1, non_retryable_codes an array of strings, on_ambiguous one of '
'ambiguity_modes() (same_key is checked against the step by sequence_step_problems).';

CREATE OR REPLACE FUNCTION orch8.sequence_verify_problems(p_step jsonb, p_path text)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_verify jsonb := p_step -> 'verify';
    v_http jsonb := p_step -> 'verify' -> 'http';
    v_methods text [];
    v_field text;
BEGIN
    IF jsonb_typeof(v_verify) <> 'object' THEN
        RETURN QUERY SELECT p_path, 'verify must be a JSON object';
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems('verify', v_verify, p_path);
    SELECT array_agg(m.m) INTO v_methods
    FROM unnest(orch8.verification_methods()) AS m (m) WHERE v_verify ? m.m;
    IF coalesce(cardinality(v_methods), 0) <> 1 THEN
        RETURN QUERY SELECT p_path, format('verify needs exactly one of %s',
                                           array_to_string(orch8.verification_methods(), ', '));
    END IF;
    IF jsonb_typeof(p_step -> 'handler') = 'string'
       AND NOT orch8.handler_has_side_effects(p_step ->> 'handler') THEN
        RETURN QUERY SELECT p_path, format(
            'verify settles side effects; handler "%s" has none', p_step ->> 'handler');
    END IF;

    IF v_verify ? 'http' THEN
        IF jsonb_typeof(v_http) <> 'object' THEN
            RETURN QUERY SELECT p_path || '.http', 'http must be an object {method, url, headers}';
        ELSE
            RETURN QUERY SELECT * FROM orch8.sequence_field_problems(
                'verify_http', v_http, p_path || '.http');
            IF NOT coalesce(jsonb_typeof(v_http -> 'url') = 'string'
                            AND v_http ->> 'url' <> '', false) THEN
                RETURN QUERY SELECT p_path || '.http.url',
                    'url is required (a non-empty string; templates over effect, params, '
                    'data, config, instance_id)';
            END IF;
            IF v_http ? 'method' AND coalesce(
                   v_http ->> 'method' <> ALL (orch8.verify_http_methods()), true) THEN
                RETURN QUERY SELECT p_path || '.http.method', format(
                    'method must be one of %s',
                    array_to_string(orch8.verify_http_methods(), ', '));
            END IF;
            IF v_http ? 'headers' AND (
                jsonb_typeof(v_http -> 'headers') <> 'object'
                OR EXISTS (SELECT 1 FROM jsonb_each(v_http -> 'headers') AS h
                           WHERE jsonb_typeof(h.value) <> 'string')
            ) THEN
                RETURN QUERY SELECT p_path || '.http.headers',
                    'headers must be an object of name -> string';
            END IF;
            RETURN QUERY SELECT * FROM orch8.sequence_params_problems(
                v_http, p_path || '.http', orch8.verify_template_roots());
        END IF;
        IF NOT v_verify ? 'applied_if' THEN
            RETURN QUERY SELECT p_path || '.applied_if',
                'applied_if is required with http (an expression over response, effect, '
                'params that is true when the effect happened)';
        END IF;
    ELSE
        FOREACH v_field IN ARRAY ARRAY['applied_if', 'not_applied_if', 'receipt_path'] LOOP
            IF v_verify ? v_field THEN
                RETURN QUERY SELECT p_path || '.' || v_field,
                    format('%s belongs to an http verifier', v_field);
            END IF;
        END LOOP;
    END IF;
    FOREACH v_field IN ARRAY ARRAY['applied_if', 'not_applied_if', 'receipt_path'] LOOP
        IF v_verify ? v_field AND NOT coalesce(
               jsonb_typeof(v_verify -> v_field) = 'string' AND v_verify ->> v_field <> '',
               false) THEN
            RETURN QUERY SELECT p_path || '.' || v_field,
                format('%s must be a non-empty string', v_field);
        END IF;
    END LOOP;
    IF v_verify ? 'replay' THEN
        IF (v_verify -> 'replay') IS DISTINCT FROM 'true' THEN
            RETURN QUERY SELECT p_path || '.replay', 'replay must be true';
        ELSIF (p_step -> 'provider_idempotency') IS DISTINCT FROM 'true' THEN
            RETURN QUERY SELECT p_path || '.replay',
                'replay resends the request, which is safe only when the provider '
                'deduplicates it: set provider_idempotency to true';
        END IF;
    END IF;
    IF v_verify ? 'handler' THEN
        IF (v_verify -> 'handler') IS DISTINCT FROM 'true' THEN
            RETURN QUERY SELECT p_path || '.handler', 'handler must be true';
        ELSIF EXISTS (SELECT 1 FROM orch8.builtin_handlers AS h
                      WHERE h.name = p_step ->> 'handler') THEN
            RETURN QUERY SELECT p_path || '.handler', format(
                'handler "%s" is a builtin, which has no Python verifier: use http or replay',
                p_step ->> 'handler');
        END IF;
    END IF;
    IF v_verify ? 'schedule' AND (
        jsonb_typeof(v_verify -> 'schedule') <> 'array'
        OR jsonb_array_length(v_verify -> 'schedule') NOT BETWEEN 1
           AND orch8.limit_of('verify_tries')
        OR EXISTS (
            SELECT 1 FROM jsonb_array_elements(v_verify -> 'schedule') AS d
            WHERE coalesce(orch8.sequence_json_integer(d.value)
                           NOT BETWEEN 0 AND orch8.limit_of('verify_delay_ms'), true))
    ) THEN
        RETURN QUERY SELECT p_path || '.schedule', format(
            'schedule must be 1 to %s delays, each an integer from 0 to %s (milliseconds)',
            orch8.limit_of('verify_tries'), orch8.limit_of('verify_delay_ms'));
    END IF;
    IF v_verify ? 'on_verified'
       AND coalesce(v_verify ->> 'on_verified' NOT IN ('continue', 'stop'), true) THEN
        RETURN QUERY SELECT p_path || '.on_verified', 'on_verified must be continue or stop';
    END IF;
    IF v_verify ? 'on_not_applied'
       AND coalesce(v_verify ->> 'on_not_applied' NOT IN ('retry', 'stop'), true) THEN
        RETURN QUERY SELECT p_path || '.on_not_applied', 'on_not_applied must be retry or stop';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_verify_problems(jsonb, text) IS
'Problems of a step''s verify (p_step is the whole step): its fields (language scopes '
'verify and verify_http), exactly one of http, replay, handler, a side-effecting handler; '
'http needs a url (templates over verify_template_roots()), a method of '
'verify_http_methods(), string headers, and applied_if; applied_if, not_applied_if and '
'receipt_path are http''s, non-empty strings; replay is true and needs '
'provider_idempotency true; handler is true and not a builtin; schedule 1..verify_tries '
'delays of 0..verify_delay_ms; on_verified continue|stop; on_not_applied retry|stop. The '
'expressions'' syntax is the runner''s (checked by orch8_py before storing).';

CREATE OR REPLACE FUNCTION orch8.sequence_call_problems(
    p_call jsonb, p_path text, p_roots text[]
)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_builtin orch8.builtin_handlers;
BEGIN
    IF NOT p_call ? 'handler' THEN
        RETURN QUERY SELECT p_path || '.handler', 'handler is required (a non-empty string)';
    ELSIF jsonb_typeof(p_call -> 'handler') <> 'string' OR p_call ->> 'handler' = '' THEN
        RETURN QUERY SELECT p_path || '.handler', 'handler must be a non-empty string';
    ELSE
        SELECT * INTO v_builtin FROM orch8.builtin_handlers AS h
        WHERE h.name = p_call ->> 'handler';
        IF v_builtin.name IS NOT NULL AND NOT v_builtin.implemented THEN
            RETURN QUERY SELECT p_path || '.handler',
                format('handler "%s" is a builtin that is not supported yet', v_builtin.name);
        END IF;
    END IF;
    IF p_call ? 'params' THEN
        IF jsonb_typeof(p_call -> 'params') <> 'object' THEN
            RETURN QUERY SELECT p_path || '.params', 'params must be a JSON object';
        ELSE
            RETURN QUERY SELECT * FROM orch8.sequence_params_problems(
                p_call -> 'params', p_path || '.params', p_roots);
        END IF;
    END IF;
    IF p_call ? 'timeout'
       AND coalesce(orch8.sequence_json_integer(p_call -> 'timeout') < 1, true) THEN
        RETURN QUERY SELECT p_path || '.timeout',
            'timeout must be a positive integer (milliseconds)';
    END IF;
    IF p_call ? 'retry' THEN
        RETURN QUERY SELECT * FROM orch8.sequence_retry_problems(
            p_call -> 'retry', p_path || '.retry');
        IF p_call -> 'retry' ->> 'on_ambiguous' = 'same_key'
           AND (p_call -> 'provider_idempotency') IS DISTINCT FROM 'true'
           AND NOT coalesce((p_call -> 'params') ? 'idempotency_key', false) THEN
            RETURN QUERY SELECT p_path || '.retry.on_ambiguous',
                'same_key resends under the same key, which is harmless only when the '
                'provider deduplicates: set provider_idempotency to true or give an '
                'idempotency_key param';
        END IF;
        IF p_call -> 'retry' ? 'retry_if' AND NOT coalesce(
               jsonb_typeof(p_call -> 'retry' -> 'retry_if') = 'string'
               AND p_call -> 'retry' ->> 'retry_if' <> '', false) THEN
            RETURN QUERY SELECT p_path || '.retry.retry_if',
                'retry_if must be a non-empty string (an expression over error)';
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_call_problems(jsonb, text, text[]) IS
'Problems of a handler call (a step, or a step''s compensation): handler (required; a '
'builtin this engine does not run is not supported yet), params (an object; template '
'problems with the roots p_roots), timeout (positive integer ms), retry (on_ambiguous '
'same_key only where the provider deduplicates; retry_if a non-empty string).';

CREATE OR REPLACE FUNCTION orch8.sequence_step_problems(
    p_step jsonb, p_path text, p_roots text[], p_parent_type text
)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN QUERY SELECT * FROM orch8.sequence_call_problems(p_step, p_path, p_roots);
    IF p_step ? 'provider_idempotency' THEN
        IF jsonb_typeof(p_step -> 'provider_idempotency') <> 'boolean' THEN
            RETURN QUERY SELECT p_path || '.provider_idempotency',
                'provider_idempotency must be true or false';
        ELSIF jsonb_typeof(p_step -> 'handler') = 'string'
              AND NOT orch8.handler_has_side_effects(p_step ->> 'handler') THEN
            RETURN QUERY SELECT p_path || '.provider_idempotency', format(
                'provider_idempotency is about side effects; handler "%s" has none',
                p_step ->> 'handler');
        END IF;
    END IF;
    IF p_step ? 'verify' THEN
        RETURN QUERY SELECT * FROM orch8.sequence_verify_problems(p_step, p_path || '.verify');
    END IF;
    IF p_step ? 'when' AND NOT coalesce(
           jsonb_typeof(p_step -> 'when') = 'string' AND p_step ->> 'when' <> '', false) THEN
        RETURN QUERY SELECT p_path || '.when', 'when must be a non-empty string (an expression)';
    END IF;
    IF p_step ? 'delay' THEN
        RETURN QUERY SELECT p_path || '.delay', m
        FROM orch8.duration_problem(p_step -> 'delay', 'delay') AS m WHERE m IS NOT NULL;
    END IF;
    IF p_step ? 'deadline' THEN
        RETURN QUERY SELECT p_path || '.deadline', m
        FROM orch8.duration_problem(p_step -> 'deadline', 'deadline') AS m WHERE m IS NOT NULL;
    END IF;
    IF p_step ? 'on_deadline_breach' THEN
        IF (p_step -> 'on_deadline_breach') IS DISTINCT FROM '"fail"' THEN
            RETURN QUERY SELECT p_path || '.on_deadline_breach',
                'on_deadline_breach must be fail (the only one this engine runs)';
        ELSIF NOT p_step ? 'deadline' THEN
            RETURN QUERY SELECT p_path || '.on_deadline_breach',
                'on_deadline_breach needs a deadline';
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM orch8.flow_control_problems(
        p_step, p_path, orch8.key_template_roots());
    IF p_step ? 'send_window' THEN
        RETURN QUERY SELECT * FROM orch8.send_window_problems(
            p_step -> 'send_window', p_path || '.send_window');
    END IF;
    IF p_step ->> 'handler' = 'sleep' THEN
        RETURN QUERY SELECT p_path || '.handler',
            'the sleep handler held a runner thread for the whole sleep; use a sleep block: '
            '{"type": "sleep", "id": "...", "duration": "1h"} (it holds nothing)';
    END IF;
    IF p_step ? 'output_schema' AND jsonb_typeof(p_step -> 'output_schema') <> 'object' THEN
        RETURN QUERY SELECT p_path || '.output_schema',
            'output_schema must be a JSON Schema (an object)';
    END IF;
    IF p_step ? 'compensation' THEN
        IF p_parent_type IS DISTINCT FROM 'saga' THEN
            RETURN QUERY SELECT p_path || '.compensation',
                'compensation runs only for a step directly inside a saga block';
        ELSIF jsonb_typeof(p_step -> 'compensation') <> 'object' THEN
            RETURN QUERY SELECT p_path || '.compensation',
                'compensation must be an object {handler, params, timeout, retry}';
        ELSE
            RETURN QUERY SELECT * FROM orch8.sequence_field_problems(
                'compensation', p_step -> 'compensation', p_path || '.compensation');
            RETURN QUERY SELECT * FROM orch8.sequence_call_problems(
                p_step -> 'compensation', p_path || '.compensation', p_roots);
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems('step', p_step, p_path);
END
$$;

COMMENT ON FUNCTION orch8.sequence_step_problems(jsonb, text, text[], text) IS
'Problems of a step block beyond id and type: the handler call (sequence_call_problems, '
'templates over p_roots), provider_idempotency (a boolean, for a side-effecting '
'handler), verify (sequence_verify_problems), when (a non-empty string), delay (a '
'duration), deadline (a duration) and on_deadline_breach (fail, with a deadline), '
'concurrency_key, max_concurrency and rate_limit_key (flow_control_problems), '
'send_window (send_window_problems), the sleep handler (refused: the sleep '
'block holds no runner), output_schema (an object), compensation (only directly inside '
'a saga: p_parent_type; a handler call of its own), and fields the language does not '
'accept in a step.';

CREATE OR REPLACE FUNCTION orch8.sequence_list_problems(
    p_value jsonb, p_path text, p_required boolean
)
RETURNS TABLE (path text, message text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT p_path, CASE WHEN p_value IS NULL THEN 'is required (a non-empty array of blocks)'
                        ELSE 'must be a non-empty array of blocks' END
    WHERE (p_value IS NULL AND p_required)
       OR (p_value IS NOT NULL
           AND (jsonb_typeof(p_value) <> 'array' OR jsonb_array_length(p_value) = 0))
$$;

COMMENT ON FUNCTION orch8.sequence_list_problems(jsonb, text, boolean) IS
'The problem of a field that holds blocks: missing (when required) or not a non-empty '
'array. Internal helper of sequence_composite_problems (the message follows the path).';

CREATE OR REPLACE FUNCTION orch8.sequence_composite_problems(
    p_block jsonb, p_path text, p_roots text[], p_vars text[]
)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_type text := p_block ->> 'type';
    v_field text;
    v_branch record;
    v_names text [];
    v_min_branches integer := CASE WHEN p_block ->> 'type' = 'race' THEN 2 ELSE 1 END;
BEGIN
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems(v_type, p_block, p_path);
    -- the fields that hold blocks
    FOR v_field IN SELECT c.field FROM orch8.block_containers() AS c
                   WHERE c.type = v_type AND c.shape = 'list' LOOP
        RETURN QUERY SELECT l.path, v_field || ' ' || l.message
        FROM orch8.sequence_list_problems(p_block -> v_field, p_path || '.' || v_field,
            v_field IN ('body', 'try_block', 'blocks')) AS l;
    END LOOP;
    IF v_type IN ('parallel', 'race') THEN
        IF jsonb_typeof(p_block -> 'branches') IS DISTINCT FROM 'array'
           OR jsonb_array_length(p_block -> 'branches') < v_min_branches
           OR jsonb_array_length(p_block -> 'branches') > orch8.limit_of('branches')
        THEN
            RETURN QUERY SELECT p_path || '.branches', format(
                'branches is required: an array of %s to %s branches, each a non-empty array '
                'of blocks', v_min_branches, orch8.limit_of('branches'));
        ELSE
            FOR v_branch IN SELECT b.value, b.n - 1 AS i
                            FROM jsonb_array_elements(p_block -> 'branches')
                                 WITH ORDINALITY AS b (value, n) LOOP
                RETURN QUERY SELECT l.path, 'a branch ' || l.message
                FROM orch8.sequence_list_problems(v_branch.value,
                    format('%s.branches[%s]', p_path, v_branch.i), true) AS l;
            END LOOP;
        END IF;
        IF v_type = 'parallel' AND p_block ? 'on_branch_failure'
           AND coalesce(p_block ->> 'on_branch_failure' NOT IN ('fail', 'continue'), true) THEN
            RETURN QUERY SELECT p_path || '.on_branch_failure',
                'on_branch_failure must be fail or continue';
        END IF;
        IF v_type = 'race' AND p_block ? 'semantics'
           AND coalesce(p_block ->> 'semantics' NOT IN ('first_to_resolve', 'first_to_succeed'),
                        true) THEN
            RETURN QUERY SELECT p_path || '.semantics',
                'semantics must be first_to_resolve or first_to_succeed';
        END IF;
    END IF;
    IF v_type IN ('loop', 'for_each') THEN
        v_field := CASE v_type WHEN 'loop' THEN 'condition' ELSE 'collection' END;
        IF NOT coalesce(jsonb_typeof(p_block -> v_field) = 'string'
                        AND p_block ->> v_field <> '', false) THEN
            RETURN QUERY SELECT p_path || '.' || v_field,
                v_field || ' is required (a non-empty string: an expression)';
        END IF;
        IF p_block ? 'max_iterations' AND coalesce(
               orch8.sequence_json_integer(p_block -> 'max_iterations')
               NOT BETWEEN 1 AND orch8.limit_of('max_iterations'), true) THEN
            RETURN QUERY SELECT p_path || '.max_iterations', format(
                'max_iterations must be an integer from 1 to %s', orch8.limit_of('max_iterations'));
        END IF;
    END IF;
    IF v_type = 'loop' AND p_block ? 'break_on' AND NOT coalesce(
           jsonb_typeof(p_block -> 'break_on') = 'string' AND p_block ->> 'break_on' <> '',
           false) THEN
        RETURN QUERY SELECT p_path || '.break_on',
            'break_on must be a non-empty string (an expression)';
    END IF;
    IF v_type = 'for_each' THEN
        IF p_block ? 'concurrency' AND coalesce(
               orch8.sequence_json_integer(p_block -> 'concurrency')
               NOT BETWEEN 1 AND orch8.limit_of('for_each_concurrency'), true) THEN
            RETURN QUERY SELECT p_path || '.concurrency', format(
                'concurrency must be an integer from 1 to %s',
                orch8.limit_of('for_each_concurrency'));
        END IF;
        v_names := ARRAY[]::text [];
        FOREACH v_field IN ARRAY ARRAY['item_var', 'index_var'] LOOP
            CONTINUE WHEN NOT p_block ? v_field;
            IF NOT coalesce(jsonb_typeof(p_block -> v_field) = 'string'
                            AND p_block ->> v_field ~ '^[A-Za-z_][A-Za-z0-9_]*$', false) THEN
                RETURN QUERY SELECT p_path || '.' || v_field,
                    v_field || ' must be a name: a letter or _, then letters, digits, _';
            ELSIF p_block ->> v_field = ANY (orch8.template_roots() || ARRAY['error', 'iteration'])
            THEN
                RETURN QUERY SELECT p_path || '.' || v_field, format(
                    '%s "%s" is taken (%s are names of their own)', v_field,
                    p_block ->> v_field,
                    array_to_string(orch8.template_roots() || ARRAY['error', 'iteration'], ', '));
            END IF;
        END LOOP;
        v_names := orch8.for_each_vars(p_block);
        IF v_names[1] = v_names[2] THEN
            RETURN QUERY SELECT p_path || '.index_var',
                format('index_var and item_var are both "%s"', v_names[1]);
        END IF;
        FOR v_i IN 1 .. 2 LOOP
            IF v_names[v_i] = ANY (p_vars) THEN
                RETURN QUERY SELECT p_path || '.' || (ARRAY['item_var', 'index_var'])[v_i], format(
                    '"%s" is bound already around this block; give this for_each another name',
                    v_names[v_i]);
            END IF;
        END LOOP;
    END IF;
    IF v_type = 'router' THEN
        IF jsonb_typeof(p_block -> 'routes') IS DISTINCT FROM 'array'
           OR jsonb_array_length(p_block -> 'routes') NOT BETWEEN 1 AND orch8.limit_of('branches')
        THEN
            RETURN QUERY SELECT p_path || '.routes', format(
                'routes is required: an array of 1 to %s {condition, blocks}',
                orch8.limit_of('branches'));
        ELSE
            FOR v_branch IN SELECT b.value, b.n - 1 AS i
                            FROM jsonb_array_elements(p_block -> 'routes')
                                 WITH ORDINALITY AS b (value, n) LOOP
                IF jsonb_typeof(v_branch.value) <> 'object' THEN
                    RETURN QUERY SELECT format('%s.routes[%s]', p_path, v_branch.i),
                        'a route must be an object {condition, blocks}';
                    CONTINUE;
                END IF;
                RETURN QUERY SELECT * FROM orch8.sequence_field_problems(
                    'route', v_branch.value, format('%s.routes[%s]', p_path, v_branch.i));
                IF NOT coalesce(jsonb_typeof(v_branch.value -> 'condition') = 'string'
                                AND v_branch.value ->> 'condition' <> '', false) THEN
                    RETURN QUERY SELECT format('%s.routes[%s].condition', p_path, v_branch.i),
                        'condition is required (a non-empty string: an expression)';
                END IF;
                RETURN QUERY SELECT l.path, 'blocks ' || l.message
                FROM orch8.sequence_list_problems(v_branch.value -> 'blocks',
                    format('%s.routes[%s].blocks', p_path, v_branch.i), true) AS l;
            END LOOP;
        END IF;
    END IF;
    IF v_type = 'sleep' THEN
        IF NOT p_block ? 'duration' THEN
            RETURN QUERY SELECT p_path || '.duration',
                'duration is required (ms, or a string such as 30s, 15m, 2h, 3d)';
        ELSE
            RETURN QUERY SELECT p_path || '.duration', m
            FROM orch8.duration_problem(p_block -> 'duration', 'duration') AS m WHERE m IS NOT NULL;
        END IF;
    END IF;
    IF v_type IN ('wait_for_signal', 'wait_for_input') THEN
        IF p_block ? 'timeout' THEN
            RETURN QUERY SELECT p_path || '.timeout', m
            FROM orch8.duration_problem(p_block -> 'timeout', 'timeout') AS m WHERE m IS NOT NULL;
        ELSIF p_block ? 'on_timeout' THEN
            RETURN QUERY SELECT p_path || '.on_timeout', 'on_timeout needs a timeout';
        END IF;
    END IF;
    IF v_type = 'wait_for_signal' AND NOT coalesce(
           jsonb_typeof(p_block -> 'signal') = 'string'
           AND orch8.fits_domain(p_block ->> 'signal', 'orch8.signal_type')
           AND p_block ->> 'signal' <> ALL (orch8.builtin_signals()), false) THEN
        RETURN QUERY SELECT p_path || '.signal', format(
            'signal is required: a custom signal''s name (%s; not %s)',
            obj_description('orch8.signal_type'::regtype, 'pg_type'),
            array_to_string(orch8.builtin_signals(), ', '));
    END IF;
    IF v_type = 'wait_for_input' THEN
        IF NOT coalesce(jsonb_typeof(p_block -> 'prompt') = 'string'
                        AND p_block ->> 'prompt' <> '', false) THEN
            RETURN QUERY SELECT p_path || '.prompt', 'prompt is required (a non-empty string)';
        ELSE
            RETURN QUERY SELECT p_path || '.prompt', t.problem
            FROM orch8.sequence_template_problems(p_block ->> 'prompt', p_roots) AS t (problem);
        END IF;
        IF NOT coalesce(
               jsonb_typeof(p_block -> 'choices') = 'array'
               AND jsonb_array_length(p_block -> 'choices') BETWEEN 1 AND 20
               AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_block -> 'choices') AS c
                               WHERE jsonb_typeof(c) <> 'string' OR c #>> '{}' = ''
                                  OR length(c #>> '{}') > 100)
               AND (SELECT count(DISTINCT c) FROM jsonb_array_elements(p_block -> 'choices') AS c)
                   = jsonb_array_length(p_block -> 'choices'), false) THEN
            RETURN QUERY SELECT p_path || '.choices',
                'choices is required: 1 to 20 distinct non-empty strings of at most 100 '
                'characters';
        END IF;
    END IF;
    IF v_type = 'try_catch' AND NOT (p_block ? 'catch_block' OR p_block ? 'finally_block') THEN
        RETURN QUERY SELECT p_path, 'a try_catch needs catch_block, finally_block or both';
    END IF;
    IF v_type = 'sub_sequence' THEN
        IF NOT coalesce(jsonb_typeof(p_block -> 'sequence_name') = 'string'
                        AND orch8.fits_domain(p_block ->> 'sequence_name', 'orch8.sequence_name'),
                        false) THEN
            RETURN QUERY SELECT p_path || '.sequence_name', format(
                'sequence_name is required (a sequence name: %s)',
                obj_description('orch8.sequence_name'::regtype, 'pg_type'));
        END IF;
        IF p_block ? 'namespace' AND NOT coalesce(
               jsonb_typeof(p_block -> 'namespace') = 'string'
               AND orch8.fits_domain(p_block ->> 'namespace', 'orch8.identifier'), false) THEN
            RETURN QUERY SELECT p_path || '.namespace', format(
                'namespace must be %s', obj_description('orch8.identifier'::regtype, 'pg_type'));
        END IF;
        IF p_block ? 'version' AND coalesce(
               orch8.sequence_json_integer(p_block -> 'version') < 1, true) THEN
            RETURN QUERY SELECT p_path || '.version', 'version must be an integer >= 1';
        END IF;
        IF p_block ? 'input' THEN
            IF jsonb_typeof(p_block -> 'input') <> 'object' THEN
                RETURN QUERY SELECT p_path || '.input', 'input must be a JSON object';
            ELSE
                RETURN QUERY SELECT * FROM orch8.sequence_params_problems(
                    p_block -> 'input', p_path || '.input', p_roots);
            END IF;
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_composite_problems(jsonb, text, text[], text[]) IS
'Problems of a composite block beyond id and type: its fields (language scope = its '
'type), the fields that hold blocks (non-empty arrays; body, try_block and a saga''s '
'blocks required), parallel/race branches (1 to branches, a race 2 or more, each '
'non-empty), on_branch_failure fail|continue, semantics first_to_resolve|'
'first_to_succeed, a loop''s condition and break_on and a for_each''s collection '
'(non-empty strings), max_iterations (1..max_iterations), concurrency '
'(1..for_each_concurrency), item_var and index_var (names, not taken, not bound around '
'the block: p_vars), routes (1 to branches {condition, blocks}), a try_catch''s catch or '
'finally, a sub_sequence''s sequence_name, namespace, version and input (templates '
'over p_roots), a sleep''s duration, a wait''s timeout (a duration; on_timeout only with '
'one), a wait_for_signal''s signal (a custom signal''s name) and a wait_for_input''s '
'prompt (templates) and choices. Expressions are parsed by orch8_py before storing.';

CREATE OR REPLACE FUNCTION orch8.sequence_block_problems(
    p_block jsonb, p_path text, p_vars text[], p_parent_type text, p_depth integer
)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_type text;
    v_note text;
    -- the roots a template may start with here: the language's, then each variable
    -- bound around the block once
    v_roots text [] := orch8.template_roots() || ARRAY(
        SELECT u.v FROM unnest(p_vars) WITH ORDINALITY AS u (v, n)
        WHERE u.v <> ALL (orch8.template_roots())
        GROUP BY u.v ORDER BY min(u.n));
BEGIN
    IF jsonb_typeof(p_block) IS DISTINCT FROM 'object' THEN
        RETURN QUERY SELECT p_path, 'a block must be a JSON object';
        RETURN;
    END IF;
    IF p_depth > orch8.limit_of('nesting_depth') THEN
        RETURN QUERY SELECT p_path, format('blocks are nested more than %s deep',
                                           orch8.limit_of('nesting_depth'));
        RETURN;
    END IF;
    IF NOT p_block ? 'id' THEN
        RETURN QUERY SELECT p_path || '.id', 'id is required (a non-empty string)';
    ELSIF jsonb_typeof(p_block -> 'id') <> 'string' OR p_block ->> 'id' = '' THEN
        RETURN QUERY SELECT p_path || '.id', 'id must be a non-empty string';
    ELSIF length(p_block ->> 'id') > orch8.limit_of('block_id_chars') THEN
        RETURN QUERY SELECT p_path || '.id',
            format('id is longer than %s characters', orch8.limit_of('block_id_chars'));
    ELSIF p_block ->> 'id' !~ orch8.block_id_pattern() THEN
        RETURN QUERY SELECT p_path || '.id',
            format('id %s may hold only A-Z a-z 0-9 _ - (templates reach a block as '
                   'outputs.<id>, and execution paths join ids with other characters)',
                   to_json(p_block ->> 'id'));
    END IF;
    IF NOT p_block ? 'type' THEN
        RETURN QUERY SELECT p_path || '.type', 'type is required (step or a composite block)';
        RETURN;
    END IF;
    v_type := CASE WHEN jsonb_typeof(p_block -> 'type') = 'string' THEN p_block ->> 'type' END;
    SELECT CASE WHEN l.supported THEN NULL ELSE l.note END INTO v_note
    FROM orch8.sequence_language() AS l
    WHERE l.scope = 'block_type' AND l.field = v_type;
    IF NOT found THEN
        RETURN QUERY SELECT p_path || '.type',
            format('unknown block type %s (known: %s)', p_block -> 'type',
                   (SELECT string_agg(l.field, ', ' ORDER BY l.n)
                    FROM orch8.sequence_language() WITH ORDINALITY AS l (scope, field, supported, note, n)
                    WHERE l.scope = 'block_type' AND l.supported));
    ELSIF v_note IS NOT NULL THEN
        RETURN QUERY SELECT p_path || '.type', format('block type "%s" is %s', v_type, v_note);
    ELSIF v_type = 'step' THEN
        RETURN QUERY SELECT * FROM orch8.sequence_step_problems(
            p_block, p_path, v_roots, p_parent_type);
    ELSE
        RETURN QUERY SELECT * FROM orch8.sequence_composite_problems(
            p_block, p_path, v_roots, p_vars);
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.sequence_block_problems(jsonb, text, text[], text, integer) IS
'Problems of one block at p_path (the blocks inside it are checked on their own): an '
'object at most nesting_depth deep with an id (non-empty, at most block_id_chars, '
'matching block_id_pattern) and a type; a type the language knows but this engine does '
'not run is not supported yet; a step is checked by sequence_step_problems, a composite '
'by sequence_composite_problems, with the variables bound around it (p_vars: templates '
'may use them as roots) and its parent''s type.';

CREATE OR REPLACE FUNCTION orch8.sequence_block_id_problems(p_definition jsonb)
RETURNS TABLE (path text, message text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT
        d.json_path || '.id',
        format('duplicate block id "%s" (first used at %s)', d.block_id, d.first_at)
    FROM (
        SELECT
            b.block_id,
            b.json_path,
            b.sort_key,
            first_value(b.json_path) OVER same_id AS first_at,
            row_number() OVER same_id AS nth
        FROM orch8.definition_blocks(p_definition) AS b
        WHERE b.block_id IS NOT NULL AND b.block_id <> ''
        WINDOW same_id AS (PARTITION BY b.block_id ORDER BY b.sort_key)
    ) AS d
    WHERE d.nth > 1
    ORDER BY d.sort_key
$$;

COMMENT ON FUNCTION orch8.sequence_block_id_problems(jsonb) IS
'One problem per block whose id a block listed before it (definition_blocks) already '
'uses, at any depth: ids are unique in the whole definition, on_failure and on_cancel '
'included.';

CREATE OR REPLACE FUNCTION orch8.sequence_invariant_problems(p_invariants jsonb)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_item jsonb;
    v_i integer;
    v_at text;
    v_type text;
    v_note text;
    v_names text [] := ARRAY[]::text [];
BEGIN
    IF jsonb_typeof(p_invariants) <> 'array' THEN
        RETURN QUERY SELECT '$.invariants', 'invariants must be an array';
        RETURN;
    END IF;
    FOR v_item, v_i IN
        SELECT e.value, e.n - 1
        FROM jsonb_array_elements(p_invariants) WITH ORDINALITY AS e (value, n)
    LOOP
        v_at := '$.invariants[' || v_i || ']';
        IF jsonb_typeof(v_item) <> 'object' THEN
            RETURN QUERY SELECT v_at,
                'an invariant must be a JSON object {name, type, kind, commit_guard}';
            CONTINUE;
        END IF;
        RETURN QUERY SELECT * FROM orch8.sequence_field_problems('invariant', v_item, v_at);
        IF NOT coalesce(jsonb_typeof(v_item -> 'name') = 'string' AND v_item ->> 'name' <> '',
                        false) THEN
            RETURN QUERY SELECT v_at || '.name', 'name is required (a non-empty string)';
        ELSIF v_item ->> 'name' = ANY (v_names) THEN
            RETURN QUERY SELECT v_at || '.name',
                format('duplicate invariant name "%s"', v_item ->> 'name');
        ELSE
            v_names := v_names || (v_item ->> 'name');
        END IF;

        v_type := CASE WHEN jsonb_typeof(v_item -> 'type') = 'string' THEN v_item ->> 'type' END;
        SELECT CASE WHEN l.supported THEN NULL ELSE l.note END INTO v_note
        FROM orch8.sequence_language() AS l
        WHERE l.scope = 'invariant_type' AND l.field = v_type;
        IF NOT v_item ? 'type' THEN
            RETURN QUERY SELECT v_at || '.type', 'type is required (effect_at_most_once)';
            CONTINUE;
        ELSIF NOT found THEN
            RETURN QUERY SELECT v_at || '.type',
                format('unknown invariant type %s (known: effect_at_most_once)',
                       v_item -> 'type');
            CONTINUE;
        ELSIF v_note IS NOT NULL THEN
            RETURN QUERY SELECT v_at || '.type',
                format('invariant type "%s" is %s', v_type, v_note);
            CONTINUE;
        END IF;

        IF NOT v_item ? 'kind' THEN
            RETURN QUERY SELECT v_at || '.kind',
                format('kind is required for effect_at_most_once (one of %s)',
                       array_to_string(orch8.effect_kinds(), ', '));
        ELSIF NOT coalesce(jsonb_typeof(v_item -> 'kind') = 'string'
                           AND v_item ->> 'kind' = ANY (orch8.effect_kinds()), false) THEN
            RETURN QUERY SELECT v_at || '.kind',
                format('unknown effect kind %s (known: %s)',
                       v_item -> 'kind', array_to_string(orch8.effect_kinds(), ', '));
        END IF;
        IF v_item ? 'commit_guard' AND jsonb_typeof(v_item -> 'commit_guard') <> 'boolean' THEN
            RETURN QUERY SELECT v_at || '.commit_guard', 'commit_guard must be true or false';
        ELSIF (v_item -> 'commit_guard') IS DISTINCT FROM 'true' THEN
            RETURN QUERY SELECT v_at || '.commit_guard',
                'effect_at_most_once is enforced as a commit guard: set commit_guard to true '
                '(a check after the fact is not supported yet)';
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.sequence_invariant_problems(jsonb) IS
'Problems of the declared invariants: each an object {name, type, kind, commit_guard} '
'with a unique name; type effect_at_most_once (the others are not supported yet) with a '
'known kind and commit_guard true.';

CREATE OR REPLACE FUNCTION orch8.validate_sequence(p_definition jsonb)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
BEGIN
    IF jsonb_typeof(p_definition) IS DISTINCT FROM 'object' THEN
        RETURN QUERY SELECT '$', 'a sequence definition must be a JSON object';
        RETURN;
    END IF;
    IF octet_length(p_definition::text) > orch8.limit_of('definition_bytes') THEN
        RETURN QUERY SELECT '$', format('the definition is %s bytes, over the limit of %s',
            octet_length(p_definition::text), orch8.limit_of('definition_bytes'));
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM orch8.sequence_top_problems(p_definition);
    IF NOT EXISTS (SELECT 1 FROM orch8.sequence_top_problems(p_definition) AS t
                   WHERE t.message LIKE 'more than %') THEN
        RETURN QUERY
            SELECT p.path, p.message
            FROM orch8.definition_blocks(p_definition) AS b
            CROSS JOIN LATERAL orch8.sequence_block_problems(
                b.definition, b.json_path, b.scope_vars, b.parent_type, b.depth
            ) WITH ORDINALITY AS p (path, message, k)
            ORDER BY b.sort_key, p.k;
        RETURN QUERY SELECT * FROM orch8.sequence_block_id_problems(p_definition);
    END IF;
    IF p_definition ? 'invariants' THEN
        RETURN QUERY SELECT * FROM orch8.sequence_invariant_problems(
            p_definition -> 'invariants');
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.validate_sequence(jsonb) IS
'Every problem of a sequence definition, one row per problem: (path, message), path being '
'JSON-path-like ($.blocks[1].retry.max_attempts). No rows: the definition is valid. The '
'language is orch8.sequence_language(): a field it knows but this engine does not run is '
'refused as not supported yet. Rows come in document order: the top level, each block, '
'duplicate block ids, then the invariants. A definition over definition_bytes is one '
'problem at $ (nothing else is checked).';

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
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_domain(p_tenant_id, 'orch8.identifier', 'tenant id'),
            orch8.require_domain(p_namespace, 'orch8.identifier', 'sequence namespace'),
            orch8.require_domain(p_name, 'orch8.sequence_name', 'sequence name');
    SELECT
        count(*),
        jsonb_agg(jsonb_build_object('path', v.path, 'message', v.message) ORDER BY v.n)
    INTO v_count, v_problems
    FROM orch8.validate_sequence(p_definition) WITH ORDINALITY AS v (path, message, n);
    IF v_count > 0 THEN
        RAISE EXCEPTION 'sequence definition has % problem(s)', v_count
            USING ERRCODE = 'O8008',
                  DETAIL = jsonb_build_object('problems', v_problems)::text,
                  HINT = 'orch8.validate_sequence(definition) lists the same problems as rows';
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
        p_definition
    FROM orch8.sequences AS q
    WHERE q.tenant_id = p_tenant_id AND q.namespace = p_namespace AND q.name = p_name
    RETURNING s.* INTO v_row;

    FOR v_invariant IN SELECT jsonb_array_elements(p_definition -> 'invariants') LOOP
        PERFORM orch8.declare_invariant(
            p_tenant_id,
            v_invariant ->> 'name',
            jsonb_build_object('type', v_invariant -> 'type', 'kind', v_invariant -> 'kind'),
            (v_invariant ->> 'commit_guard')::boolean,
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
'problem(s)" with DETAIL {"problems": [{path, message}, ...]}, nothing stored. A tenant '
'or namespace that is not an orch8.identifier, or a name that is not an '
'orch8.sequence_name: O8008. Each declared invariant is declared for the new version.';

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
