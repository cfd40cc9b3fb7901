package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/pipeline"
)

// The sidecar's views of itself, beside /metrics on http.listen:
//
//	GET /v1/status  each owned partition's state (dam top); the reasons
//	                only to a request with a tap token
//	GET /v1/tap     the live stream of decisions, NDJSON (dam tap); only
//	                with http.tap.enabled, behind its bearer tokens

// envTapToken is where dam tap and dam top read the token when --token
// is not given.
const envTapToken = "DAM_TAP_TOKEN"

// tapWriteTimeout bounds each write of the stream: a reader that does not
// read for this long is cut off (the hub drops what it does not read
// meanwhile, never waiting for it).
const tapWriteTimeout = 30 * time.Second

// sidecarViews serves /v1/status and /v1/tap.
type sidecarViews struct {
	pl     *pipeline.Pipeline
	tap    *pipeline.Tap // nil: the tap is off
	tokens []tapToken
	log    *zap.Logger
}

// tapToken is a tap token ready to compare in constant time.
type tapToken struct {
	sum      [sha256.Size]byte
	services []string
	key      string
}

// newSidecarViews reads the tap's tokens (their files included) when the tap
// is enabled.
func newSidecarViews(c config.Tap, pl *pipeline.Pipeline, log *zap.Logger) (*sidecarViews, error) {
	o := &sidecarViews{pl: pl, log: log}
	if !c.Enabled {
		return o, nil
	}
	toks, err := c.ResolveTokens()
	if err != nil {
		return nil, err
	}
	for _, t := range toks {
		o.tokens = append(o.tokens, tapToken{sum: sha256.Sum256([]byte(t.Token)), services: t.Services, key: t.Key})
	}
	o.tap = pl.Tap()
	return o, nil
}

// mount returns base with /v1/status, and /v1/tap when the tap is on.
func (o *sidecarViews) mount(base http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", base)
	mux.HandleFunc("GET /v1/status", o.status)
	if o.tap != nil {
		mux.HandleFunc("GET /v1/tap", o.serveTap)
	}
	return mux
}

// close ends the taps attached (the pipeline has stopped).
func (o *sidecarViews) close() { o.tap.Close() }

// authenticate returns the tap token of r's bearer token, or nil. Every
// token is compared, in constant time, whichever matches.
func (o *sidecarViews) authenticate(r *http.Request) *tapToken {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(o.tokens) == 0 || len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return nil
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	match := -1
	for i := range o.tokens {
		if subtle.ConstantTimeCompare(sum[:], o.tokens[i].sum[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return nil
	}
	return &o.tokens[match]
}

func (t *tapToken) allows(service string) bool {
	for _, s := range t.services {
		if s == config.AnyService || s == service {
			return true
		}
	}
	return false
}

// statusJSON is GET /v1/status's answer.
type statusJSON struct {
	Ready      bool                       `json:"ready"`
	NotReady   string                     `json:"not_ready,omitempty"` // fixed words, as /readyz
	Partitions []pipeline.PartitionStatus `json:"partitions"`
}

// status answers each owned partition's state. A partition's reason (the
// error in full: it may name the record, hosts and users) is given only
// to a request with a tap token allowed its service; others get its kind
// in fixed words, as /readyz.
func (o *sidecarViews) status(w http.ResponseWriter, r *http.Request) {
	tok := o.authenticate(r)
	out := statusJSON{Ready: true, Partitions: o.pl.Status()}
	if out.Partitions == nil {
		out.Partitions = []pipeline.PartitionStatus{}
	}
	if err := o.pl.Ready(); err != nil {
		out.Ready, out.NotReady = false, "unknown"
		if ne := (*pipeline.NotReadyError)(nil); errors.As(err, &ne) {
			out.NotReady = ne.Reason
		}
	}
	for i := range out.Partitions {
		if tok == nil || !tok.allows(out.Partitions[i].Service) {
			out.Partitions[i].Reason = ""
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(out)
}

// serveTap streams the decisions the request selects, one JSON object a
// line (pipeline.TapLine), until the client goes or the pipeline stops.
// Query: service, decision (forward, drop, dead-letter), entity (as dam
// shows it: text or hex:...), sample (a fraction in (0, 1]).
func (o *sidecarViews) serveTap(w http.ResponseWriter, r *http.Request) {
	tok := o.authenticate(r)
	if tok == nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dam tap"`)
		http.Error(w, "a valid bearer token is required (http.tap.tokens)", http.StatusUnauthorized)
		return
	}
	f, err := tapFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if f.Service != "" && !tok.allows(f.Service) {
		http.Error(w, fmt.Sprintf("the token is not allowed service %q", f.Service), http.StatusForbidden)
		return
	}
	f.Allowed = tok.services
	rd, err := o.tap.Subscribe(f)
	if err != nil {
		w.Header().Set("Retry-After", "5")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer rd.Close()
	o.log.Info("tap attached", zap.String("token", tok.key), zap.String("remote", r.RemoteAddr), zap.String("filter", r.URL.RawQuery))
	defer o.log.Info("tap detached", zap.String("token", tok.key), zap.String("remote", r.RemoteAddr))

	rc := http.NewResponseController(w)
	// The stream outlives the server's read timeout (for a request
	// without a body): a read deadline passing would cancel it.
	_ = rc.SetReadDeadline(time.Time{})
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	flush := func() error {
		_ = rc.SetWriteDeadline(time.Now().Add(tapWriteTimeout))
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	if flush() != nil {
		return
	}
	for {
		evs, lost, err := rd.Next(r.Context())
		if lost > 0 {
			_ = enc.Encode(struct {
				Lost int64 `json:"lost"`
			}{lost})
		}
		for i := range evs {
			_ = enc.Encode(evs[i].Line())
		}
		if err != nil || flush() != nil {
			return
		}
	}
}

// tapFilter reads the query of GET /v1/tap.
func tapFilter(q url.Values) (pipeline.TapFilter, error) {
	f := pipeline.TapFilter{Service: q.Get("service"), Decision: q.Get("decision")}
	switch f.Decision {
	case "", pipeline.TapForward, pipeline.TapDrop, pipeline.TapDeadLetter:
	default:
		return f, fmt.Errorf("decision %q: want forward, drop or dead-letter", f.Decision)
	}
	if q.Has("entity") {
		e, err := pipeline.ParseTapEntity(q.Get("entity"))
		if err != nil {
			return f, err
		}
		f.Entity, f.HasEntity = e, true
	}
	if s := q.Get("sample"); s != "" {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(v > 0 && v <= 1) {
			return f, fmt.Errorf("sample %q: want a fraction in (0, 1]", s)
		}
		f.Sample = v
	}
	return f, nil
}

// tapOptions are dam tap's flags.
type tapOptions struct {
	addr, token, service, decision, entity string
	sample                                 float64
	asJSON                                 bool
}

func newTapCmd() *cobra.Command {
	var o tapOptions
	cmd := &cobra.Command{
		Use:   "tap --addr HOST:PORT",
		Short: "Watch a running sidecar's decisions live, with their reasons",
		Long: `Stream the decisions of a running sidecar (dam run) as it makes them: one
line a decision, with its service, topic, partition, offset, entity,
decision (forward, drop, dead-letter) and reason. A drop names the offset
of the content it duplicates, a dead letter its cause.

The sidecar serves the tap on http.listen when http.tap.enabled, behind a
bearer token of http.tap (--token, or DAM_TAP_TOKEN). A reader that does
not keep up loses lines, never slows the sidecar, and is told how many it
lost. -o json prints the sidecar's NDJSON as is.`,
		Example: `  DAM_TAP_TOKEN=... dam tap --addr dam-customer-2:9090 --decision drop
  dam tap --addr localhost:9090 --entity banana-17 -o json`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.asJSON, err = outputJSON(cmd); err != nil {
				return err
			}
			if o.token == "" {
				o.token = os.Getenv(envTapToken)
			}
			if o.addr == "" {
				return usagef("--addr is required: the sidecar's http.listen address")
			}
			if o.token == "" {
				return usagef("a tap token is required: --token or %s", envTapToken)
			}
			if cmd.Flags().Changed("sample") && !(o.sample > 0 && o.sample <= 1) {
				return usagef("--sample %v: want a fraction in (0, 1]", o.sample)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runTap(ctx, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&o.addr, "addr", "", "the sidecar's HTTP address (http.listen), HOST:PORT or a URL")
	cmd.Flags().StringVar(&o.token, "token", "", "a tap token of http.tap (default $"+envTapToken+")")
	cmd.Flags().StringVar(&o.service, "service", "", "only this service")
	cmd.Flags().StringVar(&o.decision, "decision", "", "only this decision: forward, drop or dead-letter")
	cmd.Flags().StringVar(&o.entity, "entity", "", "only this entity (text, or hex:... for bytes)")
	cmd.Flags().Float64Var(&o.sample, "sample", 1, "keep this fraction of the decisions, at random (0.1: one in ten)")
	addOutputFlag(cmd)
	return cmd
}

// baseURL turns --addr (HOST:PORT or a URL) into a URL.
func baseURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	return "http://" + addr
}

// runTap streams the tap until ctx ends or the sidecar closes the stream.
func runTap(ctx context.Context, o tapOptions, stdout, stderr io.Writer) error {
	q := url.Values{}
	for k, v := range map[string]string{"service": o.service, "decision": o.decision, "entity": o.entity} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.sample > 0 && o.sample < 1 {
		q.Set("sample", strconv.FormatFloat(o.sample, 'g', -1, 64))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(o.addr)+"/v1/tap?"+q.Encode(), nil)
	if err != nil {
		return usagef("--addr %q: %v", o.addr, err)
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("tap: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		msg := strings.TrimSpace(string(body))
		switch resp.StatusCode {
		case http.StatusNotFound:
			msg = "the sidecar does not serve the tap: set http.tap.enabled (and a token) in its configuration"
		case http.StatusUnauthorized:
			msg = "the sidecar refuses the token: give one of http.tap's tokens (--token or " + envTapToken + ")"
		}
		return fmt.Errorf("tap: %s: %s", resp.Status, msg)
	}
	w := bufio.NewWriter(stdout)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if o.asJSON {
			_, _ = w.Write(sc.Bytes())
			_ = w.WriteByte('\n')
		} else {
			var l pipeline.TapLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				return fmt.Errorf("tap: a line the sidecar sent is not a decision: %w", err)
			}
			_, _ = io.WriteString(w, tapText(l))
		}
		if err := w.Flush(); err != nil { // a person reads as it comes
			return err
		}
	}
	_ = w.Flush()
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	fmt.Fprintln(stderr, "dam tap: the sidecar ended the stream (it stopped)")
	return nil
}

// tapText is a decision as dam tap prints it:
//
//	customer-2 in/0@7 banana-17 drop: duplicate of the content forwarded from offset 5
func tapText(l pipeline.TapLine) string {
	if l.Lost > 0 {
		return fmt.Sprintf("# lost %d decisions: this reader did not keep up\n", l.Lost)
	}
	return fmt.Sprintf("%s %s/%d@%d %s %s: %s\n", printable(l.Service), printable(l.Topic), l.Partition, l.Offset,
		quoteField(printable(l.Entity)), l.Decision, printable(l.Reason))
}

// printable escapes what a terminal would act on (controls, format
// characters such as bidirectional overrides) as \uXXXX: a reason may
// quote hostile input.
func printable(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) && r != ' ' }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == ' ' || strconv.IsPrint(r) {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// quoteField quotes an entity that would not read as one field.
func quoteField(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\"") {
		return strconv.Quote(s)
	}
	return s
}
