DROP TABLE operator_skips;
