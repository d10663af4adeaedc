-- The audit trail of instance moves, written once per statement (docs/ARCHITECTURE.md,
-- "The audit trail is written per statement"). A claim moves up to a batch of instances
-- to running in one UPDATE; a row trigger then ran one INSERT per instance, and each
-- INSERT checked the foreign key to task_instances, which takes a KEY SHARE lock on the
-- instance row the same statement has just updated. Together about 40% of a claim.
--
-- The foreign key goes, as effect_receipt_events' did in 0021: the one writer of
-- instance_transitions is the trigger on the instance row itself, and an instance is
-- never deleted nor its id changed (task_instances_guard), so it held by construction.
-- The row trigger becomes two statement triggers with transition tables (PostgreSQL
-- allows a transition table only on a trigger of one event, and on no column list):
-- one INSERT per statement, the same rows, the same actor and reason (both read at the
-- end of the statement, as the AFTER row trigger read them). The bodies live in
-- sql/functions/triggers.sql; they are created here too because the triggers need them.

ALTER TABLE orch8.instance_transitions
DROP CONSTRAINT instance_transitions_tenant_id_instance_id_fkey;

CREATE FUNCTION orch8.task_instances_record_creations()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO orch8.instance_transitions (
        tenant_id, instance_id, from_state, to_state, actor, reason, api_key_id
    )
    SELECT n.tenant_id, n.id, NULL, n.state,
           orch8.attributed_actor(current_setting('orch8.transition_actor', true)),
           nullif(current_setting('orch8.transition_reason', true), ''),
           orch8.current_key_id()
    FROM new_rows AS n;
    RETURN NULL;
END
$$;

CREATE FUNCTION orch8.task_instances_record_moves()
RETURNS trigger
LANGUAGE plpgsql
SET enable_hashjoin = on
AS $$
BEGIN
    INSERT INTO orch8.instance_transitions (
        tenant_id, instance_id, from_state, to_state, actor, reason, api_key_id
    )
    SELECT n.tenant_id, n.id, o.state, n.state,
           orch8.attributed_actor(current_setting('orch8.transition_actor', true)),
           nullif(current_setting('orch8.transition_reason', true), ''),
           orch8.current_key_id()
    FROM new_rows AS n
    JOIN old_rows AS o ON o.tenant_id = n.tenant_id AND o.id = n.id
    WHERE n.state <> o.state;
    RETURN NULL;
END
$$;

DROP TRIGGER task_instances_record_transition ON orch8.task_instances;
DROP FUNCTION orch8.task_instances_record_transition();

CREATE TRIGGER task_instances_record_creations
AFTER INSERT ON orch8.task_instances
REFERENCING NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION orch8.task_instances_record_creations();

CREATE TRIGGER task_instances_record_moves
AFTER UPDATE ON orch8.task_instances
REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
FOR EACH STATEMENT EXECUTE FUNCTION orch8.task_instances_record_moves();
