-- The named sets that the hot tables' CHECK constraints read (docs/PERFORMANCE.md, "What
-- each change bought"). A CHECK of `kind = any(orch8.node_kinds())` calls the function
-- once per statement that writes the table (the planner folds it), and a SQL-language
-- function is parsed and planned again on every call: about 0.18 ms of a 3-step guarded
-- step went to node_kinds, deferral_reasons and effect_kinds. In PL/pgSQL the body is
-- compiled once per session. Same names, same values, same comments; the constraints
-- keep pointing at them.

CREATE OR REPLACE FUNCTION orch8.node_kinds()
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN ARRAY['sequence', 'step', 'compensation', 'parallel', 'race', 'loop', 'for_each',
                 'router', 'try_catch', 'saga', 'undo', 'sub_sequence', 'sleep',
                 'wait_for_signal', 'wait_for_input'];
END
$$;

CREATE OR REPLACE FUNCTION orch8.deferral_reasons()
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN ARRAY['rate_limit', 'rate_limit_undefined'];
END
$$;

CREATE OR REPLACE FUNCTION orch8.effect_kinds()
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN ARRAY['http', 'model', 'message', 'storage', 'custom', 'worker'];
END
$$;
