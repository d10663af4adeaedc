"""The engine's rules as the database defines them, for Python code that needs them
without a connection (argparse choices, request models, the OpenAPI document, templates).

GENERATED from a migrated database by `make rules` (orch8_py/sqlapi/catalog.py): do not
edit. The definitions are in sql/migrations/ and sql/functions/ (docs/SQL_API.md);
tests/test_rules.py fails when this file is stale.
"""
# ruff: noqa: E501
# fmt: off

INSTANCE_STATES = ('scheduled', 'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled')

EFFECT_STATES = ('planned',
 'prepared',
 'dispatched',
 'committed',
 'unknown',
 'verified',
 'compensated',
 'abandoned')

EFFECT_KINDS = ('http', 'model', 'message', 'storage', 'custom', 'worker')

WEBHOOK_EVENTS = ('instance.completed', 'instance.failed', 'instance.sla_breached')

OUTBOX_STATES = ('pending', 'delivering', 'delivered', 'parked', 'discarded')

API_KEY_ROLES = ('operator', 'worker', 'auditor', 'admin')

BULK_ACTIONS = ('retry', 'cancel', 'pause', 'resume')

SCHEDULE_STATES = ('active', 'paused', 'ended')

OVERLAP_POLICIES = ('allow', 'skip', 'buffer_one', 'cancel_previous')

SCHEDULE_FIRE_OUTCOMES = ('started', 'skipped_overlap', 'buffered', 'missed', 'cancelled_previous', 'failed')

EFFECT_TRANSITIONS = {'planned': ('prepared', 'abandoned'),
 'prepared': ('dispatched', 'abandoned'),
 'dispatched': ('committed', 'unknown'),
 'committed': ('compensated',),
 'unknown': ('committed', 'verified', 'compensated', 'abandoned'),
 'verified': ('compensated',)}

INSTANCE_TRANSITIONS = {'scheduled': ('running', 'waiting', 'paused', 'completed', 'failed', 'cancelled'),
 'running': ('scheduled', 'waiting', 'paused', 'completed', 'failed', 'cancelled'),
 'waiting': ('scheduled', 'running', 'paused', 'completed', 'failed', 'cancelled'),
 'paused': ('scheduled', 'waiting', 'completed', 'failed', 'cancelled'),
 'failed': ('scheduled', 'waiting', 'completed')}

RESOLUTIONS = {'committed': ('compensated',),
 'unknown': ('committed', 'verified', 'compensated', 'abandoned'),
 'verified': ('compensated',)}

RESOLUTIONS_NEEDING_EVIDENCE = ('abandoned', 'compensated')

LIMITS = {'actor_chars': 200,
 'block_id_chars': 200,
 'branches': 256,
 'bulk_batch': 1000,
 'context_bytes': 262144,
 'create_batch': 10000,
 'definition_bytes': 1048576,
 'error_chars': 2000,
 'evidence_bytes': 65536,
 'for_each_concurrency': 64,
 'idempotency_key_bytes': 256,
 'json_depth': 64,
 'max_concurrency': 100000,
 'max_iterations': 100000,
 'nesting_depth': 32,
 'note_bytes': 2000,
 'params_bytes': 1048576,
 'provider_receipt_id_bytes': 256,
 'resolution_output_bytes': 262144,
 'retry_max_attempts': 100,
 'sequence_blocks': 5000,
 'signal_payload_bytes': 65536,
 'state_key_bytes': 256,
 'state_value_bytes': 262144,
 'step_batch': 64,
 'sub_sequence_depth': 8,
 'verify_delay_ms': 86400000,
 'verify_request_receipts': 1000,
 'verify_tries': 50,
 'wait_ms': 31622400000,
 'worker_checkpoint_bytes': 65536,
 'worker_lease_ms': 600000,
 'worker_poll_handlers': 100,
 'worker_poll_tasks': 100,
 'worker_poll_wait_ms': 60000}

PATTERNS = {'identifier': {'pattern': '^[A-Za-z0-9_.-]{1,100}$',
                'rule': '1 to 100 characters among A-Z a-z 0-9 _ . -'},
 'sequence_name': {'pattern': '^[A-Za-z0-9_.-]{1,200}$',
                   'rule': '1 to 200 characters among A-Z a-z 0-9 _ . -'},
 'sha256_digest': {'pattern': '^[0-9a-f]{64}$',
                   'rule': 'a SHA-256 digest as 64 lower-case hex digits'},
 'signal_type': {'pattern': '^[A-Za-z0-9_.:-]{1,100}$',
                 'rule': '1 to 100 characters among A-Z a-z 0-9 _ . : -'},
 'webhook_url': {'pattern': '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\\x00\\t\\n\\x0B\\f\\r '
                            '\\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000\\uFEFF]+[^\\x00\\t\\n\\x0B\\f\\r '
                            '\\x85\\xA0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000\\uFEFF]*$',
                 'rule': 'an http:// or https:// URL with a host (no spaces)'}}

TEMPLATE_ROOTS = ('data', 'config', 'outputs', 'instance_id', 'runtime')

TEMPLATE_PLACEHOLDER = '\\{\\{(.*?)\\}\\}'

TEMPLATE_EXPRESSION = "^(data|config|outputs|instance_id|runtime)((?:\\.[A-Za-z0-9_-]+)*)(?:\\s*\\|\\s*'([^']*)')?$"

TEMPLATE_EXPRESSION_SHAPE = "^(ROOTS)((?:\\.[A-Za-z0-9_-]+)*)(?:\\s*\\|\\s*'([^']*)')?$"

VERIFY_TEMPLATE_ROOTS = ('effect', 'params', 'data', 'config', 'instance_id')

VERIFY_TEMPLATE_EXPRESSION = "^(effect|params|data|config|instance_id)((?:\\.[A-Za-z0-9_-]+)*)(?:\\s*\\|\\s*'([^']*)')?$"

VERIFY_EXPRESSION_ROOTS = ('response', 'effect', 'params', 'data', 'config')

AMBIGUITY_MODES = ('same_key', 'new_attempt', 'settle')

VERIFICATION_METHODS = ('http', 'replay', 'handler')

VERIFICATION_STATES = ('pending', 'escalated', 'settled')

VERIFY_HTTP_METHODS = ('GET', 'POST')

DEFAULT_VERIFY_SCHEDULE = (1000, 5000, 30000, 120000, 600000)

RETRY_DEFAULTS = {'max_attempts': 3, 'initial_backoff': 1000, 'max_backoff': 60000, 'backoff_multiplier': 2.0}

BUILTIN_HANDLERS = {'agent': {'side_effects': True, 'kind': 'model', 'implemented': False},
 'assert': {'side_effects': False, 'kind': None, 'implemented': True},
 'blob_get': {'side_effects': False, 'kind': None, 'implemented': False},
 'blob_put': {'side_effects': True, 'kind': 'storage', 'implemented': False},
 'delete_state': {'side_effects': False, 'kind': None, 'implemented': True},
 'embed': {'side_effects': True, 'kind': 'model', 'implemented': False},
 'emit_event': {'side_effects': True, 'kind': 'message', 'implemented': False},
 'fail': {'side_effects': False, 'kind': None, 'implemented': True},
 'get_state': {'side_effects': False, 'kind': None, 'implemented': True},
 'http_request': {'side_effects': True, 'kind': 'http', 'implemented': True},
 'human_review': {'side_effects': False, 'kind': None, 'implemented': False},
 'llm_call': {'side_effects': True, 'kind': 'model', 'implemented': True},
 'log': {'side_effects': False, 'kind': None, 'implemented': True},
 'mcp_call': {'side_effects': True, 'kind': 'custom', 'implemented': False},
 'memory_delete': {'side_effects': True, 'kind': 'storage', 'implemented': False},
 'memory_search': {'side_effects': False, 'kind': None, 'implemented': False},
 'memory_store': {'side_effects': True, 'kind': 'storage', 'implemented': False},
 'merge_state': {'side_effects': False, 'kind': None, 'implemented': True},
 'noop': {'side_effects': False, 'kind': None, 'implemented': True},
 'query_instance': {'side_effects': False, 'kind': None, 'implemented': False},
 'self_modify': {'side_effects': True, 'kind': 'custom', 'implemented': False},
 'send_signal': {'side_effects': True, 'kind': 'message', 'implemented': False},
 'set_state': {'side_effects': False, 'kind': None, 'implemented': True},
 'sleep': {'side_effects': False, 'kind': None, 'implemented': True},
 'tool_call': {'side_effects': True, 'kind': 'custom', 'implemented': True},
 'transform': {'side_effects': False, 'kind': None, 'implemented': True},
 'wait_for_event': {'side_effects': False, 'kind': None, 'implemented': False}}

NODE_STATES = ('ready', 'running', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled')

NODE_TRANSITIONS = {'ready': ('running', 'cancelled'),
 'running': ('ready', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled'),
 'waiting': ('ready', 'running', 'blocked', 'completed', 'failed', 'cancelled'),
 'blocked': ('ready', 'waiting', 'completed', 'failed', 'cancelled'),
 'failed': ('ready', 'running', 'completed'),
 'cancelled': ('ready', 'running', 'waiting', 'blocked')}

NODE_KINDS = ('sequence',
 'step',
 'compensation',
 'parallel',
 'race',
 'loop',
 'for_each',
 'router',
 'try_catch',
 'saga',
 'undo',
 'sub_sequence',
 'sleep',
 'wait_for_signal',
 'wait_for_input')

CLAIMABLE_KINDS = ('step', 'compensation', 'loop', 'for_each', 'router', 'sub_sequence', 'wait_for_input')

BUILTIN_SIGNALS = ('cancel', 'pause', 'resume', 'update_context', 'input')

WAIT_REASONS = ('time', 'signal', 'input', 'child', 'verification', 'worker')

DEFERRAL_REASONS = ('rate_limit', 'rate_limit_undefined')

WORKER_TASK_STATES = ('queued', 'running', 'completed', 'failed', 'timed_out', 'blocked', 'cancelled')

WORKER_TASK_TRANSITIONS = {'queued': ('cancelled', 'running', 'timed_out'),
 'running': ('blocked', 'completed', 'failed', 'queued', 'timed_out')}

WORKER_TASK_EVENTS = ('queued',
 'claimed',
 'started',
 'redelivered',
 'cancel_requested',
 'completed',
 'failed',
 'timed_out',
 'blocked',
 'cancelled')

BLOCK_DEFAULTS = {'max_iterations': 1000,
 'concurrency': 1,
 'item_var': 'item',
 'index_var': 'index',
 'on_branch_failure': 'fail',
 'semantics': 'first_to_resolve'}

SEQUENCE_LANGUAGE = (('definition', 'blocks', True, 'a non-empty array of blocks, run in order'),
 ('definition', 'invariants', True, 'declared invariants'),
 ('definition', 'interceptors', False, 'not supported yet'),
 ('definition',
  'input_schema',
  True,
  "a JSON Schema the instance's data must match when it starts"),
 ('definition', 'output_schema', False, 'not supported yet'),
 ('definition',
  'sla',
  True,
  'a duration from when the instance is due to start: not ended by then, it missed its sla (an '
  'instance.sla_breached webhook; on_sla_breach says what else)'),
 ('definition',
  'on_sla_breach',
  True,
  'fail (the default: open blocks are withdrawn and the instance fails with code sla, running '
  'on_failure) or notify (the webhook only; the instance goes on)'),
 ('definition',
  'concurrency_key',
  True,
  'a key ({{ data.x }}, {{ config.x }} templates, rendered when the instance is created) each '
  'of its steps that declares none holds while it runs'),
 ('definition',
  'max_concurrency',
  True,
  "how many steps of the tenant may hold the definition's concurrency_key at once"),
 ('definition',
  'on_failure',
  True,
  'blocks run when the instance fails ({{ error }} bound), before it ends failed'),
 ('definition',
  'on_cancel',
  True,
  'blocks run when the instance is cancelled, before it ends cancelled'),
 ('definition', 'deprecated', False, 'not supported yet'),
 ('definition', 'status', False, 'not supported yet'),
 ('definition', 'id', False, 'set by create_sequence, not by the document'),
 ('definition', 'tenant_id', False, 'set by create_sequence, not by the document'),
 ('definition', 'namespace', False, 'set by create_sequence, not by the document'),
 ('definition', 'name', False, 'set by create_sequence, not by the document'),
 ('definition', 'version', False, 'set by create_sequence, not by the document'),
 ('definition', 'created_at', False, 'set by create_sequence, not by the document'),
 ('block_type', 'step', True, 'runs one handler'),
 ('block_type', 'parallel', True, 'runs its branches at once'),
 ('block_type', 'race', True, 'runs its branches at once; the first to end wins'),
 ('block_type', 'loop', True, 'runs its body while a condition holds'),
 ('block_type', 'for_each', True, 'runs its body once per item of a collection'),
 ('block_type', 'router', True, 'runs the blocks of the first route whose condition holds'),
 ('block_type', 'try_catch', True, 'runs catch blocks when the try blocks fail, then finally'),
 ('block_type', 'sub_sequence', True, 'runs another sequence as a child instance'),
 ('block_type',
  'saga',
  True,
  'runs its blocks in order; when one fails, compensates the completed steps'),
 ('block_type', 'sleep', True, 'waits for a duration, holding no runner'),
 ('block_type', 'wait_for_signal', True, 'waits for a named signal, with a timeout'),
 ('block_type',
  'wait_for_input',
  True,
  'waits for a person to answer a prompt with one of its choices, with a timeout'),
 ('block_type', 'a_b_split', False, 'not supported yet'),
 ('block_type', 'cancellation_scope', False, 'not supported yet'),
 ('step', 'type', True, 'step'),
 ('step', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('step', 'handler', True, 'the handler to run'),
 ('step', 'params', True, "the handler's parameters, with {{ }} templates"),
 ('step', 'timeout', True, 'milliseconds the handler may run'),
 ('step', 'retry', True, 'the retry policy'),
 ('step',
  'provider_idempotency',
  True,
  'the provider deduplicates by the idempotency key: one key for every attempt, and a retry '
  'after an ambiguous outcome resends under it'),
 ('step', 'verify', True, 'how to settle an unknown outcome without a person'),
 ('step',
  'delay',
  True,
  'a duration to wait before the first attempt (ms, or 30s, 15m, 2h, 3d)'),
 ('step',
  'rate_limit_key',
  True,
  "the tenant's rate limit (orch8.set_rate_limit) the step takes a token from before it "
  'starts; without one it is deferred to when one will be, never failed'),
 ('step',
  'concurrency_key',
  True,
  'a key ({{ data.x }}, {{ config.x }}, {{ instance_id }} templates, rendered when the step '
  'becomes ready) the step holds while it runs'),
 ('step',
  'max_concurrency',
  True,
  'how many steps of the tenant may hold its concurrency_key at once'),
 ('step',
  'send_window',
  True,
  'days and hours in a time zone when the step may start; outside them it waits for the next '
  'opening (the first attempt and each retry)'),
 ('step', 'context_access', False, 'not supported yet'),
 ('step', 'cancellable', False, 'not supported yet'),
 ('step',
  'wait_for_input',
  False,
  "not a step field here: a person's answer is the wait_for_input block"),
 ('step', 'queue_name', False, 'not supported yet'),
 ('step',
  'deadline',
  True,
  'a duration from when the step starts (delay included): not completed by then, it fails with '
  'code deadline'),
 ('step', 'on_deadline_breach', True, 'what a missed deadline does: fail (the only one)'),
 ('step', 'fallback_handler', False, 'not supported yet'),
 ('step', 'cache_key', False, 'not supported yet'),
 ('step',
  'output_schema',
  True,
  "a JSON Schema the handler's output must match (else a failure no retry repairs)"),
 ('step', 'when', True, 'an expression: when false, the step is skipped'),
 ('step', 'compensation', True, 'in a saga: the handler call that undoes this step'),
 ('send_window', 'timezone', True, 'the time zone of days, start and end (pg_timezone_names)'),
 ('send_window',
  'days',
  True,
  'the days it is open: mon tue wed thu fri sat sun (all when omitted)'),
 ('send_window', 'start', True, 'the local time it opens, HH:MM'),
 ('send_window',
  'end',
  True,
  'the local time it closes, HH:MM up to 24:00, after start (not across midnight)'),
 ('retry', 'max_attempts', True, 'attempts in all, the first included'),
 ('retry', 'initial_backoff', True, 'milliseconds before the second attempt'),
 ('retry', 'max_backoff', True, 'the longest wait, in milliseconds'),
 ('retry', 'backoff_multiplier', True, 'how the wait grows per attempt'),
 ('retry', 'non_retryable_codes', True, 'error codes that fail the step at once'),
 ('retry',
  'on_ambiguous',
  True,
  'after an ambiguous outcome: same_key, new_attempt or settle (orch8.ambiguity_modes)'),
 ('retry',
  'retry_if',
  True,
  'an expression over error (message, code, attempt): false fails the step at once'),
 ('parallel', 'type', True, 'parallel'),
 ('parallel', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('parallel', 'branches', True, 'an array of branches, each a non-empty array of blocks'),
 ('parallel',
  'on_branch_failure',
  True,
  'fail (default: the first failed branch fails the block and cancels the others) or continue '
  "(every branch runs; the output lists each one's output or error)"),
 ('race', 'type', True, 'race'),
 ('race', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('race', 'branches', True, 'two or more branches, each a non-empty array of blocks'),
 ('race',
  'semantics',
  True,
  'first_to_resolve (default: the first branch to complete or fail decides) or '
  'first_to_succeed (the first to complete; fails when every branch failed)'),
 ('loop', 'type', True, 'loop'),
 ('loop', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('loop', 'condition', True, 'an expression asked before each iteration'),
 ('loop', 'body', True, 'the blocks of one iteration ({{ iteration }} is its number)'),
 ('loop',
  'max_iterations',
  True,
  'at most this many iterations (default 1000): a condition still true then fails the loop'),
 ('loop', 'break_on', True, 'an expression asked after each iteration: true ends the loop'),
 ('for_each', 'type', True, 'for_each'),
 ('for_each', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('for_each', 'collection', True, 'an expression whose value is the list of items'),
 ('for_each', 'body', True, 'the blocks run for one item'),
 ('for_each', 'item_var', True, 'the name the item has in the body (default item)'),
 ('for_each', 'index_var', True, "the name of the item's position (default index)"),
 ('for_each',
  'max_iterations',
  True,
  'at most this many items (default 1000): a longer collection fails the block'),
 ('for_each', 'concurrency', True, 'how many items run at once (default 1)'),
 ('router', 'type', True, 'router'),
 ('router', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('router', 'routes', True, 'an array of {condition, blocks}, asked in order'),
 ('router', 'default', True, "the blocks run when no route's condition holds"),
 ('route', 'condition', True, 'an expression'),
 ('route', 'blocks', True, 'the blocks run when it is the first that holds'),
 ('try_catch', 'type', True, 'try_catch'),
 ('try_catch', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('try_catch', 'try_block', True, 'the blocks tried'),
 ('try_catch',
  'catch_block',
  True,
  'the blocks run when the try blocks fail ({{ error }}: message, code, path)'),
 ('try_catch', 'finally_block', True, 'the blocks run after the try or catch blocks'),
 ('saga', 'type', True, 'saga'),
 ('saga', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('saga', 'blocks', True, 'the blocks run in order; its steps may declare a compensation'),
 ('sub_sequence', 'type', True, 'sub_sequence'),
 ('sub_sequence', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('sub_sequence', 'sequence_name', True, 'the sequence the child instance runs'),
 ('sub_sequence', 'namespace', True, "its namespace (default: the parent's)"),
 ('sub_sequence', 'version', True, 'its version (default: the latest when the child starts)'),
 ('sub_sequence', 'input', True, "the child's data, with {{ }} templates"),
 ('sleep', 'type', True, 'sleep'),
 ('sleep', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('sleep', 'duration', True, 'how long (ms, or 30s, 15m, 2h, 3d, 1h30m)'),
 ('wait_for_signal', 'type', True, 'wait_for_signal'),
 ('wait_for_signal', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('wait_for_signal',
  'signal',
  True,
  "the signal's name (a custom one: not cancel, pause, resume, update_context, input)"),
 ('wait_for_signal', 'timeout', True, 'how long to wait (a duration); none: forever'),
 ('wait_for_signal',
  'on_timeout',
  True,
  'the blocks run when it times out (without them, a timeout fails the block)'),
 ('wait_for_input', 'type', True, 'wait_for_input'),
 ('wait_for_input', 'id', True, 'unique among the blocks; A-Z a-z 0-9 _ -'),
 ('wait_for_input', 'prompt', True, 'what the person is asked, with {{ }} templates'),
 ('wait_for_input', 'choices', True, 'the answers they may give: 1 to 20 distinct strings'),
 ('wait_for_input', 'timeout', True, 'how long to wait (a duration); none: forever'),
 ('wait_for_input',
  'on_timeout',
  True,
  'the blocks run when nobody answered in time: escalation (without them, a timeout fails the '
  'block)'),
 ('compensation', 'handler', True, 'the handler that undoes the step'),
 ('compensation', 'params', True, 'its parameters, with {{ }} templates'),
 ('compensation', 'timeout', True, 'milliseconds the handler may run'),
 ('compensation', 'retry', True, 'its retry policy'),
 ('verify', 'http', True, 'a lookup request {method, url, headers} with {{ }} templates'),
 ('verify',
  'applied_if',
  True,
  'http: an expression over response, effect, params that is true when it happened'),
 ('verify',
  'not_applied_if',
  True,
  'http: an expression that is true when it did not happen (else inconclusive)'),
 ('verify',
  'receipt_path',
  True,
  "http: where the provider receipt id is in the lookup's output, e.g. json.id"),
 ('verify',
  'replay',
  True,
  'true: resend the identical request under the same key (needs provider_idempotency)'),
 ('verify', 'handler', True, 'true: the Python verifier registered beside the handler'),
 ('verify',
  'schedule',
  True,
  'milliseconds before each try; after the last inconclusive one, escalated'),
 ('verify', 'on_verified', True, 'continue (default) or stop'),
 ('verify', 'on_not_applied', True, 'retry (default, within retry.max_attempts) or stop'),
 ('verify_http', 'method', True, 'GET (default) or POST'),
 ('verify_http', 'url', True, 'the lookup URL'),
 ('verify_http', 'headers', True, 'an object of header name -> string'),
 ('invariant', 'name', True, 'unique among the invariants'),
 ('invariant', 'type', True, 'the rule'),
 ('invariant', 'kind', True, 'the effect kind it guards'),
 ('invariant', 'commit_guard', True, 'checked before dispatch'),
 ('invariant_type',
  'effect_at_most_once',
  True,
  'a commit guard: identical content of this kind is dispatched at most once'),
 ('invariant_type', 'no_unknown_effects', False, 'not supported yet'),
 ('invariant_type', 'terminal_state_in', False, 'not supported yet'),
 ('invariant_type', 'output_path_present', False, 'not supported yet'))
# fmt: on
