package config

import "errors"

// Error is one configuration problem: Key is the key path
// ("routes[1].ignore[0]", "kafka.session_timeout") or, for the environment,
// the variable's name ("DAM_KAFKA_BROKERZ").
type Error struct {
	Key string
	Err error
}

func (e *Error) Error() string { return e.Key + ": " + e.Err.Error() }

// Unwrap returns the underlying problem, often one of the sentinels below.
func (e *Error) Unwrap() error { return e.Err }

// FileError is a problem reading or parsing the configuration file. Its
// message carries the parser's position ("yaml: line 3: ...") when there is
// one; it does not repeat the file name, which the caller knows.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Err.Error() }

// Unwrap returns the read or parse error.
func (e *FileError) Unwrap() error { return e.Err }

// Sentinels wrapped by *Error. Their text carries no "config:" prefix
// because it always follows a key path.
var (
	// ErrUnknownKey: the file has a key dam does not know (a typo).
	ErrUnknownKey = errors.New("unknown key")
	// ErrUnknownEnv: a DAM_ environment variable names no known key.
	ErrUnknownEnv = errors.New("unknown environment variable")
	// ErrRequired: a required key is missing or empty.
	ErrRequired = errors.New("required")
	// ErrNotSupported: a value reserved by the design but not built yet.
	ErrNotSupported = errors.New("not supported yet")
)

// ErrUnknownService is wrapped by Config.CheckService for a service that
// no route and no serve token names.
var ErrUnknownService = errors.New("config: unknown service")
