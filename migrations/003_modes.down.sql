DROP TABLE versions;
DROP TABLE window_ids;
