-- A guarded step's receipt in one write (docs/ARCHITECTURE.md, "Fewer writes per
-- guarded step"): when nothing can make its dispatch wait (no receipt of the same id, no
-- commit guard on its kind), begin_effect inserts the receipt already dispatched instead
-- of inserting it planned and moving it to prepared and to dispatched. The moves are
-- still the state machine's: the guard admits a new receipt only as planned or as
-- dispatched, and the event trigger writes planned, prepared and dispatched for it, so
-- the history reads as before. Two row versions and two sets of index entries fewer per
-- guarded step.
--
-- Settling a receipt rewrites no index (docs/ARCHITECTURE.md, "Fewer writes per guarded
-- step"). The operator queue's partial index (tenant_id, updated_at) WHERE state IN
-- ('dispatched', 'unknown') named the two columns every settle changes, so no settle could
-- be a HOT update and each wrote an entry in all five of the receipts' indexes. The set of
-- receipts that are dispatched or unknown now lives in orch8.open_receipts, kept by the
-- receipts' event trigger; the unresolved_effects view reads through it. The continuity
-- index goes too (a continuity's receipts are read through the position index, which
-- leads with the same columns), and the table leaves a fifth of each page free for the
-- settle's new row version.

CREATE TABLE orch8.open_receipts (
    tenant_id text NOT NULL,
    receipt_id uuid NOT NULL,
    PRIMARY KEY (tenant_id, receipt_id)
);

COMMENT ON TABLE orch8.open_receipts IS
'The receipts in state dispatched or unknown, one row each (kept by the trigger '
'effect_receipts_record_event; a row goes when its receipt leaves those states): the '
'small set the operator queue reads, so that the receipts table needs no index on the '
'state and updated_at a settle changes.';
COMMENT ON COLUMN orch8.open_receipts.tenant_id IS 'The receipt''s tenant.';
COMMENT ON COLUMN orch8.open_receipts.receipt_id IS 'The receipt (effect_receipts.id).';

INSERT INTO orch8.open_receipts (tenant_id, receipt_id)
SELECT
    r.tenant_id,
    r.id
FROM orch8.effect_receipts AS r
WHERE r.state IN ('dispatched', 'unknown');

DROP INDEX orch8.effect_receipts_unresolved_idx;
DROP INDEX orch8.effect_receipts_continuity_idx;
ALTER TABLE orch8.effect_receipts SET (fillfactor = 80);

-- A receipt's events are written only by the trigger on the receipt itself, in the same
-- statement, so the foreign key from the events to the receipts checked what is true by
-- construction, and paid for it: each check takes a KEY SHARE lock on a receipt row the
-- same transaction has just inserted or updated, a multixact and its WAL per event. With
-- it gone a 3-step guarded run of 10,000 instances went from 385 to 456 steps/s.
ALTER TABLE orch8.effect_receipt_events
DROP CONSTRAINT effect_receipt_events_tenant_id_receipt_id_fkey;

SELECT orch8.enable_tenant_isolation('orch8.open_receipts');
REVOKE ALL ON orch8.open_receipts FROM public;
GRANT SELECT ON orch8.open_receipts TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT, DELETE ON orch8.open_receipts TO orch8_ledger;

CREATE OR REPLACE FUNCTION orch8.effect_receipts_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_evidence text := nullif(current_setting('orch8.event_evidence', true), '');
BEGIN
    IF tg_op = 'INSERT' THEN
        IF new.state NOT IN ('planned', 'dispatched') THEN
            RAISE EXCEPTION 'a receipt is created in state planned (or dispatched, through '
                            'prepared, in one write), not %', new.state
                USING ERRCODE = 'O8004';
        END IF;
        RETURN new;
    END IF;
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'effect receipts are never deleted (receipt %)', old.id
            USING ERRCODE = 'O8004',
                  HINT = 'resolve it instead: orch8.resolve_effect()';
    END IF;
    IF (new.tenant_id, new.id, new.continuity_id, new.epoch, new.instance_id, new.block_id,
        new.attempt, new.kind, new.handler, new.destination_fingerprint, new.request_sha256,
        new.idempotency_key, new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.id, old.continuity_id, old.epoch, old.instance_id, old.block_id,
        old.attempt, old.kind, old.handler, old.destination_fingerprint, old.request_sha256,
        old.idempotency_key, old.created_at) THEN
        RAISE EXCEPTION 'the identity of receipt % cannot change', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS NOT DISTINCT FROM old.state THEN
        IF (new.provider_receipt_id, new.evidence, new.error)
           IS DISTINCT FROM (old.provider_receipt_id, old.evidence, old.error) THEN
            RAISE EXCEPTION 'receipt %: provider receipt id, evidence and error change only '
                            'with a state move, which records them', old.id
                USING ERRCODE = 'O8004',
                      HINT = 'orch8.resolve_effect() records who changed what and why';
        END IF;
        RETURN new;
    END IF;
    IF NOT orch8.can_transition_to(old.state, new.state) THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('effect_id', old.id, 'current_state', old.state,
                                             'to_state', new.state)::text;
    END IF;
    -- Leaving unknown settles an ambiguity: only with evidence, recorded on the event.
    IF old.state = 'unknown'
       AND (v_evidence IS NULL OR v_evidence::jsonb = '{}'::jsonb
            OR jsonb_typeof(v_evidence::jsonb) <> 'object') THEN
        RAISE EXCEPTION 'receipt % leaves unknown only with evidence', old.id
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('effect_id', old.id, 'field', 'evidence')::text,
                  HINT = 'orch8.resolve_effect(..., p_evidence => ''{"checked": "..."}'')';
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_guard() IS
'Trigger: receipts are created planned (or dispatched: planned -> prepared -> dispatched '
'in one write, each move recorded by effect_receipts_record_event), move only along '
'can_transition_to, keep their '
'identity columns (idempotency key included), change provider receipt id, evidence or '
'error only with a state move, leave unknown only with evidence (the transaction''s '
'orch8.event_evidence, a non-empty object), and are never deleted (O8004; O8008 for the '
'missing evidence).';

CREATE OR REPLACE FUNCTION orch8.effect_receipts_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;  -- not a transition (e.g. the no-op upsert in ensure_effect_receipt)
    END IF;
    -- the open set (dispatched or unknown) follows the state
    IF new.state IN ('dispatched', 'unknown')
       AND (tg_op = 'INSERT' OR old.state NOT IN ('dispatched', 'unknown')) THEN
        INSERT INTO orch8.open_receipts (tenant_id, receipt_id) VALUES (new.tenant_id, new.id)
        ON CONFLICT DO NOTHING;
    ELSIF tg_op = 'UPDATE' AND old.state IN ('dispatched', 'unknown')
          AND new.state NOT IN ('dispatched', 'unknown') THEN
        DELETE FROM orch8.open_receipts AS o
        WHERE o.tenant_id = new.tenant_id AND o.receipt_id = new.id;
    END IF;
    IF tg_op = 'INSERT' AND new.state = 'dispatched' THEN
        -- created dispatched: it took the path planned -> prepared -> dispatched
        INSERT INTO orch8.effect_receipt_events (
            tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
        )
        SELECT
            new.tenant_id, new.id, m.from_state, m.to_state,
            orch8.attributed_actor(current_setting('orch8.event_actor', true)),
            m.note,
            CASE WHEN m.n = 3
                 THEN nullif(current_setting('orch8.event_evidence', true), '')::jsonb END,
            orch8.current_key_id()
        FROM (VALUES
            (1, NULL::orch8.effect_state, 'planned'::orch8.effect_state, 'receipt planned'),
            (2, 'planned', 'prepared', NULL),
            (3, 'prepared', 'dispatched', nullif(current_setting('orch8.event_note', true), ''))
        ) AS m (n, from_state, to_state, note)
        ORDER BY m.n;
        RETURN NULL;
    END IF;
    INSERT INTO orch8.effect_receipt_events (
        tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
    ) VALUES (
        new.tenant_id,
        new.id,
        CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state,
        orch8.attributed_actor(current_setting('orch8.event_actor', true)),
        nullif(current_setting('orch8.event_note', true), ''),
        nullif(current_setting('orch8.event_evidence', true), '')::jsonb,
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_record_event() IS
'Trigger: keeps orch8.open_receipts (the receipts dispatched or unknown) and appends one '
'effect_receipt_events row per receipt creation and state move (a '
'receipt created dispatched gets three: planned, prepared, dispatched, in that order). '
'Note and evidence come from the transaction settings orch8.event_note and '
'orch8.event_evidence (set by the ledger functions; the note of a receipt created '
'dispatched goes on its dispatched event); the actor is attributed_actor('
'orch8.event_actor), db_user the login and api_key_id the sealed key.';

-- group commit (sql/functions/steps.sql): the runner's batches of begin_step and
-- finish_step calls; the batch check is theirs alone
INSERT INTO orch8.function_access (name, access) VALUES
('insert_dispatched_receipt', 'private'),
('require_step_batch', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
