// Package observe tests dam's observability end to end: `dam run` (the
// real binary) against an in-process Kafka broker (kfake, real wire
// protocol) and the test PostgreSQL, scraped by a real Prometheus server
// (Debian's prometheus package). It checks the counters and the
// duplicate-drop rate Prometheus reports against a reference model, that
// Prometheus loads the alert rules and fires DamDeadLetters, and that
// every PromQL expression of the dashboard and the rules parses with
// Prometheus's parser and names only metrics a real scrape of dam shows.
// It has no code of its own.
package observe
