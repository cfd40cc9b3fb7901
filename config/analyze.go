package config

import (
	"errors"
	"slices"
)

// LoadAnalyze is Load for `dam analyze`, which decides records in memory:
// it needs no PostgreSQL and no consumer group, so postgres.dsn,
// kafka.group and kafka.brokers are optional (dam analyze requires the
// brokers itself when it reads Kafka). Everything else is checked as Load
// checks it: the routes are the ones dam run would run.
func LoadAnalyze(path string, environ []string) (Config, error) {
	return load(path, environ, forAnalyze)
}

// ValidateForAnalyze is Validate for `dam analyze`: the same checks and
// defaults (it parses each route's entity), but postgres.dsn, kafka.group
// and kafka.brokers are optional.
func (c *Config) ValidateForAnalyze() error {
	errs := slices.DeleteFunc(c.validate(), analyzesWithout)
	if len(errs) == 0 {
		return nil
	}
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return errors.Join(joined...)
}

// analyzesWithout reports a problem that does not concern `dam analyze`:
// a missing PostgreSQL DSN, consumer group or broker list.
func analyzesWithout(e *Error) bool {
	switch e.Key {
	case "postgres.dsn", "kafka.group", "kafka.brokers":
		return errors.Is(e.Err, ErrRequired)
	}
	return false
}
