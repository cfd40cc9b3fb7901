package explain

import "errors"

// Errors of Explainer's methods, wrapped with the details.
var (
	// ErrUnknownService: a query without a route names a service that has
	// no stored state either.
	ErrUnknownService = errors.New("explain: unknown service")
	// ErrOtherIdentity: the payload's identity, as the route reads it, is
	// not the identity asked about.
	ErrOtherIdentity = errors.New("explain: the payload is of another identity")
	// ErrGone: the record can no longer be read from Kafka, and the decision
	// log no longer covers it.
	ErrGone = errors.New("explain: nothing left to explain it from")
)
