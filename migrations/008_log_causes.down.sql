ALTER TABLE decision_log DROP COLUMN causes;
