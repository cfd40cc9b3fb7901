package dedup

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// Limits of an identity (service, entity). Every table keys its rows by
// (service, entity) in a btree, and PostgreSQL refuses an index row larger
// than about a third of a page (2704 bytes): an identity past that cannot
// be stored at all. The limits keep every identity well inside it, for
// every table and every index of a future schema, and are checked before
// anything reaches the store, so that one record or one check that
// breaks them is refused alone (a dead letter, a 400), never the batch or
// the transaction it shares.
const (
	// MaxEntityBytes is the longest entity (or, in window mode, message
	// id) a decision accepts: 1 KiB. Keys, pointer values and headers that
	// are longer are bad input.
	MaxEntityBytes = 1024
	// MaxServiceBytes is the longest service name.
	MaxServiceBytes = 128
)

// CheckEntity returns an error wrapping ErrIdentity when entity is longer
// than MaxEntityBytes. Entities are bytes: any content is accepted.
func CheckEntity(entity []byte) error {
	if len(entity) > MaxEntityBytes {
		return fmt.Errorf("%w: entity of %d bytes, longer than the limit of %d", ErrIdentity, len(entity), MaxEntityBytes)
	}
	return nil
}

// CheckService returns an error wrapping ErrIdentity unless service is a
// name the store can hold and people can read: 1 to MaxServiceBytes bytes
// of valid UTF-8 without control characters (PostgreSQL's text refuses
// NUL and invalid UTF-8; terminal escapes have no place in a name that
// tools print).
func CheckService(service string) error {
	switch {
	case service == "":
		return fmt.Errorf("%w: empty service name", ErrIdentity)
	case len(service) > MaxServiceBytes:
		return fmt.Errorf("%w: service name of %d bytes, longer than the limit of %d", ErrIdentity, len(service), MaxServiceBytes)
	case !utf8.ValidString(service):
		return fmt.Errorf("%w: service name is not valid UTF-8", ErrIdentity)
	}
	for i, r := range service {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: service name holds the control character %U at byte %d", ErrIdentity, r, i)
		}
	}
	return nil
}
