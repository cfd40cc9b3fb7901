CREATE INDEX IF NOT EXISTS state_service_updated_at ON state (service, updated_at);
