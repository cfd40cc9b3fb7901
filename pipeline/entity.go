package pipeline

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// errNoEntity is the reason recorded on a dead letter whose identity is
// missing.
var errNoEntity = errors.New("missing entity")

// entityFunc extracts a record's identity from its key or a header. It
// returns errNoEntity (wrapped) when the record has none: such a record is
// bad input, never a silent skip. (A pointer's value is read by the route's
// hasher, in the hashing pass: see route.identify in modes.go.)
type entityFunc func(r *kgo.Record) ([]byte, error)

func keyEntity(r *kgo.Record) ([]byte, error) {
	if r.Key == nil {
		return nil, fmt.Errorf("%w: record has no key", errNoEntity)
	}
	return r.Key, nil
}

func headerEntity(name string) entityFunc {
	return func(r *kgo.Record) ([]byte, error) {
		if v, ok := header(r, name); ok {
			return v, nil
		}
		return nil, fmt.Errorf("%w: no header %q", errNoEntity, name)
	}
}

// Route is one configured route compiled as the sidecar runs it, for tools
// that must see a record the way the sidecar decides it (dam explain: it
// satisfies explain.Route).
type Route struct {
	rt *route
	rc config.Route
}

// CompileRoute compiles rc, which must come from a validated configuration
// (config.Load or Config.Validate parse its entity). opts are given to its
// hasher after the route's own: dam analyze, which decides in memory, adds
// canon.WithLocalDigest.
func CompileRoute(rc config.Route, opts ...canon.Option) (*Route, error) {
	rt, err := compileRoute(rc, opts...)
	if err != nil {
		return nil, err
	}
	return &Route{rt: rt, rc: rc}, nil
}

// Config returns the configuration the route was compiled from.
func (r *Route) Config() config.Route { return r.rc }

// Identify returns a record's identity (its entity, or in window mode its
// message id), its version (version mode) and its digest as the route
// decides them, or why the record is bad input (it would be dead-lettered).
func (r *Route) Identify(rec *kgo.Record) (identity []byte, version int64, digest canon.Digest, err error) {
	return r.rt.identify(rec)
}

// Entity returns a record's identity alone: from its key or a header even
// when its value is bad input, and from a pointer when the value has one.
func (r *Route) Entity(rec *kgo.Record) ([]byte, error) {
	if r.rt.entity != nil {
		return r.rt.entity(rec)
	}
	identity, _, _, err := r.rt.identify(rec)
	return identity, err
}

// Rule returns the decision rule the route's batches carry: its mode and
// that mode's settings.
func (r *Route) Rule() dedup.Rule { return r.rt.rule }

// Hasher returns the route's hasher: its format, ignore pointers and
// limits, as its digests are computed (dam analyze reads the canonical
// form of the records it would forward through it).
func (r *Route) Hasher() *canon.Hasher { return r.rt.hasher }
