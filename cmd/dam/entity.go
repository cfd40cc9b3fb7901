package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/config"
)

// entityFunc extracts a record's identity as a route does.
type entityFunc func(r *kgo.Record) ([]byte, error)

// errNoEntity: the record has no identity (bad input for the sidecar).
var errNoEntity = errors.New("missing entity")

// entityExtractor returns the identity extraction of a route's entity
// setting. It repeats pipeline's (unexported) extraction, so that explain
// names the identity the sidecar decided for: a string at a pointer
// yields its decoded bytes, any other value its compact JSON text.
func entityExtractor(src config.EntitySource) entityFunc {
	switch src.Kind {
	case config.EntityHeader:
		return func(r *kgo.Record) ([]byte, error) {
			for _, h := range r.Headers {
				if h.Key == src.Header {
					return h.Value, nil
				}
			}
			return nil, fmt.Errorf("%w: no header %q", errNoEntity, src.Header)
		}
	case config.EntityPointer:
		return func(r *kgo.Record) ([]byte, error) {
			if r.Value == nil {
				return nil, fmt.Errorf("%w: tombstone has no %s", errNoEntity, src.Pointer)
			}
			raw, err := lookupPointer(r.Value, src.Pointer)
			if err != nil {
				return nil, fmt.Errorf("%w at %s: %v", errNoEntity, src.Pointer, err)
			}
			if len(raw) > 0 && raw[0] == '"' {
				var s string
				if err := json.Unmarshal(raw, &s); err != nil {
					return nil, fmt.Errorf("%w at %s: %v", errNoEntity, src.Pointer, err)
				}
				return []byte(s), nil
			}
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil {
				return nil, fmt.Errorf("%w at %s: %v", errNoEntity, src.Pointer, err)
			}
			return buf.Bytes(), nil
		}
	}
	return func(r *kgo.Record) ([]byte, error) {
		if r.Key == nil {
			return nil, fmt.Errorf("%w: record has no key", errNoEntity)
		}
		return r.Key, nil
	}
}

// lookupPointer returns the raw JSON at an RFC 6901 pointer of value.
func lookupPointer(value []byte, ptr string) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	tokens := strings.Split(ptr, "/")[1:]
	unescape := strings.NewReplacer("~1", "/", "~0", "~")
	for depth, tok := range tokens {
		tok = unescape.Replace(tok)
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		switch t {
		case json.Delim('{'):
			found := false
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				if k.(string) == tok {
					found = true
					break
				}
				var skip json.RawMessage
				if err := dec.Decode(&skip); err != nil {
					return nil, err
				}
			}
			if !found {
				return nil, fmt.Errorf("no member %q at depth %d", tok, depth)
			}
		case json.Delim('['):
			idx, err := strconv.Atoi(tok)
			if err != nil || idx < 0 || (len(tok) > 1 && tok[0] == '0') {
				return nil, fmt.Errorf("%q is not an array index", tok)
			}
			for i := 0; ; i++ {
				if !dec.More() {
					return nil, fmt.Errorf("index %d out of range", idx)
				}
				if i == idx {
					break
				}
				var skip json.RawMessage
				if err := dec.Decode(&skip); err != nil {
					return nil, err
				}
			}
		default:
			return nil, fmt.Errorf("no container at depth %d", depth)
		}
	}
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, err
	}
	return raw, nil
}
