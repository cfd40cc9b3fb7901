DROP TABLE decision_log;
DROP TABLE progress;
DROP TABLE state;
