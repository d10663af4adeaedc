-- Sequence definitions: the language (sequence_language), validate_sequence and each of
-- its helpers, the one template grammar, and create_sequence / get_sequence.
BEGIN;
SELECT plan(56);

-- The DETAIL of the error a statement raises (NULL when it raises nothing).
CREATE FUNCTION pg_temp.error_detail(p_sql text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_detail;
END
$$;

-- A definition of p_count steps.
CREATE FUNCTION pg_temp.many_steps(p_count integer)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT jsonb_build_object('blocks', jsonb_agg(
        jsonb_build_object('id', 's' || i, 'type', 'step', 'handler', 'noop')
    ))
    FROM generate_series(1, p_count) AS i
$$;

CREATE TEMP TABLE defs (name text PRIMARY KEY, body jsonb NOT NULL) ON COMMIT DROP;

INSERT INTO defs VALUES
(
    'good',
    $${"blocks": [{"id": "charge", "type": "step", "handler": "http_request",
                   "params": {"url": "https://pay.example/{{ data.order_id }}",
                              "currency": "{{ config.currency | 'EUR' }}"},
                   "timeout": 30000,
                   "retry": {"max_attempts": 3, "initial_backoff": 1000,
                             "max_backoff": 60000, "backoff_multiplier": 2.0,
                             "non_retryable_codes": ["card_declined"]}}],
       "invariants": [{"name": "charge once", "type": "effect_at_most_once",
                       "kind": "http", "commit_guard": true}]}$$
),
(
    'bad',
    $${"status": "draft",
       "blocks": [
         {"id": "fetch", "type": "step", "handler": "http_request",
          "params": {"url": "https://api.example/{{ nope.x }}",
                     "headers": {"x-id": "{{ data.x"}},
          "retry": {"max_attempts": 0}},
         {"id": "fetch", "type": "step", "handler": "log", "queue_name": 5},
         {"id": "jump", "type": "teleport"},
         {"id": "fan", "type": "parallel", "branches": []},
         {"id": "notify", "type": "step", "params": {}}],
       "invariants": [
         {"name": "charge once", "type": "effect_at_most_once", "kind": "telepathy",
          "commit_guard": true},
         {"name": "no unknowns", "type": "no_unknown_effects"}]}$$
);

CREATE FUNCTION pg_temp.def(p_name text)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$ SELECT d.body FROM defs AS d WHERE d.name = p_name $$;

-- 1. The functions exist --------------------------------------------------------------------

SELECT has_function('orch8', 'validate_sequence', ARRAY['jsonb']);
SELECT has_function('orch8', 'create_sequence', ARRAY['text', 'text', 'text', 'jsonb']);
SELECT has_function('orch8', 'get_sequence', ARRAY['text', 'text', 'text', 'integer']);
SELECT has_function('orch8', 'sequence_language', '{}'::text[]);

-- 2. The language: exactly what the runner honours is supported ---------------------------

SELECT bag_eq(
    $$SELECT l.scope, l.field FROM orch8.sequence_language() AS l WHERE l.supported$$,
    $$VALUES ('definition', 'blocks'), ('definition', 'invariants'),
             ('definition', 'input_schema'), ('definition', 'on_failure'),
             ('definition', 'on_cancel'),
             ('block_type', 'step'), ('block_type', 'parallel'), ('block_type', 'race'),
             ('block_type', 'loop'), ('block_type', 'for_each'), ('block_type', 'router'),
             ('block_type', 'try_catch'), ('block_type', 'sub_sequence'), ('block_type', 'saga'),
             ('block_type', 'sleep'), ('block_type', 'wait_for_signal'),
             ('block_type', 'wait_for_input'),
             ('sleep', 'type'), ('sleep', 'id'), ('sleep', 'duration'),
             ('wait_for_signal', 'type'), ('wait_for_signal', 'id'), ('wait_for_signal', 'signal'),
             ('wait_for_signal', 'timeout'), ('wait_for_signal', 'on_timeout'),
             ('wait_for_input', 'type'), ('wait_for_input', 'id'), ('wait_for_input', 'prompt'),
             ('wait_for_input', 'choices'), ('wait_for_input', 'timeout'),
             ('wait_for_input', 'on_timeout'),
             ('step', 'delay'), ('step', 'send_window'), ('step', 'deadline'),
             ('step', 'on_deadline_breach'),
             ('definition', 'concurrency_key'), ('definition', 'max_concurrency'),
             ('definition', 'sla'), ('definition', 'on_sla_breach'),
             ('step', 'concurrency_key'), ('step', 'max_concurrency'), ('step', 'rate_limit_key'),
             ('send_window', 'timezone'), ('send_window', 'days'), ('send_window', 'start'),
             ('send_window', 'end'),
             ('step', 'type'), ('step', 'id'), ('step', 'handler'), ('step', 'params'),
             ('step', 'timeout'), ('step', 'retry'), ('step', 'provider_idempotency'),
             ('step', 'verify'), ('step', 'output_schema'), ('step', 'when'),
             ('step', 'compensation'),
             ('retry', 'max_attempts'), ('retry', 'initial_backoff'), ('retry', 'max_backoff'),
             ('retry', 'backoff_multiplier'), ('retry', 'non_retryable_codes'),
             ('retry', 'on_ambiguous'), ('retry', 'retry_if'),
             ('parallel', 'type'), ('parallel', 'id'), ('parallel', 'branches'),
             ('parallel', 'on_branch_failure'),
             ('race', 'type'), ('race', 'id'), ('race', 'branches'), ('race', 'semantics'),
             ('loop', 'type'), ('loop', 'id'), ('loop', 'condition'), ('loop', 'body'),
             ('loop', 'max_iterations'), ('loop', 'break_on'),
             ('for_each', 'type'), ('for_each', 'id'), ('for_each', 'collection'),
             ('for_each', 'body'), ('for_each', 'item_var'), ('for_each', 'index_var'),
             ('for_each', 'max_iterations'), ('for_each', 'concurrency'),
             ('router', 'type'), ('router', 'id'), ('router', 'routes'), ('router', 'default'),
             ('route', 'condition'), ('route', 'blocks'),
             ('try_catch', 'type'), ('try_catch', 'id'), ('try_catch', 'try_block'),
             ('try_catch', 'catch_block'), ('try_catch', 'finally_block'),
             ('saga', 'type'), ('saga', 'id'), ('saga', 'blocks'),
             ('sub_sequence', 'type'), ('sub_sequence', 'id'), ('sub_sequence', 'sequence_name'),
             ('sub_sequence', 'namespace'), ('sub_sequence', 'version'),
             ('sub_sequence', 'input'),
             ('compensation', 'handler'), ('compensation', 'params'),
             ('compensation', 'timeout'), ('compensation', 'retry'),
             ('verify', 'http'), ('verify', 'applied_if'), ('verify', 'not_applied_if'),
             ('verify', 'receipt_path'), ('verify', 'replay'), ('verify', 'handler'),
             ('verify', 'schedule'), ('verify', 'on_verified'), ('verify', 'on_not_applied'),
             ('verify_http', 'method'), ('verify_http', 'url'), ('verify_http', 'headers'),
             ('invariant', 'name'), ('invariant', 'type'), ('invariant', 'kind'),
             ('invariant', 'commit_guard'), ('invariant_type', 'effect_at_most_once')$$,
    'sequence_language: the supported fields are exactly the ones the runner honours'
);

SELECT is_empty(
    $$SELECT l.scope, l.field FROM orch8.sequence_language() AS l
      WHERE NOT l.supported AND l.note IS NULL
      UNION ALL
      SELECT l.scope, l.field FROM orch8.sequence_language() AS l
      GROUP BY l.scope, l.field HAVING count(*) > 1$$,
    'sequence_language: every refused field says why, and no field is listed twice'
);

SELECT results_eq(
    $$SELECT f.path, f.message FROM orch8.sequence_field_problems(
        'step', '{"when": "x", "type": "step", "colour": "red", "queue_name": 5}',
        '$.blocks[0]') AS f$$,
    $$VALUES ('$.blocks[0].colour', 'unknown field'),
             ('$.blocks[0].queue_name', 'queue_name is not supported yet')$$,
    'sequence_field_problems: known but not run is "not supported yet", others unknown, by key'
);

-- 3. The template grammar -------------------------------------------------------------------

SELECT is(
    orch8.template_roots(), ARRAY['data', 'config', 'outputs', 'instance_id', 'runtime'],
    'template_roots: the five roots'
);

SELECT results_eq(
    $$SELECT e, e ~ orch8.template_expression_pattern() FROM unnest(ARRAY[
        'data.a', 'outputs.fetch-order.body.0', 'instance_id', 'config.x | ''EUR''',
        'data..x', 'nope.x', 'data.x | EUR', 'data.x + 1']) AS e$$,
    $$VALUES ('data.a', true), ('outputs.fetch-order.body.0', true), ('instance_id', true),
             ('config.x | ''EUR''', true), ('data..x', false), ('nope.x', false),
             ('data.x | EUR', false), ('data.x + 1', false)$$,
    'template_expression_pattern: root, .segments, an optional quoted fallback'
);

SELECT results_eq(
    $$SELECT (regexp_matches('a {{ x }} b {{y}}', orch8.template_placeholder_pattern(), 'g'))[1]$$,
    $$VALUES (' x '), ('y')$$,
    'template_placeholder_pattern: the shortest text between {{ and }}'
);

SELECT bag_eq(
    $$SELECT t.problem FROM orch8.sequence_template_problems(
        '{{ nope.x }} {{ data..x }} {{ }} {{ data.x | EUR }} {{ data.y') AS t (problem)$$,
    $$VALUES
        ('template "{{ nope.x }}" has an unknown root "nope" '
         || '(roots: data, config, outputs, instance_id, runtime)'),
        ('template "{{ data..x }}" is malformed: expected root.segment.segment..., '
         || 'optionally followed by | ''literal'''),
        ('empty template "{{ }}"'),
        ('template "{{ data.x | EUR }}" is malformed: expected root.segment.segment..., '
         || 'optionally followed by | ''literal'''),
        ('unclosed template: "{{" without a matching "}}"')$$,
    'sequence_template_problems: each bad placeholder of a string is its own problem'
);

SELECT is_empty(
    $$SELECT * FROM orch8.sequence_template_problems('no placeholders }} here, {{ data.a }}')$$,
    'sequence_template_problems: a stray }} and a good placeholder are fine'
);

-- 4. Params: every string anywhere inside ---------------------------------------------------

SELECT bag_eq(
    $$SELECT p.path FROM orch8.sequence_params_problems(
        '{"a": {"b": ["ok", "{{ bad.x }}"]}, "c": "{{ data.x", "d": 42}', '$.p') AS p$$,
    $$VALUES ('$.p.a.b[1]'), ('$.p.c')$$,
    'sequence_params_problems: template problems at their path, in objects and arrays'
);

SELECT is_empty(
    $$SELECT * FROM orch8.sequence_params_problems(
        '{"whole": "{{ data.customer }}",
          "inline": "Dear {{data.name}}, order {{ outputs.fetch-order.body.id }}",
          "fallback": "{{ config.currency | ''EUR'' }}",
          "ids": ["{{ instance_id }}", "{{ runtime.attempt }}", 42, null]}', '$')$$,
    'sequence_params_problems: well-formed templates nested in objects and arrays pass'
);

-- 5. A step's retry -------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT r.path, r.message FROM orch8.sequence_retry_problems(
        '{"max_attempts": 101, "initial_backoff": -1, "max_backoff": 10,
          "backoff_multiplier": "2", "non_retryable_codes": "404", "retry_if": "x",
          "jitter": true}', '$.r') AS r$$,
    $$VALUES
        ('$.r.jitter', 'unknown field'),
        ('$.r.max_attempts', 'max_attempts must be an integer from 1 to 100'),
        ('$.r.initial_backoff', 'initial_backoff must be an integer >= 0 (milliseconds)'),
        ('$.r.backoff_multiplier', 'backoff_multiplier must be a number >= 1'),
        ('$.r.non_retryable_codes', 'non_retryable_codes must be an array of strings')$$,
    'sequence_retry_problems: fields, then each rule'
);

SELECT results_eq(
    $$SELECT r.path, r.message FROM orch8.sequence_retry_problems(
        '{"initial_backoff": 500, "max_backoff": 100}', '$.r') AS r$$,
    $$VALUES ('$.r.max_backoff',
              'max_backoff must be an integer >= initial_backoff (milliseconds)')$$,
    'sequence_retry_problems: max_backoff below initial_backoff'
);

SELECT is_empty(
    $$SELECT * FROM orch8.sequence_retry_problems(
        '{"max_attempts": 1, "initial_backoff": 0, "max_backoff": 0, "backoff_multiplier": 1,
          "non_retryable_codes": []}', '$.r')$$,
    'sequence_retry_problems: the smallest allowed values pass'
);

SELECT results_eq(
    $$SELECT r.message FROM orch8.sequence_retry_problems('[3]', '$.r') AS r$$,
    $$VALUES ('retry must be a JSON object')$$,
    'sequence_retry_problems: not an object is one problem'
);

-- 6. A step ---------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT s.path, s.message FROM orch8.sequence_step_problems(
        '{"id": "a", "type": "step", "handler": "", "params": [], "timeout": 0,
          "queue_name": "stripe"}', '$.s', orch8.template_roots(), 'definition') AS s$$,
    $$VALUES
        ('$.s.handler', 'handler must be a non-empty string'),
        ('$.s.params', 'params must be a JSON object'),
        ('$.s.timeout', 'timeout must be a positive integer (milliseconds)'),
        ('$.s.queue_name', 'queue_name is not supported yet')$$,
    'sequence_step_problems: handler, params, timeout, then refused fields'
);

SELECT results_eq(
    $$SELECT s.path, s.message FROM orch8.sequence_step_problems(
        '{"id": "a", "type": "step"}', '$.s', orch8.template_roots(), 'definition') AS s$$,
    $$VALUES ('$.s.handler', 'handler is required (a non-empty string)')$$,
    'sequence_step_problems: a handler is required'
);

SELECT results_eq(
    $$SELECT s.message FROM orch8.sequence_step_problems(
        '{"id": "a", "type": "step", "handler": "human_review"}', '$.s', orch8.template_roots(),
        'definition') AS s$$,
    $$VALUES ('handler "human_review" is a builtin that is not supported yet')$$,
    'sequence_step_problems: a reserved builtin this engine does not run is not supported yet'
);

SELECT is_empty(
    $$SELECT * FROM orch8.sequence_step_problems(
        '{"id": "a", "type": "step", "handler": "payments.charge"}', '$.s',
        orch8.template_roots(), 'definition')$$,
    'sequence_step_problems: any other handler name is somebody''s own'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.builtin_handlers AS h
        WHERE h.implemented
    ),
    13,
    'builtin_handlers: the thirteen builtins orch8-py runs are marked implemented'
);

-- 7. A block --------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT b.path, b.message
      FROM orch8.sequence_block_problems('"x"', '$.b', '{}', 'definition', 1) AS b$$,
    $$VALUES ('$.b', 'a block must be a JSON object')$$,
    'sequence_block_problems: a block is an object'
);

SELECT results_eq(
    $$SELECT b.path, b.message FROM orch8.sequence_block_problems(
        jsonb_build_object('id', repeat('i', 201), 'type', 'teleport'), '$.b', '{}',
        'definition', 1) AS b$$,
    $$VALUES ('$.b.id', 'id is longer than 200 characters'),
             ('$.b.type', 'unknown block type "teleport" (known: step, parallel, race, loop, '
              || 'for_each, router, try_catch, sub_sequence, saga, sleep, wait_for_signal, '
              || 'wait_for_input)')$$,
    'sequence_block_problems: id length and an unknown type'
);

SELECT results_eq(
    $$SELECT b.path, b.message FROM orch8.sequence_block_problems(
        '{"id": "charge.v2", "type": "step", "handler": "noop"}', '$.b', '{}', 'definition', 1
    ) AS b$$,
    $$VALUES ('$.b.id', 'id "charge.v2" may hold only A-Z a-z 0-9 _ - (templates reach a '
              || 'block as outputs.<id>, and execution paths join ids with other characters)')$$,
    'sequence_block_problems: an id with a character templates and paths cannot carry'
);

SELECT results_eq(
    $$SELECT b.path, b.message
      FROM orch8.sequence_block_problems('{"id": ""}', '$.b', '{}', 'definition', 1) AS b$$,
    $$VALUES ('$.b.id', 'id must be a non-empty string'),
             ('$.b.type', 'type is required (step or a composite block)')$$,
    'sequence_block_problems: an empty id and a missing type'
);

SELECT results_eq(
    $$SELECT b.message FROM unnest(ARRAY['a_b_split', 'cancellation_scope']) AS t (type)
      CROSS JOIN LATERAL orch8.sequence_block_problems(
        jsonb_build_object('id', 'c', 'type', t.type), '$.b', '{}', 'definition', 1) AS b$$,
    $$SELECT format('block type "%s" is not supported yet', t.type)
      FROM unnest(ARRAY['a_b_split', 'cancellation_scope']) AS t (type)$$,
    'sequence_block_problems: the composite types this engine does not run are refused'
);

-- 8. Block ids --------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT d.path, d.message FROM orch8.sequence_block_id_problems(
        '{"blocks": [{"id": "a"}, {"id": "b"}, {"id": "a"}, {"id": 3}, {"id": "a"}]}') AS d$$,
    $$VALUES ('$.blocks[2].id', 'duplicate block id "a" (first used at $.blocks[0])'),
             ('$.blocks[4].id', 'duplicate block id "a" (first used at $.blocks[0])')$$,
    'sequence_block_id_problems: each repeat names the first use'
);

-- 9. Invariants ---------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT i.path, i.message FROM orch8.sequence_invariant_problems(
        '[{"name": "x", "type": "effect_at_most_once", "commit_guard": true},
          {"name": "x", "type": "effect_at_most_once", "kind": "fax", "commit_guard": "yes"},
          {"type": "effect_at_most_once", "kind": "http", "path": "data.x"},
          {"name": "y", "type": "eventually"},
          {"name": "z", "type": "terminal_state_in"},
          {"name": "w", "type": "effect_at_most_once", "kind": "http", "commit_guard": false},
          7]') AS i$$,
    $$VALUES
        ('$.invariants[0].kind', 'kind is required for effect_at_most_once '
         || '(one of http, model, message, storage, custom, worker)'),
        ('$.invariants[1].name', 'duplicate invariant name "x"'),
        ('$.invariants[1].kind', 'unknown effect kind "fax" '
         || '(known: http, model, message, storage, custom, worker)'),
        ('$.invariants[1].commit_guard', 'commit_guard must be true or false'),
        ('$.invariants[2].path', 'unknown field'),
        ('$.invariants[2].name', 'name is required (a non-empty string)'),
        ('$.invariants[2].commit_guard', 'effect_at_most_once is enforced as a commit guard: '
         || 'set commit_guard to true (a check after the fact is not supported yet)'),
        ('$.invariants[3].type', 'unknown invariant type "eventually" (known: effect_at_most_once)'),
        ('$.invariants[4].type', 'invariant type "terminal_state_in" is not supported yet'),
        ('$.invariants[5].commit_guard', 'effect_at_most_once is enforced as a commit guard: '
         || 'set commit_guard to true (a check after the fact is not supported yet)'),
        ('$.invariants[6]', 'an invariant must be a JSON object {name, type, kind, commit_guard}')$$,
    'sequence_invariant_problems: kind, names, types, commit_guard, shape, in order'
);

SELECT results_eq(
    $$SELECT i.message FROM orch8.sequence_invariant_problems('{}') AS i$$,
    $$VALUES ('invariants must be an array')$$,
    'sequence_invariant_problems: not an array is one problem'
);

-- 10. The top level ---------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT t.path, t.message FROM orch8.sequence_top_problems(
        '{"id": "x", "name": "n", "version": 1, "owner": "me", "status": {},
          "on_failure": [], "input_schema": {}, "blocks": []}') AS t$$,
    $$VALUES
        ('$.id', 'id is set by create_sequence, not by the document'),
        ('$.name', 'name is set by create_sequence, not by the document'),
        ('$.owner', 'unknown field'),
        ('$.status', 'status is not supported yet'),
        ('$.version', 'version is set by create_sequence, not by the document'),
        ('$.blocks', 'blocks must be a non-empty array of blocks'),
        ('$.on_failure', 'on_failure must be a non-empty array of blocks')$$,
    'sequence_top_problems: the document''s fields, then blocks'
);

SELECT results_eq(
    $$SELECT t.path, t.message FROM orch8.sequence_top_problems('{}') AS t$$,
    $$VALUES ('$.blocks', 'blocks is required (a non-empty array of blocks)')$$,
    'sequence_top_problems: blocks is required'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(pg_temp.many_steps(5000))$$,
    '5000 blocks are accepted'
);

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence(pg_temp.many_steps(5001)) AS v$$,
    $$VALUES ('$.blocks', 'more than 5000 blocks')$$,
    '5001 blocks are one problem (and their blocks are not walked)'
);

-- 11. validate_sequence: every problem, in document order -----------------------------------

SELECT results_eq(
    $$SELECT v.path, v.message FROM orch8.validate_sequence('[1]') AS v$$,
    $$VALUES ('$', 'a sequence definition must be a JSON object')$$,
    'a definition that is not an object is one problem'
);

SELECT is_empty(
    $$SELECT * FROM orch8.validate_sequence(pg_temp.def('good'))$$,
    'a valid definition has no problems'
);

SELECT results_eq(
    $$SELECT v.path FROM orch8.validate_sequence(pg_temp.def('bad')) AS v$$,
    $$VALUES
        ('$.status'),
        ('$.blocks[0].params.url'),
        ('$.blocks[0].params.headers["x-id"]'),
        ('$.blocks[0].retry.max_attempts'),
        ('$.blocks[1].queue_name'),
        ('$.blocks[2].type'),
        ('$.blocks[3].branches'),
        ('$.blocks[4].handler'),
        ('$.blocks[1].id'),
        ('$.invariants[0].kind'),
        ('$.invariants[1].type')$$,
    'validate_sequence: top level, each block, duplicate ids, invariants, in that order'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM orch8.validate_sequence(pg_temp.def('bad')) AS v
        INNER JOIN (
            VALUES
            ('$.status', 'status is not supported yet'),
            ('$.blocks[0].params.url', 'template "{{ nope.x }}" has an unknown root "nope"%'),
            ('$.blocks[0].params.headers["x-id"]', 'unclosed template%'),
            ('$.blocks[0].retry.max_attempts', 'max_attempts must be an integer from 1 to 100'),
            ('$.blocks[1].queue_name', 'queue_name is not supported yet'),
            ('$.blocks[2].type', 'unknown block type "teleport"%'),
            ('$.blocks[3].branches', 'branches is required: an array of 1 to 256 branches%'),
            ('$.blocks[4].handler', 'handler is required%'),
            ('$.blocks[1].id', 'duplicate block id "fetch" (first used at $.blocks[0])'),
            ('$.invariants[0].kind', 'unknown effect kind "telepathy"%'),
            ('$.invariants[1].type', 'invariant type "no_unknown_effects" is not supported yet')
        ) AS e (path, pattern) ON v.path = e.path AND v.message LIKE e.pattern
    ),
    11,
    'each problem says what is wrong'
);

-- 12. create_sequence and get_sequence ----------------------------------------------------

SELECT is(s.version, 1, 'the first create_sequence of a name stores version 1')
FROM orch8.create_sequence('acme', 'default', 'checkout', pg_temp.def('good')) AS s;

SELECT is(s.version, 2, 'the next create_sequence of the same name stores version 2')
FROM orch8.create_sequence('acme', 'default', 'checkout', pg_temp.def('good')) AS s;

SELECT is(s.version, 1, 'versions count per namespace')
FROM orch8.create_sequence('acme', 'billing', 'checkout', pg_temp.def('good')) AS s;

SELECT is(s.version, 1, 'versions count per tenant')
FROM orch8.create_sequence('globex', 'default', 'checkout', pg_temp.def('good')) AS s;

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout')).version, 2,
    'get_sequence without a version returns the latest'
);

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout', 1)).version, 1,
    'get_sequence with a version returns that version'
);

SELECT ok(
    (orch8.get_sequence('acme', 'default', 'nothing')).id IS NULL
    AND (orch8.get_sequence('acme', 'default', 'checkout', 3)).id IS NULL,
    'get_sequence of a missing name or version returns a row of NULLs'
);

SELECT is(
    (orch8.get_sequence('acme', 'default', 'checkout', 1)).definition, pg_temp.def('good'),
    'the stored definition is the document as given'
);

SELECT results_eq(
    $$SELECT i.name, i.rule, i.commit_guard, i.sequence_version, i.instance_id IS NULL
      FROM orch8.get_sequence('acme', 'default', 'checkout', 2) AS s
      INNER JOIN orch8.workflow_invariants AS i
          ON i.tenant_id = s.tenant_id AND i.sequence_id = s.id$$,
    $$VALUES ('charge once', '{"type": "effect_at_most_once", "kind": "http"}'::jsonb,
              true, 2, true)$$,
    'a declared commit guard is recorded for the new sequence version'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('acme', 'default', 'broken', pg_temp.def('bad'))$$,
    'O8008',
    'sequence definition has 11 problem(s)',
    'create_sequence refuses an invalid definition with O8008 and the problem count'
);

SELECT is(
    pg_temp.error_detail(
        $$SELECT orch8.create_sequence('acme', 'default', 'broken', pg_temp.def('bad'))$$
    )::jsonb,
    (
        SELECT
            jsonb_build_object('problems', jsonb_agg(
                jsonb_build_object('path', v.path, 'message', v.message)
            ))
        FROM orch8.validate_sequence(pg_temp.def('bad')) AS v
    ),
    'the error detail is {"problems": [{path, message}, ...]}, as validate_sequence lists them'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.sequences AS s
        WHERE s.name = 'broken'
    )
    + (
        SELECT count(*)::integer FROM orch8.workflow_invariants AS i
        WHERE i.tenant_id = 'acme' AND i.sequence_version IS NULL
    ),
    0,
    'nothing is stored or declared for an invalid definition'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('acme', 'bad namespace', 'x', pg_temp.def('good'))$$,
    'O8008',
    'invalid sequence namespace: ''bad namespace''',
    'a namespace that is not an orch8.identifier is O8008'
);

SELECT is(
    pg_temp.error_detail(
        $$SELECT orch8.create_sequence('acme', 'bad namespace', 'x', pg_temp.def('good'))$$
    )::jsonb,
    '{"field": "sequence namespace", "rule": "1 to 100 characters among A-Z a-z 0-9 _ . -"}',
    'its detail names the field and the rule (the domain''s comment)'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('acme', 'default', repeat('n', 201), pg_temp.def('good'))$$,
    'O8008', NULL,
    'a name longer than 200 characters is O8008'
);

SELECT throws_ok(
    $$SELECT orch8.create_sequence('', 'default', 'x', pg_temp.def('good'))$$,
    'O8008', 'invalid tenant id: ''''',
    'an empty tenant is O8008'
);

SELECT results_eq(
    $$SELECT o.namespace, o.name, o.latest_version, o.versions, o.blocks
      FROM orch8.sequence_overview AS o WHERE o.tenant_id = 'acme' ORDER BY 1, 2$$,
    $$VALUES ('billing'::text, 'checkout'::text, 1, 1::bigint, 1),
             ('default', 'checkout', 2, 2, 1)$$,
    'sequence_overview: one row per name with its latest version and version count'
);

SELECT * FROM finish();
ROLLBACK;
