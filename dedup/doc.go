// Package dedup decides, over PostgreSQL, whether a record is new for its
// identity under its route's rule (Mode): last-seen (its content differs
// from the content last forwarded for (service, entity), optionally
// forwarded anyway after Rule.RefreshAfter), window (its message id was not
// seen within Rule.Window), or version (its version is above the highest
// forwarded for (service, entity)). That is its one job; Kafka is the
// caller's business.
//
// Each rule is a pure function, Rule.Decide: an identity's stored state
// (Stored), a record's digest and version, and the clock in; the
// decision, its cause (Cause) and the new state out, with no SQL and no
// I/O. Decide reads the state of a batch's identities, runs the rule on
// every record in offset order, and writes what changed; dam explain runs
// the same function to say why. CheckBatch's single-statement
// compare-and-set is last-seen without refresh, held to Rule.Decide by
// the same property test as Decide (TestRulesAgree).
//
// Tables (created by package migrations; unqualified, so the connection's
// search_path selects the schema):
//
//   - state (last-seen): per (service, entity), the digest last forwarded
//     (bytea, the 33-byte canon.Digest), when it was forwarded and the
//     source record.
//   - window_ids (window): per (service, message id), when it expires, when
//     it was forwarded, its digest and source record. Expired ids read as
//     absent; PruneWindow and CleanupWindow delete them in short batches.
//   - versions (version): per (service, entity), the highest version
//     forwarded, when, its digest and source record.
//   - progress: per consumer group partition, P (the next offset to decide,
//     NULL until set) and the fencing epoch.
//   - decision_log: per decided batch [first_offset, end_offset), its
//     forwarded and invalid records (with each invalid one's cause), so
//     that recovery can re-deliver the decisions between Kafka's committed
//     offset and P.
//
// Guarantees:
//
//   - Last-seen semantics: a record is Forward iff its digest differs from
//     the stored one (an absent identity is Forward), Duplicate otherwise
//     (or Refresh, with RefreshAfter), in any interleaving of concurrent
//     deciders, Decide and Check alike (existing rows are locked; a Decide
//     that loses the race for a new identity is rolled back and runs
//     again). The window and version rules hold the same way.
//   - One clock: windows and refreshes are measured on the database's
//     clock, read once per Decide after its locks are held (or on
//     Batch.Now, given explicitly); the cleanup uses the same clock.
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
