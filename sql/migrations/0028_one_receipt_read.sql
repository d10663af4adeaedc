-- A guarded step reads its receipt once where it read it four times (docs/ARCHITECTURE.md,
-- "A step reads its receipt once"). require_own_receipt now answers the row it read, so
-- finish_step's test for a lost receipt and its ownership check are one read; a return
-- type cannot be changed in place, so the function is dropped here (IF EXISTS: on a new
-- database the functions are created after the migrations) and created again by
-- sql/functions/instances.sql. insert_block_output is the INSERT into block_outputs
-- without that check, for callers that hold a receipt they have checked or just written.

DROP FUNCTION IF EXISTS orch8.require_own_receipt(text, uuid, uuid, text, integer);

INSERT INTO orch8.function_access (name, access) VALUES
('insert_block_output', 'private');
