package pipeline

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
)

// errNoEntity is the reason recorded on a dead letter whose identity is
// missing.
var errNoEntity = errors.New("missing entity")

// entityFunc extracts a record's identity from its key or a header. It
// returns errNoEntity (wrapped) when the record has none: such a record is
// bad input, never a silent skip. (A pointer entity is read by the route's
// hasher, in the hashing pass: see route.identify.)
type entityFunc func(r *kgo.Record) ([]byte, error)

func keyEntity(r *kgo.Record) ([]byte, error) {
	if r.Key == nil {
		return nil, fmt.Errorf("%w: record has no key", errNoEntity)
	}
	return r.Key, nil
}

func headerEntity(name string) entityFunc {
	return func(r *kgo.Record) ([]byte, error) {
		for i := range r.Headers {
			if r.Headers[i].Key == name {
				return r.Headers[i].Value, nil
			}
		}
		return nil, fmt.Errorf("%w: no header %q", errNoEntity, name)
	}
}

// identify returns a record's identity and digest, or why it is bad
// input. A pointer entity is read in the same pass as the digest
// (canon.Hasher.SumValues): one parse, and the entity's exact bytes (a
// string's decoded value, any other value's compact text), never a
// re-encoding that would merge two entities; on a format: bytes route too,
// where a value that is not JSON has no entity and is bad input.
func (rt *route) identify(r *kgo.Record) ([]byte, canon.Digest, error) {
	if rt.entity != nil {
		entity, err := rt.entity(r)
		if err != nil {
			return nil, canon.Digest{}, err
		}
		d, err := rt.hasher.Sum(r.Value)
		return entity, d, err
	}
	var vals [1]canon.Value
	d, _, err := rt.hasher.SumValues(r.Value, nil, vals[:])
	if errors.Is(err, canon.ErrNoValue) {
		return nil, canon.Digest{}, fmt.Errorf("%w: %w", errNoEntity, err)
	}
	if err != nil {
		return nil, canon.Digest{}, err
	}
	return vals[0].Bytes, d, nil
}

// Route is one configured route compiled as the sidecar runs it, for tools
// that must see a record the way the sidecar decides it (dam explain).
type Route struct{ rt *route }

// CompileRoute compiles rc, which must come from a validated configuration
// (config.Load or Config.Validate parse its entity).
func CompileRoute(rc config.Route) (*Route, error) {
	rt, err := compileRoute(rc)
	if err != nil {
		return nil, err
	}
	return &Route{rt: rt}, nil
}

// Identify returns a record's identity and digest as the route decides
// them, or why the record is bad input (it would be dead-lettered).
func (r *Route) Identify(rec *kgo.Record) (entity []byte, digest canon.Digest, err error) {
	return r.rt.identify(rec)
}

// Entity returns a record's identity alone: from its key or a header even
// when its value is bad input, and from a pointer when the value has one.
func (r *Route) Entity(rec *kgo.Record) ([]byte, error) {
	if r.rt.entity != nil {
		return r.rt.entity(rec)
	}
	entity, _, err := r.rt.identify(rec)
	return entity, err
}
