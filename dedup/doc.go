// Package dedup decides, over PostgreSQL, whether a record's content differs
// from the content last forwarded for its identity (service, entity). That
// is its one job; Kafka is the caller's business.
//
// Tables (created by package migrations; unqualified, so the connection's
// search_path selects the schema):
//
//   - state: per (service, entity), the digest last forwarded (bytea, the
//     33-byte canon.Digest), when it changed and the source record.
//   - progress: per consumer group partition, P (the next offset to decide,
//     NULL until set) and the fencing epoch.
//   - decision_log: per decided batch [first_offset, end_offset), its
//     forwarded and invalid records, so that recovery can re-deliver the
//     decisions between Kafka's committed offset and P.
//
// Guarantees:
//
//   - Last-seen semantics: a record is Forward iff its digest differs from
//     the stored one (an absent identity is Forward), Duplicate otherwise, in
//     any interleaving of concurrent deciders, Decide and Check alike
//     (existing rows are locked; a Decide that loses the race for a new
//     identity is rolled back and runs again).
//   - Decide is one READ COMMITTED transaction of two round trips per batch:
//     the state, the log and P change together or not at all.
//   - Fencing: a Decide whose epoch or start offset is not the partition's
//     current one fails with ErrFenced and changes nothing.
//   - Failure means no answer: when the store is unreachable or the outcome
//     is unknown, the error wraps ErrUnavailable and no decision is returned.
//
// Store is safe for concurrent use. Check joins a caller's own transaction
// through the smallest interface, Querier.
package dedup
