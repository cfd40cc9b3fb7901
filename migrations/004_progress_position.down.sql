ALTER TABLE progress DROP COLUMN delivered, DROP COLUMN topic_id;
