package pipeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// errNoEntity is the reason recorded on a dead letter whose identity is
// missing.
var errNoEntity = errors.New("missing entity")

// entityFunc extracts a record's identity. It returns errNoEntity (wrapped)
// when the record has none: such a record is bad input, never a silent skip.
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

// pointerEntity extracts the value at an RFC 6901 pointer. A string yields
// its decoded bytes ("B-007"), any other value its compact JSON text, so
// that 7 and "7" are different entities.
func pointerEntity(ptr string) entityFunc {
	tokens := splitPointer(ptr)
	return func(r *kgo.Record) ([]byte, error) {
		if r.Value == nil {
			return nil, fmt.Errorf("%w: tombstone has no %s", errNoEntity, ptr)
		}
		raw, err := lookup(r.Value, tokens)
		if err != nil {
			return nil, fmt.Errorf("%w at %s: %v", errNoEntity, ptr, err)
		}
		if len(raw) > 0 && raw[0] == '"' {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, fmt.Errorf("%w at %s: %v", errNoEntity, ptr, err)
			}
			return []byte(s), nil
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, fmt.Errorf("%w at %s: %v", errNoEntity, ptr, err)
		}
		return buf.Bytes(), nil
	}
}

func splitPointer(ptr string) []string {
	parts := strings.Split(ptr, "/")[1:]
	for i, p := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(p)
	}
	return parts
}

// lookup walks value along tokens with a streaming decoder, so that only
// the path to the entity is decoded.
func lookup(value []byte, tokens []string) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	for depth, tok := range tokens {
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
