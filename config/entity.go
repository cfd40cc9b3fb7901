package config

import (
	"fmt"
	"strings"

	"github.com/dam-dedup/dam/canon"
)

// EntityKind says where a route's identity comes from.
type EntityKind int

// The entity kinds.
const (
	// EntityKey: the Kafka record key, as bytes.
	EntityKey EntityKind = iota
	// EntityPointer: a JSON pointer into the value.
	EntityPointer
	// EntityHeader: the value of a record header.
	EntityHeader
)

func (k EntityKind) String() string {
	switch k {
	case EntityKey:
		return "key"
	case EntityPointer:
		return "pointer"
	case EntityHeader:
		return "header"
	}
	return fmt.Sprintf("EntityKind(%d)", int(k))
}

// EntitySource is a parsed route entity setting.
type EntitySource struct {
	Kind EntityKind
	// Pointer is the RFC 6901 pointer, for EntityPointer.
	Pointer string
	// Header is the header name, for EntityHeader.
	Header string
}

// ParseEntity parses a route's entity setting: "key", a JSON pointer
// ("/banana_id", no "*" wildcard) or "header:Name" (a non-empty name).
func ParseEntity(s string) (EntitySource, error) {
	switch {
	case s == "key":
		return EntitySource{Kind: EntityKey}, nil
	case strings.HasPrefix(s, "/"):
		if err := canon.ValidatePointer(s); err != nil {
			return EntitySource{}, fmt.Errorf("invalid entity pointer %q: %w", s, err)
		}
		for _, tok := range strings.Split(s[1:], "/") {
			if tok == "*" {
				return EntitySource{}, fmt.Errorf("invalid entity pointer %q: a wildcard cannot name one entity", s)
			}
		}
		return EntitySource{Kind: EntityPointer, Pointer: s}, nil
	case strings.HasPrefix(s, "header:"):
		name := strings.TrimPrefix(s, "header:")
		if name == "" {
			return EntitySource{}, fmt.Errorf("invalid entity %q: empty header name", s)
		}
		return EntitySource{Kind: EntityHeader, Header: name}, nil
	}
	return EntitySource{}, fmt.Errorf(`invalid entity %q: want "key", a JSON pointer such as "/id", or "header:Name"`, s)
}

// String returns the setting ParseEntity parses into e.
func (e EntitySource) String() string {
	switch e.Kind {
	case EntityPointer:
		return e.Pointer
	case EntityHeader:
		return "header:" + e.Header
	}
	return "key"
}
