package config

import (
	"bytes"
	"net/url"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Mask is the text replacing secrets in Redacted's result.
const Mask = "xxxxx"

// Redacted returns a copy of c safe to print: the passwords in
// postgres.dsn (see RedactDSN), kafka.sasl.password, serve.token,
// serve.tokens[].token, http.tap.token and http.tap.tokens[].token are
// replaced by "xxxxx".
func (c Config) Redacted() Config {
	c.Postgres.DSN = RedactDSN(c.Postgres.DSN)
	if c.Kafka.SASL.Password != "" {
		c.Kafka.SASL.Password = Mask
	}
	if c.Serve.Token != "" {
		c.Serve.Token = Mask
	}
	c.Serve.Tokens = slicesClone(c.Serve.Tokens)
	for i := range c.Serve.Tokens {
		if c.Serve.Tokens[i].Token != "" {
			c.Serve.Tokens[i].Token = Mask
		}
		c.Serve.Tokens[i].Services = slicesClone(c.Serve.Tokens[i].Services)
	}
	if c.HTTP.Tap.Token != "" {
		c.HTTP.Tap.Token = Mask
	}
	c.HTTP.Tap.Tokens = slicesClone(c.HTTP.Tap.Tokens)
	for i := range c.HTTP.Tap.Tokens {
		if c.HTTP.Tap.Tokens[i].Token != "" {
			c.HTTP.Tap.Tokens[i].Token = Mask
		}
		c.HTTP.Tap.Tokens[i].Services = slicesClone(c.HTTP.Tap.Tokens[i].Services)
	}
	c.Kafka.Brokers = slicesClone(c.Kafka.Brokers)
	c.Routes = slicesClone(c.Routes)
	return c
}

func slicesClone[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append([]T(nil), s...)
}

// RedactDSN returns dsn with every parameter whose name ends in
// "password" (password, sslpassword), in the URL and the key=value forms,
// and a URL's user password, replaced by "xxxxx". A URL that cannot be
// parsed is replaced entirely, since where its secrets lie is unknown.
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	if !strings.Contains(dsn, "://") {
		return kvPassword.ReplaceAllString(dsn, "${1}"+Mask)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return Mask
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
	}
	q := u.Query()
	changed := false
	for name := range q {
		if isPassword(name) {
			q[name] = []string{Mask}
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// kvPassword matches a key=value pair whose key ends in "password": the
// value is a quoted string with backslash escapes, or a bare word.
var kvPassword = regexp.MustCompile(`(?i)(\b\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)

// isPassword reports a DSN parameter that holds a secret.
func isPassword(name string) bool {
	return strings.HasSuffix(strings.ToLower(name), "password")
}

// YAML returns c as YAML in field order, with the keys Load reads, so that
// the output loads back to the same configuration. Route settings of modes
// other than the route's (empty) are left out. A secret read from a
// file (postgres.dsn_file, kafka.sasl.password_file) is printed as its
// file alone, which Load reads again. Other secrets are printed as they
// are: print c.Redacted().YAML() instead.
func (c Config) YAML() ([]byte, error) {
	if c.Postgres.DSNFile != "" {
		c.Postgres.DSN = ""
	}
	if c.Kafka.SASL.PasswordFile != "" {
		c.Kafka.SASL.Password = ""
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(toNode(reflect.ValueOf(c))); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func scalar(tag, value string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
}

func toNode(v reflect.Value) *yaml.Node {
	if v.Type() == durationType {
		return scalar("!!str", formatDuration(time.Duration(v.Int())))
	}
	switch v.Kind() {
	case reflect.Struct:
		n := &yaml.Node{Kind: yaml.MappingNode}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			name := t.Field(i).Tag.Get("koanf")
			if name == "" {
				continue
			}
			// A setting of another mode than the route's is left out.
			if t.Field(i).Tag.Get("dam") == "omitempty" && v.Field(i).IsZero() {
				continue
			}
			n.Content = append(n.Content, scalar("!!str", name), toNode(v.Field(i)))
		}
		return n
	case reflect.Slice:
		n := &yaml.Node{Kind: yaml.SequenceNode}
		if v.Type().Elem().Kind() != reflect.Struct {
			n.Style = yaml.FlowStyle
		}
		for i := 0; i < v.Len(); i++ {
			n.Content = append(n.Content, toNode(v.Index(i)))
		}
		return n
	case reflect.Bool:
		return scalar("!!bool", strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int32, reflect.Int64:
		return scalar("!!int", strconv.FormatInt(v.Int(), 10))
	default:
		return scalar("!!str", v.String())
	}
}

// formatDuration is Duration.String without zero trailing units: "1m", not
// "1m0s"; "1h30m", not "1h30m0s".
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
