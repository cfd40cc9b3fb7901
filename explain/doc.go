// Package explain says why a record was, or would be, forwarded or
// dropped: that is its one job. It reads the stored state (package dedup),
// the decision log and the route's input in Kafka, runs the route's rule
// (dedup.Rule.Decide, the rule the sidecar runs) and returns a typed
// explanation with its reason and evidence. It changes nothing.
//
// Two questions: Explainer.Payload, would this payload be forwarded now
// (and what differs from the stored content); Explainer.Offset, what was
// decided for the input record at this offset, and why ("duplicate of the
// content forwarded from offset N at T"). A route is given as a Route,
// which pipeline.Route satisfies: explain reads records exactly as the
// sidecar does without depending on its Kafka loop.
package explain
