package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
)

// The decision rules beside last-seen (DESIGN §1, "Other modes"). They go
// through the same protocol as last-seen: the route's dedup.Rule rides on
// every batch (decide.go), the decision log records every forward, and
// recovery replays it unchanged. What is theirs is here: what a record's
// identity and version are, and the background cleanup of expired window
// ids.

// Reasons recorded on the dead letter of a record the mode cannot decide.
var (
	errNoID      = errors.New("missing message id")
	errNoVersion = errors.New("missing or invalid version")
)

// pointerValue is a value the route's hasher reads at a pointer in its
// hashing pass: the pointer and its index among canon.WithValues.
type pointerValue struct {
	pointer string
	index   int
}

// versionSource is where version mode reads a record's version.
type versionSource struct {
	on     bool
	header string       // a header holding a decimal integer, or
	value  pointerValue // a JSON integer at a pointer
}

// compileMode sets the route's rule, where its identity (the entity, or in
// window mode the message id) and its version come from, and its cleanup
// settings. It returns the pointers the hasher reads in its pass.
func (rt *route) compileMode(rc config.Route) (pointers []string) {
	ident := rc.EntitySource()
	switch rc.Mode {
	case config.ModeWindow:
		rt.rule = dedup.Rule{Mode: dedup.Window, Window: rc.Window, Sliding: rc.Sliding}
		ident = rc.IDSource()
		rt.cleanupEvery, rt.cleanupBatch = rc.CleanupInterval, rc.CleanupBatch
	case config.ModeVersion:
		rt.rule = dedup.Rule{Mode: dedup.Version}
		rt.version.on = true
		if vs := rc.VersionSource(); vs.Kind == config.EntityHeader {
			rt.version.header = vs.Header
		} else {
			rt.version.value = pointerValue{vs.Pointer, len(pointers)}
			pointers = append(pointers, vs.Pointer)
		}
	default:
		rt.rule = dedup.Rule{RefreshAfter: rc.RefreshAfter}
	}
	rt.identName = "entity (" + ident.String() + ")"
	if rc.Mode == config.ModeWindow {
		rt.identName = "message id (" + ident.String() + ")"
	}
	switch {
	case ident.Kind == config.EntityPointer:
		rt.ident = pointerValue{ident.Pointer, len(pointers)}
		pointers = append(pointers, ident.Pointer)
	case ident.Kind == config.EntityHeader && rc.Mode == config.ModeWindow:
		rt.entity = windowHeaderID(ident.Header)
	case ident.Kind == config.EntityHeader:
		rt.entity = headerEntity(ident.Header)
	default:
		rt.entity = keyEntity
	}
	rt.npointers = len(pointers)
	return pointers
}

// identify returns a record's identity (its entity, or in window mode its
// message id), its version (version mode) and its digest, or why it is bad
// input: the one place where they are taken out of a record. Values at
// pointers come from the hashing pass itself (canon.Hasher.SumValues): one
// parse, and exact bytes (a string's decoded value, any other value's
// compact text), never a re-encoding that would merge two identities; on a
// format: bytes route too, where a value that is not JSON has none.
func (rt *route) identify(r *kgo.Record) (identity []byte, version int64, digest canon.Digest, err error) {
	return rt.identifyIn(r, nil, 0)
}

// identifyIn is identify, but with batch the digest is queued in batch
// under index i (its Flush reports it) instead of returned: SHA-256 runs
// over several records at once.
func (rt *route) identifyIn(r *kgo.Record, batch *canon.Batch, i int) (identity []byte, version int64, digest canon.Digest, err error) {
	if rt.entity != nil {
		if identity, err = rt.entity(r); err != nil {
			return nil, 0, canon.Digest{}, err
		}
		if err = dedup.CheckEntity(identity); err != nil {
			return nil, 0, canon.Digest{}, fmt.Errorf("%s: %w", rt.identName, err)
		}
	}
	var vals [2]canon.Value
	switch {
	case batch != nil:
		_, err = batch.Add(i, r.Value, nil, vals[:rt.npointers])
	case rt.npointers == 0:
		digest, err = rt.hasher.Sum(r.Value)
	default:
		digest, _, err = rt.hasher.SumValues(r.Value, nil, vals[:rt.npointers])
	}
	var ve *canon.ValueError
	if errors.As(err, &ve) {
		return nil, 0, canon.Digest{}, fmt.Errorf("%w: %w", rt.missing(ve.Pointer), err)
	}
	if err != nil {
		return nil, 0, canon.Digest{}, err
	}
	if rt.entity == nil {
		v := vals[rt.ident.index]
		if rt.rule.Mode == dedup.Window && ((v.Kind != canon.KindString && v.Kind != canon.KindNumber) || len(v.Bytes) == 0) {
			// null, objects, empty ids: records would all share one id.
			return nil, 0, canon.Digest{}, fmt.Errorf("%w at %s: not a non-empty string or a number", errNoID, rt.ident.pointer)
		}
		identity = v.Bytes
		if err = dedup.CheckEntity(identity); err != nil {
			return nil, 0, canon.Digest{}, fmt.Errorf("%s: %w", rt.identName, err)
		}
	}
	if rt.version.on {
		if version, err = rt.versionOf(r, vals[:rt.npointers]); err != nil {
			return nil, 0, canon.Digest{}, err
		}
	}
	return identity, version, digest, nil
}

// missing is the reason recorded when the value at ptr is missing.
func (rt *route) missing(ptr string) error {
	switch {
	case rt.version.on && rt.version.header == "" && ptr == rt.version.value.pointer:
		return errNoVersion
	case rt.rule.Mode == dedup.Window:
		return errNoID
	default:
		return errNoEntity
	}
}

// versionOf reads version mode's version: a header holding a decimal
// integer, or a JSON integer at a pointer (7, not 7.0, 7e0 or "7").
func (rt *route) versionOf(r *kgo.Record, vals []canon.Value) (int64, error) {
	if h := rt.version.header; h != "" {
		v, ok := header(r, h)
		if !ok {
			return 0, fmt.Errorf("%w: no header %q", errNoVersion, h)
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: header %q: %.40q is not a 64-bit integer", errNoVersion, h, v)
		}
		return n, nil
	}
	v := vals[rt.version.value.index]
	n, err := strconv.ParseInt(string(v.Bytes), 10, 64)
	if v.Kind != canon.KindNumber || err != nil {
		return 0, fmt.Errorf("%w at %s: %.40s is not a 64-bit integer", errNoVersion, rt.version.value.pointer, v.Bytes)
	}
	return n, nil
}

// windowHeaderID reads window mode's message id from a header: a missing or
// empty one is bad input (records without one would all share one id).
func windowHeaderID(name string) entityFunc {
	return func(r *kgo.Record) ([]byte, error) {
		v, ok := header(r, name)
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: no header %q", errNoID, name)
		case len(v) == 0:
			return nil, fmt.Errorf("%w: header %q is empty", errNoID, name)
		}
		return v, nil
	}
}

// header returns the value of r's first header named name.
func header(r *kgo.Record, name string) ([]byte, bool) {
	for i := range r.Headers {
		if r.Headers[i].Key == name {
			return r.Headers[i].Value, true
		}
	}
	return nil, false
}

// cleanupLoop deletes a window-mode route's expired ids at once and then
// every cleanup_interval, in statements of cleanup_batch rows, until ctx
// ends. Every instance runs it; dedup.CleanupWindow's advisory lock lets
// one at a time work on a service, the others skip that round. Run owns
// the goroutine and waits for it.
func (p *Pipeline) cleanupLoop(ctx context.Context, rt *route) {
	log := p.log.With(zap.String("service", rt.service))
	t := time.NewTicker(rt.cleanupEvery)
	defer t.Stop()
	for {
		n, ran, err := p.store.CleanupWindow(ctx, rt.service, dedup.WithBatchSize(rt.cleanupBatch))
		p.metrics.windowExpired.WithLabelValues(rt.service).Add(float64(n))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			p.metrics.windowCleanups.WithLabelValues(rt.service, cleanupFailed).Inc()
			log.Warn("window cleanup failed; it runs again at the next interval",
				zap.Int64("deleted", n), zap.Duration("interval", rt.cleanupEvery), zap.Error(err))
		case !ran:
			p.metrics.windowCleanups.WithLabelValues(rt.service, cleanupSkipped).Inc()
		default:
			p.metrics.windowCleanups.WithLabelValues(rt.service, cleanupDone).Inc()
			if n > 0 {
				log.Debug("window cleanup: expired ids deleted", zap.Int64("deleted", n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
