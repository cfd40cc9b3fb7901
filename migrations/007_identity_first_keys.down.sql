DO $$
BEGIN
  DROP INDEX window_ids_by_service;
  ALTER TABLE window_ids DROP CONSTRAINT window_ids_pkey;
  ALTER TABLE window_ids ADD CONSTRAINT window_ids_pkey PRIMARY KEY (service, id);
  DROP INDEX versions_by_service;
  ALTER TABLE versions DROP CONSTRAINT versions_pkey;
  ALTER TABLE versions ADD CONSTRAINT versions_pkey PRIMARY KEY (service, entity);
  DROP INDEX state_by_service;
  ALTER TABLE state DROP CONSTRAINT state_pkey;
  ALTER TABLE state ADD CONSTRAINT state_pkey PRIMARY KEY (service, entity);
END
$$;
