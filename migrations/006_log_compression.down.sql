ALTER TABLE decision_log ALTER COLUMN offsets SET COMPRESSION default,
    ALTER COLUMN decisions SET COMPRESSION default,
    ALTER COLUMN entities SET COMPRESSION default;
