-- A comment on every column of the tables (issue 15): a DBA reading \d+ in psql sees what
-- each value means, its unit or format, who writes it and what NULL means. The views'
-- columns are commented beside each view, in the function files that (re)create them
-- after the migrations run. sql_tests/38_column_comments.sql keeps every column
-- commented.

COMMENT ON COLUMN orch8.api_keys.tenant_id IS
'The tenant the key belongs to and acts in; an admin key may also enter any other tenant '
'(enter_tenant).';

COMMENT ON COLUMN orch8.api_keys.id IS
'The key''s id (gen_random_uuid()): what history rows record as api_key_id and what '
'console sessions point to.';

COMMENT ON COLUMN orch8.api_keys.name IS
'A label for people, the role''s name when none was given. History rows written with the '
'key name it as key:<name>.';

COMMENT ON COLUMN orch8.api_keys.role IS
'What the key may do, one of orch8.api_key_roles(): operator (everything in its tenant), '
'worker (the worker endpoints), auditor (read only) or admin (any tenant).';

COMMENT ON COLUMN orch8.api_keys.key_prefix IS
'The visible start of the key (o8_ and 8 hex digits), to recognise it in lists; not '
'enough to authenticate and not unique by constraint.';

COMMENT ON COLUMN orch8.api_keys.key_hash IS
'Lowercase hex SHA-256 of the whole key (the key itself is never stored); unique, it is '
'how authenticate_api_key and enter_tenant find the key.';

COMMENT ON COLUMN orch8.api_keys.created_at IS 'When the key was created (orch8.now()).';

COMMENT ON COLUMN orch8.api_keys.last_used_at IS
'When authenticate_api_key last accepted the key, refreshed at most once a minute '
'(enter_tenant does not touch it). NULL: never authenticated.';

COMMENT ON COLUMN orch8.api_keys.revoked_at IS
'When revoke_api_key revoked the key; from then it authenticates nothing and its console '
'sessions stop working. NULL: not revoked.';

COMMENT ON COLUMN orch8.block_outputs.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.block_outputs.instance_id IS 'The instance whose node wrote the row.';

COMMENT ON COLUMN orch8.block_outputs.seq IS
'Order of the rows (an identity, increasing across the whole table): for one path the row '
'with the highest seq is the latest, which compute_attempt reads.';

COMMENT ON COLUMN orch8.block_outputs.attempt IS
'The attempt (0-based) of the step that wrote the row. A composite''s output row has 0, a '
'__decision__ row the node''s position (a loop''s iteration).';

COMMENT ON COLUMN orch8.block_outputs.sentinel IS
'NULL for a real output, else a marker: __in_progress__ (receipt dispatched, handler '
'about to run), __retry__ (failed, retried later), __error__ (failed for good), '
'__unsettled__ (outcome unknown, waiting to be settled), __skipped__ (its when was false) '
'or __decision__ (the value a loop, for_each or router decided on).';

COMMENT ON COLUMN orch8.block_outputs.output IS
'JSON: the output of the step or composite when sentinel is NULL (a JSON null is stored '
'as null); the error (message, code...) for __error__ and __retry__; {error, effect_id} '
'for __unsettled__; {when, value} (the expression and what it gave) for __skipped__; '
'{asking, value, error, iteration} for __decision__; NULL for __in_progress__.';

COMMENT ON COLUMN orch8.block_outputs.retryable IS
'Whether the failure may be retried: true on __retry__ rows, false on __error__ rows '
'(never NULL there), NULL on the others.';

COMMENT ON COLUMN orch8.block_outputs.effect_id IS
'The receipt (effect_receipts.id) of the attempt the row belongs to; NULL for a pure '
'handler and for rows without a side effect (decisions, composite outputs, timeouts).';

COMMENT ON COLUMN orch8.block_outputs.lease_token IS
'The node lease the row was written under, so a runner that repeats a call after a lost '
'answer finds its own row; NULL when written without one (an operator''s retry, a '
'verifier''s settlement, a composite''s output, a timer or sla sweep).';

COMMENT ON COLUMN orch8.block_outputs.created_at IS 'When the row was written (orch8.now()).';

COMMENT ON COLUMN orch8.builtin_handlers.name IS
'The builtin handler''s name, as a step''s handler field gives it; these names are '
'reserved, so no external worker handler may take one.';

COMMENT ON COLUMN orch8.builtin_handlers.has_side_effects IS
'Whether the handler reaches outside the engine: true means every run gets a receipt in '
'effect_receipts before it starts, false that it is pure.';

COMMENT ON COLUMN orch8.builtin_handlers.kind IS
'The effect kind its receipts record (http, model, message, storage or custom); NULL '
'exactly when has_side_effects is false. A handler not listed here has kind worker.';

COMMENT ON COLUMN orch8.console_sessions.tenant_id IS 'The tenant of the API key that logged in.';

COMMENT ON COLUMN orch8.console_sessions.id IS 'The session''s id (gen_random_uuid()).';

COMMENT ON COLUMN orch8.console_sessions.key_id IS
'The API key used to log in (api_keys.id); revoking it, or its expiry, ends the session '
'too.';

COMMENT ON COLUMN orch8.console_sessions.token_hash IS
'Lowercase hex SHA-256 of the random token the console cookie carries (the token itself '
'is never stored); unique.';

COMMENT ON COLUMN orch8.console_sessions.created_at IS 'When the login happened (orch8.now()).';

COMMENT ON COLUMN orch8.console_sessions.expires_at IS
'When the session stops working: the login time plus the console''s maximum session age, '
'or the key''s own expiry when that comes first.';

COMMENT ON COLUMN orch8.console_sessions.ended_at IS
'When the user logged out (end_console_session); NULL while nobody ended it.';

COMMENT ON COLUMN orch8.continuity_executions.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.continuity_executions.continuity_id IS
'The ledger scope''s id, hashed into every receipt id of the instance '
'(deterministic_effect_id). A new scope derives it from the instance id (effect_scope_id '
'with prefix orch8-effect-scope-v1).';

COMMENT ON COLUMN orch8.continuity_executions.epoch IS
'The scope''s ownership epoch, also hashed into receipt ids (0 or more). This engine '
'creates scopes at 0 and never raises it.';

COMMENT ON COLUMN orch8.continuity_executions.owner_runtime_id IS
'The id of the runtime owning the scope, derived from the instance id (effect_scope_id '
'with prefix orch8-effect-runtime-v1); nothing in this engine reads it.';

COMMENT ON COLUMN orch8.continuity_executions.current_instance_id IS
'The instance the scope belongs to, unique per tenant; ensure_effect_scope finds the '
'scope by it.';

COMMENT ON COLUMN orch8.continuity_executions.state IS
'owned, transferring or completed. This engine creates every scope owned and no function '
'moves it yet.';

COMMENT ON COLUMN orch8.continuity_executions.created_at IS
'When the scope was created, at the instance''s first side-effecting step '
'(ensure_effect_scope).';

COMMENT ON COLUMN orch8.continuity_executions.updated_at IS
'When the scope last changed; no function of this engine changes a scope, so it equals '
'created_at.';

COMMENT ON COLUMN orch8.effect_receipt_events.tenant_id IS 'The receipt''s tenant.';

COMMENT ON COLUMN orch8.effect_receipt_events.receipt_id IS
'The receipt (effect_receipts.id). Written by the receipts'' trigger and by '
'append_receipt_event; no foreign key (migration 0021 dropped it for speed).';

COMMENT ON COLUMN orch8.effect_receipt_events.event_id IS
'Order of the events (an identity, increasing across the whole table).';

COMMENT ON COLUMN orch8.effect_receipt_events.from_state IS
'The receipt''s state before the event: NULL for its creation, equal to to_state for an '
'event that moves nothing (a verification scheduled, an inconclusive try, an escalation).';

COMMENT ON COLUMN orch8.effect_receipt_events.to_state IS
'The receipt''s state after the event (orch8.effect_state).';

COMMENT ON COLUMN orch8.effect_receipt_events.actor IS
'Who made the change, as orch8.attributed_actor records it: a trusted caller''s label '
'(engine, verifier:<method>, saga, an operator''s name), key:<name> for a sealed API key, '
'else the login.';

COMMENT ON COLUMN orch8.effect_receipt_events.note IS
'A short explanation of the change (handler succeeded, resolved by operator, guarded '
'dispatch...); NULL when none was given.';

COMMENT ON COLUMN orch8.effect_receipt_events.evidence IS
'The evidence given with the change, as JSON: what was merged into the receipt''s '
'evidence (a resolution, a not_applied proof) or a non-moving event''s details. NULL when '
'none.';

COMMENT ON COLUMN orch8.effect_receipt_events.at IS 'When the event was written (orch8.now()).';

COMMENT ON COLUMN orch8.effect_receipt_overview.tenant_id IS 'The receipt''s tenant.';

COMMENT ON COLUMN orch8.effect_receipt_overview.id IS 'The receipt''s id (effect_receipts.id).';

COMMENT ON COLUMN orch8.effect_receipt_overview.continuity_id IS
'The ledger scope the receipt belongs to (continuity_executions).';

COMMENT ON COLUMN orch8.effect_receipt_overview.epoch IS
'The scope''s ownership epoch when the receipt was written.';

COMMENT ON COLUMN orch8.effect_receipt_overview.instance_id IS
'The instance whose step made the effect.';

COMMENT ON COLUMN orch8.effect_receipt_overview.block_id IS
'The path of the step''s node (effect_receipts.block_id).';

COMMENT ON COLUMN orch8.effect_receipt_overview.attempt IS 'The step''s attempt, 0-based.';

COMMENT ON COLUMN orch8.effect_receipt_overview.kind IS
'The effect kind: http, model, message, storage, custom or worker.';

COMMENT ON COLUMN orch8.effect_receipt_overview.state IS
'The receipt''s state: planned, prepared, dispatched, committed, unknown, verified, '
'compensated or abandoned.';

COMMENT ON COLUMN orch8.effect_receipt_overview.handler IS 'The handler the step ran.';

COMMENT ON COLUMN orch8.effect_receipt_overview.destination_fingerprint IS
'Hex SHA-256 of where the effect goes (effect_receipts.destination_fingerprint).';

COMMENT ON COLUMN orch8.effect_receipt_overview.request_sha256 IS
'Hex SHA-256 of the request''s content (effect_receipts.request_sha256).';

COMMENT ON COLUMN orch8.effect_receipt_overview.idempotency_key IS
'The key sent to the provider with the effect.';

COMMENT ON COLUMN orch8.effect_receipt_overview.provider_receipt_id IS
'The provider''s own id for the effect; NULL when unknown.';

COMMENT ON COLUMN orch8.effect_receipt_overview.error IS
'Why the outcome became unknown; NULL when there was none or once resolved.';

COMMENT ON COLUMN orch8.effect_receipt_overview.evidence IS
'The receipt''s evidence object (its resolutions and proofs).';

COMMENT ON COLUMN orch8.effect_receipt_overview.created_at IS
'When the receipt was written, before the effect was sent.';

COMMENT ON COLUMN orch8.effect_receipt_overview.updated_at IS
'When the receipt last changed state.';

COMMENT ON COLUMN orch8.effect_receipt_overview.age IS
'How long ago the receipt was written: orch8.now() minus created_at.';

COMMENT ON COLUMN orch8.effect_receipt_overview.instance_state IS
'The current state of the receipt''s instance; NULL when that instance row does not '
'exist.';

COMMENT ON COLUMN orch8.effect_receipts.tenant_id IS
'The tenant of the instance that made the effect.';

COMMENT ON COLUMN orch8.effect_receipts.id IS
'The receipt id, from its position: deterministic_effect_id(continuity, epoch, instance, '
'path, attempt), so a rerun of the same attempt finds the same receipt. It is also the '
'default idempotency key (see idempotency_key).';

COMMENT ON COLUMN orch8.effect_receipts.continuity_id IS
'The ledger scope (continuity_executions) the receipt belongs to.';

COMMENT ON COLUMN orch8.effect_receipts.epoch IS
'The scope''s ownership epoch when the receipt was written (always 0 in this engine).';

COMMENT ON COLUMN orch8.effect_receipts.instance_id IS 'The instance whose step made the effect.';

COMMENT ON COLUMN orch8.effect_receipts.block_id IS
'The path of the step''s node in the execution tree (a top-level step''s path is its '
'block id); with attempt it names one run of the step.';

COMMENT ON COLUMN orch8.effect_receipts.attempt IS
'The step''s attempt (0-based); each new attempt gets a new receipt.';

COMMENT ON COLUMN orch8.effect_receipts.kind IS
'The effect kind, one of orch8.effect_kinds(): http, model, message, storage or custom '
'(builtins, per builtin_handlers) or worker (any other handler).';

COMMENT ON COLUMN orch8.effect_receipts.state IS
'Where the effect stands (orch8.effect_state): planned, prepared, dispatched, committed, '
'unknown, verified, compensated or abandoned. It moves only along '
'orch8.can_transition_to, each move recorded in effect_receipt_events.';

COMMENT ON COLUMN orch8.effect_receipts.handler IS
'The name of the handler the step ran (a builtin or somebody''s own).';

COMMENT ON COLUMN orch8.effect_receipts.destination_fingerprint IS
'Lowercase hex SHA-256 of the canonical JSON {handler, destination}, destination being '
'the params url, provider, model, topic, queue, resource and endpoint that are present. A '
'stand-in hash on a receipt recovered after a lost write.';

COMMENT ON COLUMN orch8.effect_receipts.request_sha256 IS
'Lowercase hex SHA-256 of the canonical JSON {handler, params}: the content sent, which '
'the commit guard compares and a verifier checks before a replay. A stand-in hash on a '
'receipt recovered after a lost write.';

COMMENT ON COLUMN orch8.effect_receipts.idempotency_key IS
'The key the handler sends to the provider (at most 256 bytes): the step''s '
'idempotency_key param, else attempt 0''s receipt id for a same_key retry, else this '
'receipt''s id. NULL only on receipts written by an engine older than migration 0009 when '
'the step gave no such param.';

COMMENT ON COLUMN orch8.effect_receipts.provider_receipt_id IS
'The provider''s own id for the effect: from the handler''s output at commit '
'(provider_receipt_id, receipt_id or request_id) or given by a resolution; NULL when '
'unknown.';

COMMENT ON COLUMN orch8.effect_receipts.error IS
'Why the outcome became unknown (the handler''s error or timeout, at most error_chars '
'characters); cleared when the receipt is resolved. NULL when there was none.';

COMMENT ON COLUMN orch8.effect_receipts.evidence IS
'A JSON object of proof about the outcome: the latest resolution under resolution and all '
'of them under resolutions, not_applied from a handler that proved nothing was sent, '
'compensated_by from a saga, or recovered_after_lost_write. {} when none.';

COMMENT ON COLUMN orch8.effect_receipts.created_at IS
'When the receipt was written (orch8.now()), before the effect was sent.';

COMMENT ON COLUMN orch8.effect_receipts.updated_at IS
'When the receipt last changed: the start of its current state.';

COMMENT ON COLUMN orch8.effect_resolutions.from_state IS
'The state a receipt is in when it is resolved: unknown, committed or verified.';

COMMENT ON COLUMN orch8.effect_resolutions.to_state IS
'A state resolve_effect may move a receipt in from_state to.';

COMMENT ON COLUMN orch8.effect_resolutions.needs_evidence IS
'Whether that move needs non-empty evidence: true for abandoned and compensated.';

COMMENT ON COLUMN orch8.effect_transitions.from_state IS 'A receipt state (orch8.effect_state).';

COMMENT ON COLUMN orch8.effect_transitions.to_state IS
'A state a receipt in from_state may move to (orch8.can_transition_to).';

COMMENT ON COLUMN orch8.effect_verifications.tenant_id IS 'The receipt''s tenant.';

COMMENT ON COLUMN orch8.effect_verifications.effect_id IS
'The unknown receipt to settle (effect_receipts.id); one verification per receipt.';

COMMENT ON COLUMN orch8.effect_verifications.method IS
'How the outcome is checked, one of orch8.verification_methods(): http (a lookup '
'request), replay (the same request again under the same key) or handler (the verifier '
'registered beside the handler).';

COMMENT ON COLUMN orch8.effect_verifications.handler IS
'The receipt''s handler, copied when the row was made: a runner claims a replay or '
'handler verification only when it has that handler or its verifier.';

COMMENT ON COLUMN orch8.effect_verifications.state IS
'One of orch8.verification_states(): pending (tries left), escalated (every try was '
'inconclusive: left to people) or settled (the receipt is no longer unknown).';

COMMENT ON COLUMN orch8.effect_verifications.schedule IS
'Milliseconds to wait before each try, from the step''s verify.schedule (default '
'orch8.default_verify_schedule()); its length is the number of tries.';

COMMENT ON COLUMN orch8.effect_verifications.tries IS
'Tries used so far, counted when a try is claimed, so a verifier that crashes still uses '
'one up.';

COMMENT ON COLUMN orch8.effect_verifications.next_at IS
'When the next try is due; while a try is claimed, when the row may be claimed again if '
'its verifier never answers.';

COMMENT ON COLUMN orch8.effect_verifications.lease_owner IS
'Who holds the current try: a runner''s worker id or an external worker''s id. NULL when '
'no try is out.';

COMMENT ON COLUMN orch8.effect_verifications.lease_token IS
'The token of the current try''s lease, which its verdict must present; NULL when no try '
'is out.';

COMMENT ON COLUMN orch8.effect_verifications.lease_expires_at IS
'When the current try''s lease runs out; NULL when no try is out.';

COMMENT ON COLUMN orch8.effect_verifications.last_result IS
'What the last inconclusive try reported (with its try number), or why the verification '
'was escalated; NULL before any.';

COMMENT ON COLUMN orch8.effect_verifications.requested_by IS
'Who asked for it: engine (a step ended with an unknown outcome), lease-sweep, or the '
'actor given to request_verifications.';

COMMENT ON COLUMN orch8.effect_verifications.created_at IS
'When the verification was first scheduled.';

COMMENT ON COLUMN orch8.effect_verifications.updated_at IS
'When the row last changed (a claim, a verdict, a reschedule).';

COMMENT ON COLUMN orch8.execution_nodes.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.execution_nodes.instance_id IS
'The instance whose execution tree the node belongs to.';

COMMENT ON COLUMN orch8.execution_nodes.path IS
'The node''s name, unique in its instance and never reused: '''' for the root list, a '
'block''s id at the top level, else parent/id, with markers for a branch (#i), an '
'iteration ([n]), a part (.try, .catch, .finally), a route (.route<i>, .default), a '
'saga''s compensations (.undo), .on_failure[n] and .on_cancel. Receipts and block_outputs '
'name the node by it (their block_id).';

COMMENT ON COLUMN orch8.execution_nodes.parent_path IS
'The path of the node''s parent; NULL only for the root ('''').';

COMMENT ON COLUMN orch8.execution_nodes.block_id IS
'The id of the block the node runs or belongs to (a branch, iteration or part carries its '
'composite''s id, a compensation its step''s); NULL for the root, on_failure and '
'on_cancel lists.';

COMMENT ON COLUMN orch8.execution_nodes.kind IS
'What the node executes, one of orch8.node_kinds(): sequence (a list of blocks), a block '
'type (step, parallel, race, loop, for_each, router, try_catch, saga, sub_sequence, '
'sleep, wait_for_signal, wait_for_input), undo (a saga''s compensations) or compensation '
'(one of them).';

COMMENT ON COLUMN orch8.execution_nodes.state IS
'The node''s state (orch8.node_state): ready, running, waiting, blocked, completed, '
'failed, skipped or cancelled; it moves only along orch8.node_can_transition.';

COMMENT ON COLUMN orch8.execution_nodes.selector IS
'For a list node: the JSON path, inside its block (the definition when block_id is NULL), '
'of the array of blocks it walks, e.g. {blocks}, {branches,1}, {body}. NULL for other '
'kinds.';

COMMENT ON COLUMN orch8.execution_nodes.position IS
'A counter read by kind: for a list, how many of its blocks have started; for a loop, its '
'iteration; for a for_each, how many items have started; for undo, how many compensations '
'have started. 0 for other kinds.';

COMMENT ON COLUMN orch8.execution_nodes.items IS
'Kind-specific state as JSON: what a loop, for_each or router asks the runner for '
'({asking}), a for_each''s collection, a race''s winner, a saga''s failure, the '
'compensations an undo runs, a try_catch''s outcome before its finally, a wait''s signal '
'name or prompt and choices. NULL when unused.';

COMMENT ON COLUMN orch8.execution_nodes.vars IS
'The variables the node binds for the blocks below it, as a JSON object: item and index '
'(or their configured names) for a for_each iteration, iteration for a loop''s, error for '
'a catch, finally or on_failure list. {} when none.';

COMMENT ON COLUMN orch8.execution_nodes.priority IS
'The instance''s priority, copied when the node was created: ready nodes are claimed '
'highest priority first, then earliest next_fire_at.';

COMMENT ON COLUMN orch8.execution_nodes.next_fire_at IS
'For a ready node, when it may be claimed: when it became ready, or later for a delayed '
'start, a step''s delay or send_window, a retry''s backoff or an expected rate-limit '
'token. Left as it was once the node has moved on.';

COMMENT ON COLUMN orch8.execution_nodes.lease_owner IS
'The worker id of the runner holding the node''s lease (host:pid:suffix by default); NULL '
'when not leased.';

COMMENT ON COLUMN orch8.execution_nodes.lease_token IS
'The lease''s token, which every fenced write for the node must present (begin_step, '
'finish_step, decide, run_child, heartbeats, key-value state). Set only while the node is '
'running under a lease.';

COMMENT ON COLUMN orch8.execution_nodes.lease_expires_at IS
'When the lease runs out unless a heartbeat extends it; past it the lease sweep takes the '
'node back. NULL when not leased.';

COMMENT ON COLUMN orch8.execution_nodes.cancel_requested IS
'True when a cancel reached the node while it was leased or its worker task ran: a step '
'not yet dispatched then stops, one already dispatched records its outcome first.';

COMMENT ON COLUMN orch8.execution_nodes.cancel_reason IS
'Why the node was cancelled or asked to stop (branch X failed, lost the race to X, '
'instance cancelled...); NULL otherwise.';

COMMENT ON COLUMN orch8.execution_nodes.state_before_cancel IS
'The state the node had when cancel_subtree cancelled it, so that an operator''s retry of '
'the failure that caused the cancel can put it back (reopen_failure); NULL otherwise.';

COMMENT ON COLUMN orch8.execution_nodes.failed_child IS
'For a failed composite or list: the path of the child whose failure failed it (followed '
'down to where the failure began); NULL for a leaf''s own failure and for nodes that did '
'not fail.';

COMMENT ON COLUMN orch8.execution_nodes.output IS
'The output kept on the node for a list (sequence, undo: its last completed block''s) or '
'a loop (its latest iteration''s); NULL for other kinds, whose outputs are rows of '
'block_outputs.';

COMMENT ON COLUMN orch8.execution_nodes.error IS
'Why the node failed or, for a step waiting or blocked on an unknown receipt, the '
'handler''s error (at most error_chars characters); NULL otherwise.';

COMMENT ON COLUMN orch8.execution_nodes.child_instance_id IS
'For a sub_sequence node: the child instance it started (task_instances.id); NULL before '
'it has started one.';

COMMENT ON COLUMN orch8.execution_nodes.created_at IS
'When the node was created, i.e. when its block started (orch8.now()).';

COMMENT ON COLUMN orch8.execution_nodes.updated_at IS 'When the node row last changed.';

COMMENT ON COLUMN orch8.execution_nodes.ended_at IS
'When the node became completed, failed, skipped or cancelled; NULL while it is open '
'(cleared again when an operator''s retry reopens it).';

COMMENT ON COLUMN orch8.function_access.name IS
'A function name in schema orch8 (the row covers every overload of it).';

COMMENT ON COLUMN orch8.function_access.access IS
'Its exception to the default privileges that orch8.secure_functions() applies: web (the '
'web role may call this writer), all_tenants (a cross-tenant read owned by orch8_runner), '
'private (a helper only the engine''s own functions call) or migration (left to the '
'migrating login).';

COMMENT ON COLUMN orch8.instance_kv_state.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.instance_kv_state.instance_id IS 'The instance the state belongs to.';

COMMENT ON COLUMN orch8.instance_kv_state.key IS
'The key the workflow chose (set_state, get_state), 1 to 256 bytes (limit '
'state_key_bytes).';

COMMENT ON COLUMN orch8.instance_kv_state.value IS
'The stored JSON value (a SQL NULL is stored as JSON null), at most '
'orch8.max_state_value_bytes.';

COMMENT ON COLUMN orch8.instance_kv_state.updated_at IS
'When the key was last written (orch8.now()).';

COMMENT ON COLUMN orch8.instance_overview.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.instance_overview.id IS 'The instance''s id.';

COMMENT ON COLUMN orch8.instance_overview.sequence_id IS
'The sequence version it runs (sequences.id).';

COMMENT ON COLUMN orch8.instance_overview.sequence_namespace IS 'The namespace of its sequence.';

COMMENT ON COLUMN orch8.instance_overview.sequence_name IS 'The name of its sequence.';

COMMENT ON COLUMN orch8.instance_overview.sequence_version IS 'The version number it runs.';

COMMENT ON COLUMN orch8.instance_overview.state IS
'The instance''s state: scheduled, running, waiting, paused, completed, failed or '
'cancelled.';

COMMENT ON COLUMN orch8.instance_overview.requested_state IS
'paused or cancelled when that was asked while a step was in flight; NULL when nothing is '
'pending.';

COMMENT ON COLUMN orch8.instance_overview.current_block IS
'The path of the node it started or moved to most recently.';

COMMENT ON COLUMN orch8.instance_overview.priority IS 'Its priority (higher is claimed first).';

COMMENT ON COLUMN orch8.instance_overview.idempotency_key IS
'The key it was started with; NULL when none.';

COMMENT ON COLUMN orch8.instance_overview.parent_instance_id IS
'Its parent when it is a child instance; NULL otherwise.';

COMMENT ON COLUMN orch8.instance_overview.error IS 'Why it failed; NULL unless it failed.';

COMMENT ON COLUMN orch8.instance_overview.next_fire_at IS
'When it is next due (task_instances.next_fire_at).';

COMMENT ON COLUMN orch8.instance_overview.created_at IS 'When it was created.';

COMMENT ON COLUMN orch8.instance_overview.updated_at IS 'When its row last changed.';

COMMENT ON COLUMN orch8.instance_overview.context IS
'Its context, a JSON object {data, config, runtime}.';

COMMENT ON COLUMN orch8.instance_overview.lease_owner IS
'The runners holding leases on its nodes, comma-separated; NULL when none.';

COMMENT ON COLUMN orch8.instance_overview.lease_expires_at IS
'The earliest expiry among those leases; NULL when none.';

COMMENT ON COLUMN orch8.instance_overview.depth IS
'0 for an instance started on its own, else its parent''s depth plus one.';

COMMENT ON COLUMN orch8.instance_overview.parent_path IS
'For a child started by a sub_sequence block: that node''s path in the parent.';

COMMENT ON COLUMN orch8.instance_overview.sla_at IS
'When it must have ended; NULL when its definition has no sla.';

COMMENT ON COLUMN orch8.instance_overview.sla_breached_at IS
'When it was found past sla_at; NULL unless it missed it.';

COMMENT ON COLUMN orch8.instance_signals.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.instance_signals.instance_id IS 'The instance the signal was sent to.';

COMMENT ON COLUMN orch8.instance_signals.id IS
'Order of the signals (an identity, increasing across the whole table); pending custom '
'signals are consumed oldest first.';

COMMENT ON COLUMN orch8.instance_signals.signal_type IS
'The signal''s name (an orch8.signal_type): cancel, pause, resume, update_context, input '
'(an answer recorded by answer_input) or any other name, a custom signal for '
'wait_for_signal.';

COMMENT ON COLUMN orch8.instance_signals.payload IS
'The JSON object sent with the signal (at most signal_payload_bytes); for input, {path, '
'choice, comment}.';

COMMENT ON COLUMN orch8.instance_signals.actor IS
'Who sent it, as orch8.attributed_actor records it: the caller''s own label when trusted, '
'key:<name> for a sealed API key, else the login.';

COMMENT ON COLUMN orch8.instance_signals.created_at IS 'When it was sent (orch8.now()).';

COMMENT ON COLUMN orch8.instance_transition_table.from_state IS
'An instance state (orch8.instance_state).';

COMMENT ON COLUMN orch8.instance_transition_table.to_state IS
'A state an instance in from_state may move to (orch8.instance_can_transition).';

COMMENT ON COLUMN orch8.instance_transitions.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.instance_transitions.instance_id IS 'The instance that moved.';

COMMENT ON COLUMN orch8.instance_transitions.seq IS
'Order of the rows (an identity, increasing across the whole table).';

COMMENT ON COLUMN orch8.instance_transitions.from_state IS
'The state before; NULL on the row written when the instance was created.';

COMMENT ON COLUMN orch8.instance_transitions.to_state IS 'The state after the move.';

COMMENT ON COLUMN orch8.instance_transitions.actor IS
'Who made the move, as orch8.attributed_actor records it: a trusted caller''s label '
'(create, runner, timer, lease-sweep, verifier, a runner''s worker id, an operator''s '
'name), key:<name> for a sealed API key, else the login.';

COMMENT ON COLUMN orch8.instance_transitions.reason IS
'Why, when known: an operator''s reason, the error of a move to failed, requested while '
'running, sla missed...; NULL when none was given.';

COMMENT ON COLUMN orch8.instance_transitions.at IS 'When the move happened (orch8.now()).';

COMMENT ON COLUMN orch8.invariant_events.tenant_id IS 'The invariant''s tenant.';

COMMENT ON COLUMN orch8.invariant_events.invariant_id IS 'The invariant (workflow_invariants.id).';

COMMENT ON COLUMN orch8.invariant_events.seq IS
'Order of the events (an identity, increasing across the whole table).';

COMMENT ON COLUMN orch8.invariant_events.change IS
'declared (the invariant was inserted) or changed (a column of it was updated).';

COMMENT ON COLUMN orch8.invariant_events.before IS
'The whole invariant row as JSON before a change; NULL for declared.';

COMMENT ON COLUMN orch8.invariant_events.after IS
'The whole invariant row as JSON after the declaration or change.';

COMMENT ON COLUMN orch8.invariant_events.actor IS
'Who declared or changed it, as orch8.attributed_actor records it (migration 0010 for '
'invariants that existed before that migration).';

COMMENT ON COLUMN orch8.invariant_events.db_user IS
'The PostgreSQL login that made the change (session_user); callers cannot set it.';

COMMENT ON COLUMN orch8.invariant_events.api_key_id IS
'The API key sealed into the transaction by enter_tenant; NULL when none.';

COMMENT ON COLUMN orch8.invariant_events.at IS 'When it happened (orch8.now()).';

COMMENT ON COLUMN orch8.invariant_results.tenant_id IS 'The receipt''s tenant.';

COMMENT ON COLUMN orch8.invariant_results.id IS
'Order of the results (an identity, increasing across the whole table).';

COMMENT ON COLUMN orch8.invariant_results.invariant_id IS
'The commit-guard invariant that decided (workflow_invariants.id).';

COMMENT ON COLUMN orch8.invariant_results.continuity_id IS
'The ledger scope of the receipt being dispatched.';

COMMENT ON COLUMN orch8.invariant_results.epoch IS 'That scope''s ownership epoch.';

COMMENT ON COLUMN orch8.invariant_results.instance_id IS
'The instance of the receipt being dispatched.';

COMMENT ON COLUMN orch8.invariant_results.block_id IS
'The path of the step whose receipt was being dispatched.';

COMMENT ON COLUMN orch8.invariant_results.status IS
'pass (the receipt was dispatched) or fail (another receipt already held the same '
'content, so this one was refused as a duplicate).';

COMMENT ON COLUMN orch8.invariant_results.effect_id IS
'The receipt being dispatched (effect_receipts.id).';

COMMENT ON COLUMN orch8.invariant_results.competing_effect_id IS
'For fail: the receipt that already held the same kind, destination and request; NULL for '
'pass.';

COMMENT ON COLUMN orch8.invariant_results.evidence IS
'What was compared, as JSON: {status, kind, destination_fingerprint, request_sha256}.';

COMMENT ON COLUMN orch8.invariant_results.dedupe_key IS
'Hex SHA-256 of invariant:continuity:epoch:canonical evidence, unique per tenant: '
'repeated duplicates of one content add no further row.';

COMMENT ON COLUMN orch8.invariant_results.created_at IS
'When the decision was recorded (orch8.now()).';

COMMENT ON COLUMN orch8.node_transition_table.from_state IS 'A node state (orch8.node_state).';

COMMENT ON COLUMN orch8.node_transition_table.to_state IS
'A state a node in from_state may move to (orch8.node_can_transition).';

COMMENT ON COLUMN orch8.schedule_fires.tenant_id IS 'The schedule''s tenant.';

COMMENT ON COLUMN orch8.schedule_fires.schedule_id IS 'The schedule that fired (schedules.id).';

COMMENT ON COLUMN orch8.schedule_fires.seq IS
'Order of the rows (an identity, increasing across the whole table).';

COMMENT ON COLUMN orch8.schedule_overview.tenant_id IS
'The tenant the schedule starts instances in.';

COMMENT ON COLUMN orch8.schedule_overview.id IS 'The schedule''s id.';

COMMENT ON COLUMN orch8.schedule_overview.name IS
'The schedule''s name, unique in the tenant among schedules that have not ended.';

COMMENT ON COLUMN orch8.schedule_overview.sequence_namespace IS
'The namespace of the sequence each fire starts.';

COMMENT ON COLUMN orch8.schedule_overview.sequence_name IS
'The name of the sequence each fire starts (its latest version at fire time).';

COMMENT ON COLUMN orch8.schedule_overview.cron IS
'The 5-field cron expression: minute hour day-of-month month day-of-week.';

COMMENT ON COLUMN orch8.schedule_overview.timezone IS
'The IANA time zone the cron expression''s wall times are in.';

COMMENT ON COLUMN orch8.schedule_overview.data IS
'The data of every instance the schedule starts.';

COMMENT ON COLUMN orch8.schedule_overview.priority IS 'The priority of the instances it starts.';

COMMENT ON COLUMN orch8.schedule_overview.overlap_policy IS
'What a fire does while the last instance has not ended: allow, skip, buffer_one or '
'cancel_previous.';

COMMENT ON COLUMN orch8.schedule_overview.starts_at IS
'No fire time before this; NULL: from creation.';

COMMENT ON COLUMN orch8.schedule_overview.ends_at IS
'Fire times are before this; NULL: never ends.';

COMMENT ON COLUMN orch8.schedule_overview.state IS 'active, paused or ended.';

COMMENT ON COLUMN orch8.schedule_overview.next_fire_at IS
'The next fire time; NULL unless active.';

COMMENT ON COLUMN orch8.schedule_overview.last_fire_at IS
'The fire time of the last started instance; NULL before the first.';

COMMENT ON COLUMN orch8.schedule_overview.last_instance_id IS
'The last instance the schedule started; NULL before the first.';

COMMENT ON COLUMN orch8.schedule_overview.last_instance_state IS
'The current state of last_instance_id, as text; NULL when none was started.';

COMMENT ON COLUMN orch8.schedule_overview.buffered_fire_at IS
'With buffer_one: the fire time waiting for the last instance to end; NULL when none '
'waits.';

COMMENT ON COLUMN orch8.schedule_overview.created_by IS 'Who created the schedule.';

COMMENT ON COLUMN orch8.schedule_overview.updated_by IS
'Who made its last move (the runner for fires).';

COMMENT ON COLUMN orch8.schedule_overview.created_at IS 'When it was created.';

COMMENT ON COLUMN orch8.schedule_overview.updated_at IS 'When it last changed.';

COMMENT ON COLUMN orch8.schedule_overview.ended_at IS 'When it ended; NULL unless ended.';

COMMENT ON COLUMN orch8.schedules.tenant_id IS 'The tenant the schedule starts instances in.';

COMMENT ON COLUMN orch8.schedules.id IS
'The schedule''s id (gen_random_uuid()); part of the idempotency key of every instance it '
'starts, orch8:schedule:<id>:<fire time in UTC>.';

COMMENT ON COLUMN orch8.schema_migrations.kind IS
'versioned (sql/migrations/NNNN_name.sql, applied once) or repeatable '
'(sql/functions/name.sql, applied again whenever the file changes).';

COMMENT ON COLUMN orch8.schema_migrations.name IS 'The file''s name.';

COMMENT ON COLUMN orch8.schema_migrations.version IS
'The NNNN of a versioned file; NULL for a repeatable one. orch8.schema_version() is the '
'highest applied.';

COMMENT ON COLUMN orch8.schema_migrations.checksum IS
'Hex SHA-256 of the file''s bytes when it was applied: an edited versioned file is '
'refused, a changed repeatable one is applied again.';

COMMENT ON COLUMN orch8.schema_migrations.applied_at IS
'When the file was last applied (clock_timestamp() of the migrator).';

COMMENT ON COLUMN orch8.sequence_blocks.tenant_id IS 'The sequence''s tenant.';

COMMENT ON COLUMN orch8.sequence_blocks.sequence_id IS
'The stored sequence version (sequences.id) the block belongs to.';

COMMENT ON COLUMN orch8.sequence_blocks.block_id IS
'The block''s id, unique in its definition (in an older definition with repeated ids, the '
'first in document order).';

COMMENT ON COLUMN orch8.sequence_blocks.type IS
'The block''s type field as written; NULL when the block gives none (a step).';

COMMENT ON COLUMN orch8.sequence_blocks.parent_id IS
'The id of the block that contains it; NULL for a block of the top-level blocks, '
'on_failure or on_cancel lists.';

COMMENT ON COLUMN orch8.sequence_blocks.depth IS
'1 for a top-level block, one more for each block it is nested in.';

COMMENT ON COLUMN orch8.sequence_blocks.definition IS
'The block''s JSON, exactly as it is in the stored definition.';

COMMENT ON COLUMN orch8.sequence_overview.tenant_id IS 'The tenant that owns the sequence.';

COMMENT ON COLUMN orch8.sequence_overview.namespace IS 'The sequence''s namespace.';

COMMENT ON COLUMN orch8.sequence_overview.name IS 'The sequence''s name.';

COMMENT ON COLUMN orch8.sequence_overview.latest_id IS
'The id (sequences.id) of its latest version.';

COMMENT ON COLUMN orch8.sequence_overview.latest_version IS 'The latest version number.';

COMMENT ON COLUMN orch8.sequence_overview.versions IS 'How many versions of the name are stored.';

COMMENT ON COLUMN orch8.sequence_overview.blocks IS
'How many top-level blocks the latest version has.';

COMMENT ON COLUMN orch8.sequence_overview.latest_created_at IS
'When the latest version was stored.';

COMMENT ON COLUMN orch8.sequences.tenant_id IS 'The tenant that owns the definition.';

COMMENT ON COLUMN orch8.sequences.id IS
'This version''s id (gen_random_uuid()): instances run a version by it '
'(task_instances.sequence_id).';

COMMENT ON COLUMN orch8.sequences.namespace IS
'A grouping for names, an orch8.identifier (''default'' unless given).';

COMMENT ON COLUMN orch8.sequences.name IS
'The sequence''s name (an orch8.sequence_name), versioned within tenant and namespace.';

COMMENT ON COLUMN orch8.sequences.version IS
'1 for the first definition of (tenant, namespace, name), then one more for each new one '
'(create_sequence).';

COMMENT ON COLUMN orch8.sequences.definition IS
'The workflow definition as JSON (blocks, on_failure, on_cancel, input_schema, sla...), '
'validated by validate_sequence; never changed once stored.';

COMMENT ON COLUMN orch8.sequences.created_at IS 'When this version was stored (orch8.now()).';

COMMENT ON COLUMN orch8.task_instances.tenant_id IS 'The tenant the instance runs in.';

COMMENT ON COLUMN orch8.task_instances.id IS
'The instance''s id: a time-ordered version-7 UUID for instances created since migration '
'0022 (orch8.time_ordered_uuid), so newer ids sort later.';

COMMENT ON COLUMN orch8.task_instances.sequence_id IS
'The sequence version it runs (sequences.id); never changes.';

COMMENT ON COLUMN orch8.task_instances.sequence_version IS
'That version''s number, copied from sequences.version; never changes.';

COMMENT ON COLUMN orch8.task_instances.state IS
'The instance''s state (orch8.instance_state): scheduled, running, waiting, paused, '
'completed, failed or cancelled. It sums up the execution tree (sync_instance), and every '
'move is recorded in instance_transitions.';

COMMENT ON COLUMN orch8.task_instances.context IS
'A JSON object {data, config, runtime}: data and config as given at start (data merged by '
'update_context signals), runtime created empty; at most orch8.max_context_bytes.';

COMMENT ON COLUMN orch8.task_instances.current_block IS
'The path of the leaf node (a step, a wait...) the instance started or moved most '
'recently, for display; NULL before it has one. The tree itself is in execution_nodes.';

COMMENT ON COLUMN orch8.task_instances.next_fire_at IS
'When the instance is next due: for scheduled, its earliest ready node''s next_fire_at; '
'for waiting, its earliest timer. Otherwise the last such value.';

COMMENT ON COLUMN orch8.task_instances.priority IS
'Its priority, copied to its nodes: higher is claimed first (default 0).';

COMMENT ON COLUMN orch8.task_instances.parent_instance_id IS
'For a child instance (a sub_sequence block''s): the parent''s id; NULL for an instance '
'started on its own.';

COMMENT ON COLUMN orch8.task_instances.idempotency_key IS
'The key it was started with (1 to 256 bytes, unique in the tenant): starting again with '
'it returns this instance. Children get orch8:child:<parent>:<path>:<attempt>, schedule '
'fires orch8:schedule:<id>:<time>; NULL when none was given.';

COMMENT ON COLUMN orch8.task_instances.error IS
'Why the instance failed (its failing node''s error); NULL unless it failed.';

COMMENT ON COLUMN orch8.task_instances.created_at IS 'When it was created (orch8.now()).';

COMMENT ON COLUMN orch8.task_instances.updated_at IS 'When its row last changed.';

COMMENT ON COLUMN orch8.task_instances.requested_state IS
'paused or cancelled when that was asked while a step was in flight: it is applied at the '
'step''s boundary and then cleared (also when the instance ends, or a resume withdraws '
'the pause). NULL: nothing pending.';

COMMENT ON COLUMN orch8.tenant_seal.only_row IS
'Always true: as the primary key it keeps the table to a single row.';

COMMENT ON COLUMN orch8.webhook_outbox.tenant_id IS 'The subscription''s tenant.';

COMMENT ON COLUMN orch8.webhook_outbox.id IS
'The delivery''s id (an identity): receivers deduplicate on it, sent as the '
'X-Orch8-Delivery header.';

COMMENT ON COLUMN orch8.webhook_outbox.subscription_id IS
'The subscription it is delivered to (webhook_subscriptions.id).';

COMMENT ON COLUMN orch8.webhook_outbox.event IS
'The event, one of orch8.webhook_events(): instance.completed, instance.failed or '
'instance.sla_breached.';

COMMENT ON COLUMN orch8.webhook_outbox.instance_id IS 'The instance the event is about.';

COMMENT ON COLUMN orch8.webhook_outbox.payload IS
'The JSON body sent: {event, tenant_id, instance_id, state, reason, at, sequence_id, '
'sequence_version}, plus sla and sla_at for instance.sla_breached.';

COMMENT ON COLUMN orch8.webhook_outbox.state IS
'One of orch8.outbox_states(): pending (due at next_attempt_at), delivering (claimed by a '
'deliverer), delivered, parked (attempts used up) or discarded (given up by an operator).';

COMMENT ON COLUMN orch8.webhook_outbox.attempts IS
'Delivery attempts made so far; a redelivery resets it to 0.';

COMMENT ON COLUMN orch8.webhook_outbox.next_attempt_at IS
'When a pending delivery is due: exponential backoff after a failed attempt, at most 1 '
'hour.';

COMMENT ON COLUMN orch8.webhook_outbox.last_error IS
'Why the last attempt failed (at most error_chars characters), or that a claim expired '
'without a result; cleared on delivery.';

COMMENT ON COLUMN orch8.webhook_outbox.last_status IS
'The HTTP status of the last attempt; NULL when no response came back.';

COMMENT ON COLUMN orch8.webhook_outbox.claimed_by IS
'The deliverer (worker id) holding the row while delivering; NULL otherwise.';

COMMENT ON COLUMN orch8.webhook_outbox.claim_expires_at IS
'When that claim lapses and another deliverer may take the row; NULL when not delivering.';

COMMENT ON COLUMN orch8.webhook_outbox.created_at IS
'When the event was enqueued, in the same transaction as what it reports (the instance''s '
'move, or the sla check that found it late).';

COMMENT ON COLUMN orch8.webhook_outbox.delivered_at IS
'When the receiver accepted it (a 2xx answer); NULL unless delivered.';

COMMENT ON COLUMN orch8.webhook_subscriptions.tenant_id IS
'The tenant whose instances'' events it receives.';

COMMENT ON COLUMN orch8.webhook_subscriptions.id IS 'The subscription''s id (gen_random_uuid()).';

COMMENT ON COLUMN orch8.webhook_subscriptions.url IS
'The http(s) endpoint events are POSTed to (an orch8.webhook_url).';

COMMENT ON COLUMN orch8.webhook_subscriptions.secret IS
'The HMAC-SHA256 key that signs every delivery (X-Orch8-Signature); stored as given, '
'since signing needs it.';

COMMENT ON COLUMN orch8.webhook_subscriptions.events IS
'The events it receives: a non-empty subset of orch8.webhook_events().';

COMMENT ON COLUMN orch8.webhook_subscriptions.enabled IS
'false: no new events are queued for it and its queued deliveries wait until it is '
'enabled again.';

COMMENT ON COLUMN orch8.webhook_subscriptions.created_at IS 'When it was created (orch8.now()).';

COMMENT ON COLUMN orch8.worker_task_transitions.from_state IS
'A worker task state (orch8.worker_task_states()).';

COMMENT ON COLUMN orch8.worker_task_transitions.to_state IS
'A state a task in from_state may move to (orch8.worker_task_can_transition).';

COMMENT ON COLUMN orch8.workflow_invariants.tenant_id IS 'The tenant it applies in.';

COMMENT ON COLUMN orch8.workflow_invariants.id IS 'The invariant''s id (gen_random_uuid()).';

COMMENT ON COLUMN orch8.workflow_invariants.name IS
'A name for people, given when it was declared.';

COMMENT ON COLUMN orch8.workflow_invariants.rule IS
'The rule as a JSON object; the one this engine enforces is {"type": '
'"effect_at_most_once", "kind": <an effect kind>}.';

COMMENT ON COLUMN orch8.workflow_invariants.commit_guard IS
'true: enforced at dispatch, where receipts of that kind with the same destination and '
'request in one ledger scope go one at a time and a second is refused as a duplicate. '
'declare_invariant only makes true ones.';

COMMENT ON COLUMN orch8.workflow_invariants.enabled IS
'false switches the invariant off (the change is recorded in invariant_events).';

COMMENT ON COLUMN orch8.workflow_invariants.sequence_id IS
'The sequence version (sequences.id) whose instances it covers; a definition''s '
'invariants are declared for the version when it is stored. NULL for an instance''s '
'invariant.';

COMMENT ON COLUMN orch8.workflow_invariants.sequence_version IS
'With sequence_id: the version number an instance must run to be covered; NULL: no '
'further condition.';

COMMENT ON COLUMN orch8.workflow_invariants.instance_id IS
'The one instance it covers (tests, one-off protection); NULL for a sequence''s. Exactly '
'one of sequence_id and instance_id is set.';

COMMENT ON COLUMN orch8.workflow_invariants.created_at IS 'When it was declared (orch8.now()).';
