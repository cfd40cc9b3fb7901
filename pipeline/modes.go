package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

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

// versionFunc extracts a version-mode record's version. It returns
// errNoVersion (wrapped) when the record has none or it is not an integer:
// such a record is bad input.
type versionFunc func(r *kgo.Record) (int64, error)

// compileMode sets the route's rule and, per mode, its identity and version
// extractors and cleanup settings.
func (rt *route) compileMode(rc config.Route) {
	switch rc.Mode {
	case config.ModeWindow:
		rt.rule = dedup.Rule{Mode: dedup.Window, Window: rc.Window, Sliding: rc.Sliding}
		rt.entity = idFunc(rc.IDSource())
		rt.cleanupEvery, rt.cleanupBatch = rc.CleanupInterval, rc.CleanupBatch
	case config.ModeVersion:
		rt.rule = dedup.Rule{Mode: dedup.Version}
		rt.version = versionFuncOf(rc.VersionSource())
	default:
		rt.rule = dedup.Rule{RefreshAfter: rc.RefreshAfter}
	}
}

// extract returns a record's identity (its entity, or in window mode its
// message id) and, in version mode, its version: the one place where they
// are taken out of a record, so that a parser extracting them in the
// hashing pass can replace it. A non-nil error means bad input.
func (rt *route) extract(r *kgo.Record) (identity []byte, version int64, err error) {
	if identity, err = rt.entity(r); err != nil || rt.version == nil {
		return identity, 0, err
	}
	version, err = rt.version(r)
	return identity, version, err
}

// idFunc extracts window mode's message id from a header or a pointer: a
// string's value or a number's literal text (so "7" and 7 name one id). An
// empty id, or a pointer to anything else (null, an object), is missing:
// such records would otherwise all share one id.
func idFunc(src config.EntitySource) entityFunc {
	if src.Kind == config.EntityHeader {
		return func(r *kgo.Record) ([]byte, error) {
			v, ok := header(r, src.Header)
			switch {
			case !ok:
				return nil, fmt.Errorf("%w: no header %q", errNoID, src.Header)
			case len(v) == 0:
				return nil, fmt.Errorf("%w: header %q is empty", errNoID, src.Header)
			}
			return v, nil
		}
	}
	tokens := splitPointer(src.Pointer)
	return func(r *kgo.Record) ([]byte, error) {
		raw, err := pointerValue(r, tokens)
		if err != nil {
			return nil, fmt.Errorf("%w at %s: %v", errNoID, src.Pointer, err)
		}
		switch c := raw[0]; {
		case c == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil || s == "" {
				return nil, fmt.Errorf("%w at %s: empty or invalid string", errNoID, src.Pointer)
			}
			return []byte(s), nil
		case c == '-' || ('0' <= c && c <= '9'):
			return raw, nil // a number is its literal: 7 and 7.0 differ
		}
		return nil, fmt.Errorf("%w at %s: %.40s is not a string or a number", errNoID, src.Pointer, raw)
	}
}

// versionFuncOf extracts version mode's version from a header (a decimal
// integer) or a pointer (a JSON integer: 7, not 7.0, "7" or 7e0).
func versionFuncOf(src config.EntitySource) versionFunc {
	if src.Kind == config.EntityHeader {
		return func(r *kgo.Record) (int64, error) {
			v, ok := header(r, src.Header)
			if !ok {
				return 0, fmt.Errorf("%w: no header %q", errNoVersion, src.Header)
			}
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%w: header %q: %.40q is not a 64-bit integer", errNoVersion, src.Header, v)
			}
			return n, nil
		}
	}
	tokens := splitPointer(src.Pointer)
	return func(r *kgo.Record) (int64, error) {
		raw, err := pointerValue(r, tokens)
		if err != nil {
			return 0, fmt.Errorf("%w at %s: %v", errNoVersion, src.Pointer, err)
		}
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w at %s: %.40s is not a 64-bit integer", errNoVersion, src.Pointer, raw)
		}
		return n, nil
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

// pointerValue returns the JSON text at a pointer (entity.go's lookup).
func pointerValue(r *kgo.Record, tokens []string) (json.RawMessage, error) {
	if r.Value == nil {
		return nil, errors.New("a tombstone has no value")
	}
	raw, err := lookup(r.Value, tokens)
	if err == nil && len(raw) == 0 {
		err = errors.New("no value")
	}
	return raw, err
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
		n, ran, err := p.store.CleanupWindow(ctx, rt.service, rt.cleanupBatch)
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
