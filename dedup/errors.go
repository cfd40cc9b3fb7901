package dedup

import "errors"

// Sentinel errors. Match them with errors.Is; the returned errors wrap them
// with context and, where there is one, the underlying PostgreSQL error.
var (
	// ErrFenced: the partition's epoch or progress moved: another owner has
	// the partition. Stop work on it; do not retry.
	ErrFenced = errors.New("dedup: fenced: another owner has the partition")
	// ErrUnavailable: the store could not be reached or the transaction's
	// outcome is unknown (connection lost, timeout, server shutting down,
	// serialization or deadlock abort). Retry after recovery; no decision
	// was returned.
	ErrUnavailable = errors.New("dedup: store unavailable")
	// ErrInvalid: the request itself is wrong (empty service, records out of
	// order or outside [Start, End)). A bug in the caller; never retry.
	ErrInvalid = errors.New("dedup: invalid request")
	// ErrIdentity: a service name or an entity outside the limits the
	// store can hold (CheckService, CheckEntity). Bad input from whoever
	// supplied it: a dead letter in the sidecar, a 400 from dam serve.
	ErrIdentity = errors.New("dedup: identity out of bounds")
)

// ErrNotFound: no state is stored for the identity (Get).
var ErrNotFound = errors.New("dedup: not found")
