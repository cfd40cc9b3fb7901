package canon

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. A failed Sum returns an *Error whose Err is one of the
// first six; New and ValidatePointer return a *PointerError wrapping
// ErrInvalidPointer.
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
	// ErrInvalidPointer: an ignore pointer is not a valid RFC 6901 pointer.
	ErrInvalidPointer = errors.New("canon: invalid ignore pointer")
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

// PointerError reports an invalid ignore pointer.
type PointerError struct {
	// Pointer is the rejected pointer as given.
	Pointer string
	// Offset is the byte offset of the problem inside Pointer.
	Offset int
	// Reason says what is wrong.
	Reason string
}

// Error returns e.g. `canon: ignore pointer "/a~2": invalid escape "~2" at byte 2`.
func (e *PointerError) Error() string {
	return fmt.Sprintf("canon: ignore pointer %q: %s", e.Pointer, e.Reason)
}

// Unwrap returns ErrInvalidPointer.
func (e *PointerError) Unwrap() error { return ErrInvalidPointer }
