// Package analyze says what dam would decide on a stream before it is
// deployed: that is its one job. It reads records (a topic range from
// Kafka, or a file), decides them with the routes' own rules in memory,
// and reports per route how many it would forward and drop, its dead
// letters by reason, the entities it would drop most, and which JSON
// paths change in the records it would forward, with the drop rate each
// would give if it were ignored too. It writes nothing anywhere and needs
// no PostgreSQL.
//
// The decisions are the sidecar's: a record's identity, version and
// digest come from pipeline.Route.Identify (the route compiled by
// pipeline.CompileRoute, as dam run compiles it) and the decision from
// dedup.Rule.Decide, the rule dam run's transactions, dam explain and dam
// serve run; analyze keeps the state those functions read and write in
// memory instead of PostgreSQL. A what-if rate is not an estimate: the
// same records are read again and decided by the route compiled with the
// path added to its ignore list.
//
// The routes are compiled with canon.WithLocalDigest: a content's digest
// is only ever compared with the digests of the same run, so it is two
// seeded 64-bit hashes of the canonical form rather than its SHA-256,
// which cost about a tenth of the reading.
//
// Memory is bounded: an identity's state is kept as digests (16 bytes of
// two seeded hashes of the identity, 16 bytes of its content's digest, its
// times and version: about 100 bytes an identity with the map's
// overhead), and Options.MaxIdentities caps the identities held at once;
// reaching it stops the reading, and the report says where. The
// structural summaries the churn compares (one 24-byte entry per leaf of
// an identity's last forwarded record) are kept within
// Options.SummaryBytes; past it, new identities' forwards are counted as
// not compared.
//
// Files: analyze.go (Run, the passes), state.go (the in-memory state),
// churn.go (leaves and changed paths), report.go (the report), kafka.go
// and file.go (the sources).
package analyze
