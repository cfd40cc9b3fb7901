package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix prefixes every environment variable Load reads.
const EnvPrefix = "DAM_"

// envIgnorePrefix marks variables used by tests elsewhere; Load ignores them.
const envIgnorePrefix = "DAM_TEST_"

// Load returns the effective configuration: Default(), overlaid by the YAML
// file at path ("" for none; a missing file is an error), overlaid by the
// DAM_-prefixed entries of environ (os.Environ() form), with the secrets
// named by postgres.dsn_file and kafka.sasl.password_file read from their
// files, then validated.
//
// The file must not contain unknown keys. An environment variable names a
// scalar key by upper-casing its path and replacing dots with underscores
// (postgres.statement_timeout: DAM_POSTGRES_STATEMENT_TIMEOUT); lists take
// comma-separated values (DAM_KAFKA_BROKERS=a:9092,b:9092); routes,
// serve.tokens and http.tap.tokens cannot be set from the environment. Variables starting with
// DAM_TEST_ are ignored; any other unknown DAM_ variable is an error.
//
// The error, if any, joins every problem found: *FileError for an unreadable
// or unparseable file, otherwise *Error values naming keys or variables.
func Load(path string, environ []string) (Config, error) {
	return load(path, environ, forRun)
}

// purpose is the command a configuration is loaded for: what it requires.
type purpose uint8

const (
	forRun     purpose = iota // dam run (and every command but serve and analyze)
	forServe                  // LoadServe
	forAnalyze                // LoadAnalyze
)

// load is Load, LoadServe or LoadAnalyze, by purpose.
func load(path string, environ []string, use purpose) (Config, error) {
	k := koanf.New(".")
	if path != "" {
		b, err := file.Provider(path).ReadBytes()
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return Config{}, &FileError{Path: path, Err: err}
		}
		m, err := yaml.Parser().Unmarshal(b)
		if err != nil {
			return Config{}, &FileError{Path: path, Err: err}
		}
		if err := k.Load(mapProvider(m), nil); err != nil {
			return Config{}, &FileError{Path: path, Err: err}
		}
	}
	env, errs := readEnv(environ)
	if err := k.Load(mapProvider(env), nil); err != nil {
		return Config{}, err
	}

	cfg := Default()
	d := &decoder{}
	d.decode("", k.Raw(), reflect.ValueOf(&cfg).Elem())
	d.readSecretFiles(&cfg)
	errs = append(errs, d.errs...)
	problems := cfg.validate()
	switch use {
	case forAnalyze:
		problems = slices.DeleteFunc(problems, analyzesWithout)
	case forServe:
		problems = slices.DeleteFunc(problems, servesWithout)
		v := &validator{}
		cfg.validateForServe(v)
		problems = append(problems, v.errs...)
	}
	for _, err := range problems {
		if !d.covers(err.Key) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}

// mapProvider is a koanf.Provider of an already-parsed map.
type mapProvider map[string]any

func (m mapProvider) ReadBytes() ([]byte, error) {
	return nil, errors.New("config: mapProvider does not provide bytes")
}

func (m mapProvider) Read() (map[string]any, error) { return m, nil }

// envKey is one key settable from the environment.
type envKey struct {
	path string
	typ  reflect.Type
}

// envKeys maps variable names to the scalar (and string-list) keys of
// Config, derived from the struct so that keys with underscores in their
// names (dead_letter, statement_timeout) map correctly.
var envKeys = func() map[string]envKey {
	m := make(map[string]envKey)
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := f.Tag.Get("koanf")
			if name == "" || (f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct) {
				continue // routes, serve.tokens: only in the file
			}
			path := joinKey(prefix, name)
			if f.Type.Kind() == reflect.Struct {
				walk(path, f.Type)
				continue
			}
			env := EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
			if _, dup := m[env]; dup {
				panic("config: two keys map to " + env)
			}
			m[env] = envKey{path: path, typ: f.Type}
		}
	}
	walk("", reflect.TypeOf(Config{}))
	return m
}()

// EnvVar returns the environment variable setting the key at path, or ""
// if the key cannot be set from the environment.
func EnvVar(path string) string {
	for name, k := range envKeys {
		if k.path == path {
			return name
		}
	}
	return ""
}

// readEnv turns the DAM_ entries of environ into a nested map of typed
// values, and reports unknown variables and unparseable values.
func readEnv(environ []string) (map[string]any, []error) {
	flat := make(map[string]any)
	var names []string
	vals := make(map[string]string)
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || strings.HasPrefix(name, envIgnorePrefix) {
			continue
		}
		if _, seen := vals[name]; !seen {
			names = append(names, name)
		}
		vals[name] = val
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		val := vals[name]
		k, ok := envKeys[name]
		if !ok {
			err := ErrUnknownEnv
			if strings.HasPrefix(name, EnvPrefix+"ROUTES") {
				err = fmt.Errorf("%w: routes cannot be set from the environment", ErrUnknownEnv)
			}
			if strings.HasPrefix(name, EnvPrefix+"SERVE_TOKENS") {
				err = fmt.Errorf("%w: serve.tokens cannot be set from the environment (%sSERVE_TOKEN gives one token for every service)", ErrUnknownEnv, EnvPrefix)
			}
			if strings.HasPrefix(name, EnvPrefix+"HTTP_TAP_TOKENS") {
				err = fmt.Errorf("%w: http.tap.tokens cannot be set from the environment (%sHTTP_TAP_TOKEN gives one token for every service)", ErrUnknownEnv, EnvPrefix)
			}
			errs = append(errs, &Error{Key: name, Err: err})
			continue
		}
		v, err := parseEnv(k, val)
		if err != nil {
			errs = append(errs, &Error{Key: k.path, Err: fmt.Errorf("%w (from %s)", err, name)})
			continue
		}
		flat[k.path] = v
	}
	return unflatten(flat), errs
}

// parseEnv converts a variable's text to the value the decoder expects.
func parseEnv(k envKey, s string) (any, error) {
	switch {
	case k.typ == durationType:
		if _, err := ParseDuration(s); err != nil {
			return nil, fmt.Errorf("invalid duration %q", s)
		}
		return s, nil
	case k.typ.Kind() == reflect.Slice:
		var list []any
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				list = append(list, item)
			}
		}
		return list, nil
	case k.typ.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("invalid boolean %q", s)
		}
		return b, nil
	case k.typ.Kind() == reflect.Int || k.typ.Kind() == reflect.Int32:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("invalid integer %q", s)
		}
		return n, nil
	}
	return s, nil
}

// unflatten nests "a.b": v as {"a": {"b": v}}.
func unflatten(flat map[string]any) map[string]any {
	out := make(map[string]any)
	for path, v := range flat {
		parts := strings.Split(path, ".")
		m := out
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = make(map[string]any)
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = v
	}
	return out
}

var (
	durationType = reflect.TypeOf(time.Duration(0))
	routeType    = reflect.TypeOf(Route{})
	codecsType   = reflect.TypeOf(Codecs{})
)

// readSecretFiles reads each secret given as a file (postgres.dsn_file,
// kafka.sasl.password_file) into its key, trimming one trailing newline. A
// secret set both ways, an unreadable file and an empty one are errors
// naming the file key; the secret's own key is then marked failed, so that
// Validate does not also call it missing. The error never quotes the
// file's content.
func (d *decoder) readSecretFiles(c *Config) {
	for _, s := range []struct {
		key, fileKey string
		value, file  *string
	}{
		{"postgres.dsn", "postgres.dsn_file", &c.Postgres.DSN, &c.Postgres.DSNFile},
		{"kafka.sasl.password", "kafka.sasl.password_file", &c.Kafka.SASL.Password, &c.Kafka.SASL.PasswordFile},
	} {
		if *s.file == "" || d.covers(s.fileKey) {
			continue
		}
		if *s.value != "" {
			d.fail(s.fileKey, fmt.Errorf("set together with %s: set only one of them", s.key))
			d.failed = append(d.failed, s.key)
			continue
		}
		v, err := readSecretFile(*s.file)
		if err == nil {
			*s.value = v
			continue
		}
		d.fail(s.fileKey, err)
		d.failed = append(d.failed, s.key)
	}
}

// readSecretFile returns the content of the file at path without one
// trailing newline ("\n" or "\r\n"); an empty result is an error.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", fmt.Errorf("file %q is empty", path)
	}
	return v, nil
}

// secretKeys are never quoted in error messages.
var secretKeys = map[string]bool{"postgres.dsn": true, "kafka.sasl.password": true, "serve.token": true, "http.tap.token": true}

// isSecret reports a key whose value is never quoted: one of secretKeys or
// a serve or tap token (serve.tokens[i].token, http.tap.tokens[i].token).
func isSecret(key string) bool {
	return secretKeys[key] || ((strings.HasPrefix(key, "serve.tokens[") || strings.HasPrefix(key, "http.tap.tokens[")) && strings.HasSuffix(key, "].token"))
}

// decoder decodes a koanf map onto a struct strictly: unknown keys and
// values of the wrong type are errors naming their key path.
type decoder struct {
	errs   []error
	failed []string
}

func (d *decoder) fail(key string, err error) {
	d.errs = append(d.errs, &Error{Key: key, Err: err})
	d.failed = append(d.failed, key)
}

// covers reports whether key is, or is inside or above, a key that failed
// to decode, so that Validate's complaints about it would only be noise.
func (d *decoder) covers(key string) bool {
	for _, f := range d.failed {
		if within(key, f) || within(f, key) {
			return true
		}
	}
	return false
}

// within reports whether key equals parent or lies below it.
func within(key, parent string) bool {
	if !strings.HasPrefix(key, parent) {
		return false
	}
	rest := key[len(parent):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// decode stores raw into v. A null keeps v's current (default) value.
func (d *decoder) decode(key string, raw any, v reflect.Value) {
	if raw == nil {
		return
	}
	if v.Type() == durationType {
		s, ok := raw.(string)
		if !ok {
			d.fail(key, fmt.Errorf(`invalid duration %s: want a string such as "5s"`, d.describe(key, raw)))
			return
		}
		dur, err := ParseDuration(s)
		if err != nil {
			d.fail(key, fmt.Errorf("invalid duration %q", s))
			return
		}
		v.SetInt(int64(dur))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		m, ok := asMap(raw)
		if !ok {
			d.fail(key, fmt.Errorf("want a mapping, got %s", d.describe(key, raw)))
			return
		}
		t := v.Type()
		known := make(map[string]bool, t.NumField())
		for i := 0; i < t.NumField(); i++ {
			name := t.Field(i).Tag.Get("koanf")
			if name == "" {
				continue
			}
			known[name] = true
			if val, ok := m[name]; ok {
				d.decode(joinKey(key, name), val, v.Field(i))
			}
		}
		var unknown []string
		for name := range m {
			if !known[name] {
				unknown = append(unknown, name)
			}
		}
		sort.Strings(unknown)
		for _, name := range unknown {
			d.fail(joinKey(key, name), ErrUnknownKey)
		}
	case reflect.Slice:
		if s, ok := raw.(string); ok && v.Type() == codecsType {
			raw = []any{s} // a single codec
		}
		list, ok := raw.([]any)
		if !ok {
			d.fail(key, fmt.Errorf("want a list, got %s", d.describe(key, raw)))
			return
		}
		if len(list) == 0 {
			v.SetZero() // so that an empty list and no list are the same
			return
		}
		s := reflect.MakeSlice(v.Type(), len(list), len(list))
		for i, item := range list {
			if s.Type().Elem() == routeType {
				s.Index(i).Set(reflect.ValueOf(DefaultRoute()))
			}
			d.decode(fmt.Sprintf("%s[%d]", key, i), item, s.Index(i))
		}
		v.Set(s)
	case reflect.String:
		s, ok := raw.(string)
		if !ok {
			d.fail(key, fmt.Errorf("want a string, got %s (quote it)", d.describe(key, raw)))
			return
		}
		v.SetString(s)
	case reflect.Bool:
		b, ok := raw.(bool)
		if !ok {
			d.fail(key, fmt.Errorf("want true or false, got %s", d.describe(key, raw)))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, ok := asInt(raw)
		if !ok || v.OverflowInt(n) {
			d.fail(key, fmt.Errorf("want an integer, got %s", d.describe(key, raw)))
			return
		}
		v.SetInt(n)
	default:
		panic("config: cannot decode into " + v.Type().String())
	}
}

func asMap(raw any) (map[string]any, bool) {
	switch m := raw.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

func asInt(raw any) (int64, bool) {
	switch n := raw.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case float64:
		if n != math.Trunc(n) || n < math.MinInt64 || n >= math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

// describe names raw's type, and its value unless key is a secret.
func (d *decoder) describe(key string, raw any) string {
	var kind string
	switch raw.(type) {
	case string:
		kind = "string"
	case bool:
		kind = "boolean"
	case int, int32, int64, uint64:
		kind = "integer"
	case float64:
		kind = "number"
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	default:
		kind = fmt.Sprintf("%T", raw)
	}
	if isSecret(key) {
		return kind
	}
	if s, ok := raw.(string); ok {
		return fmt.Sprintf("%s %q", kind, s)
	}
	return fmt.Sprintf("%s %v", kind, raw)
}

// ParseDuration parses a duration as time.ParseDuration does, and also
// whole days first: "7d", "1d12h" (a day is 24 hours).
func ParseDuration(s string) (time.Duration, error) {
	if i := strings.IndexByte(s, 'd'); i > 0 {
		days, err := strconv.ParseUint(s[:i], 10, 16)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		d := time.Duration(days) * 24 * time.Hour
		if rest := s[i+1:]; rest != "" {
			r, err := time.ParseDuration(rest)
			if err != nil || r < 0 {
				return 0, fmt.Errorf("invalid duration %q", s)
			}
			d += r
		}
		return d, nil
	}
	return time.ParseDuration(s)
}
