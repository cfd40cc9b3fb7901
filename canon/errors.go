package canon

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Sentinel errors. A failed Sum returns an *Error whose Err is one of the
// first six; New and ValidatePointer return a *PointerError wrapping
// ErrInvalidPointer; SumValues returns a *ValueError wrapping ErrNoValue
// for a value it cannot find.
var (
	// ErrSyntax: the input is not JSON (RFC 8259 grammar, including a BOM).
	ErrSyntax = errors.New("canon: syntax error")
	// ErrInvalidUTF8: a string holds invalid UTF-8 or a lone surrogate escape.
	ErrInvalidUTF8 = errors.New("canon: invalid UTF-8 or lone surrogate")
	// ErrDuplicateMember: a member name occurs twice in one object.
	ErrDuplicateMember = errors.New("canon: duplicate member")
	// ErrTooDeep: arrays and objects nest deeper than the maximum depth.
	ErrTooDeep = errors.New("canon: nesting too deep")
	// ErrTooLarge: the value is longer than the maximum size.
	ErrTooLarge = errors.New("canon: value too large")
	// ErrTrailingData: something other than whitespace follows the value.
	ErrTrailingData = errors.New("canon: data after the top-level value")
	// ErrInvalidPointer: an ignore or value pointer is not acceptable.
	ErrInvalidPointer = errors.New("canon: invalid pointer")
	// ErrNoValue: a value pointer names nothing in a valid value.
	ErrNoValue = errors.New("canon: no value at pointer")
)

// Error reports invalid input: where it is and which sentinel it is.
type Error struct {
	// Offset is the byte offset into the input where the problem was found.
	Offset int
	// Err is one of the sentinels ErrSyntax ... ErrTrailingData.
	Err error
	// Detail says more about the problem (may be empty).
	Detail string
}

// Error returns "canon: invalid JSON at byte N: REASON".
func (e *Error) Error() string {
	return fmt.Sprintf("canon: invalid JSON at byte %d: %s", e.Offset, e.Reason())
}

// Reason returns what is wrong without the prefix and offset, e.g.
// `duplicate member: "a"`, for callers that report the position their way.
func (e *Error) Reason() string {
	reason := strings.TrimPrefix(e.Err.Error(), "canon: ")
	if e.Detail != "" {
		reason += ": " + e.Detail
	}
	return reason
}

// Unwrap returns the sentinel, for errors.Is.
func (e *Error) Unwrap() error { return e.Err }

// maxQuoted is the most input bytes an error quotes: input is hostile, and
// errors end up in logs and in dead letters' headers.
const maxQuoted = 64

// quoteInput quotes b for an error's Detail, at most maxQuoted bytes of it
// (cut on a character boundary), marking a cut with "…" and the length.
func quoteInput(b []byte) string {
	if len(b) <= maxQuoted {
		return strconv.Quote(string(b))
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return strconv.Quote(string(b[:cut])) + "… (" + strconv.Itoa(len(b)) + " bytes)"
}

// PointerError reports an invalid ignore or value pointer.
type PointerError struct {
	// Pointer is the rejected pointer as given.
	Pointer string
	// Offset is the byte offset of the problem inside Pointer.
	Offset int
	// Reason says what is wrong.
	Reason string
	// Value is true for a value pointer (WithValues), false for an
	// ignore pointer.
	Value bool
}

// Error returns e.g. `canon: ignore pointer "/a~2": invalid escape "~2" at
// byte 2`, or `canon: value pointer ...`.
func (e *PointerError) Error() string {
	kind := "ignore"
	if e.Value {
		kind = "value"
	}
	return fmt.Sprintf("canon: %s pointer %q: %s", kind, e.Pointer, e.Reason)
}

// Unwrap returns ErrInvalidPointer.
func (e *PointerError) Unwrap() error { return ErrInvalidPointer }

// ValueError reports that a value pointer names nothing in a valid value.
type ValueError struct {
	// Pointer is the value pointer, as given to WithValues.
	Pointer string
	// Tombstone is true when the value was nil (a Kafka tombstone).
	Tombstone bool
}

// Error returns e.g. `canon: no value at "/banana_id"`.
func (e *ValueError) Error() string {
	if e.Tombstone {
		return fmt.Sprintf("canon: tombstone has no value at %q", e.Pointer)
	}
	return fmt.Sprintf("canon: no value at %q", e.Pointer)
}

// Unwrap returns ErrNoValue.
func (e *ValueError) Unwrap() error { return ErrNoValue }
