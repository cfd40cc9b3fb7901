package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/config"
	"github.com/dam-dedup/dam/dedup"
	"github.com/dam-dedup/dam/pipeline"
)

func newExplainCmd() *cobra.Command {
	var (
		path      string
		isHex     bool
		topic     string
		partition int32
		offset    int64
		lookback  int64
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "explain --config FILE (SERVICE ENTITY [PAYLOAD_FILE|-] | --topic T --partition P --offset O)",
		Short: "Say why a record was (or would be) forwarded or dropped",
		Long: `Explain a decision, reading the state, the decision log and Kafka; it
changes nothing.

With SERVICE ENTITY [PAYLOAD_FILE|-]: would this payload be forwarded now?
Prints the stored digest (when it was set, and the input record that set
it), the payload's digest under the route's own options (format, ignore
pointers, limits; canon's defaults for a service without a route), the
decision, and when the digests differ the first structural difference,
taken from the stored content read back from Kafka at its source offset
(or "stored content no longer readable"). Without a payload it shows the
stored state and content.

With --topic, --partition and --offset: reads that input record and says
what dam decided for it and why ("duplicate of the content forwarded from
offset N at T"; for a forward, the change that made it differ). It answers
from the decision log while it still covers the offset (it is pruned below
the group's committed offset), otherwise from the state, and says which.`,
		Example: `  dam explain --config dam.yaml customer-2 B-007 payload.json
  kcat -C -t projections.customer-2 -p 0 -o 1240 -c 1 -e | dam explain -c dam.yaml customer-2 B-007 -
  dam explain --config dam.yaml --topic projections.customer-2 --partition 0 --offset 1240 -o json`,
		Args:                  argsUsage(cobra.MaximumNArgs(3)),
		DisableFlagsInUseLine: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := outputJSON(cmd)
			if err != nil {
				return err
			}
			byOffset := cmd.Flags().Changed("topic") || cmd.Flags().Changed("partition") || cmd.Flags().Changed("offset")
			switch {
			case byOffset && len(args) > 0:
				return usagef("explain: give SERVICE ENTITY [PAYLOAD] or --topic/--partition/--offset, not both")
			case byOffset && (topic == "" || !cmd.Flags().Changed("partition") || !cmd.Flags().Changed("offset")):
				return usagef("explain: --topic, --partition and --offset go together")
			case byOffset && (partition < 0 || offset < 0):
				return usagef("explain: --partition and --offset must not be negative")
			case !byOffset && len(args) < 2:
				return usagef("explain: give SERVICE ENTITY [PAYLOAD_FILE|-], or --topic, --partition and --offset")
			}
			if lookback < 0 {
				return usagef("explain: --lookback must not be negative")
			}
			cfg, err := loadConfig(path)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			store, err := dedup.Open(ctx, cfg.Postgres.DSN, dedup.Config{MaxConns: 2, ApplicationName: "dam-explain"})
			if err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			defer store.Close()
			if err := store.Ping(ctx); err != nil {
				return fmt.Errorf("postgres %s: %w", config.RedactDSN(cfg.Postgres.DSN), err)
			}
			kr, err := newKafkaReader(cfg.Kafka)
			if err != nil {
				return err
			}
			defer kr.Close()
			ex := &explainer{cfg: cfg, store: store, kafka: kr, lookback: lookback}
			out := cmd.OutOrStdout()
			if byOffset {
				res, err := ex.offset(ctx, topic, partition, offset)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(out, res)
				}
				return res.print(out)
			}
			entity := []byte(args[1])
			if isHex {
				if entity, err = hex.DecodeString(args[1]); err != nil {
					return usagef("entity %q: not hex: %v", args[1], err)
				}
			}
			var payload []byte
			hasPayload := len(args) == 3
			if hasPayload {
				if payload, err = readPayload(cmd, args[2], ex.hasher(args[0])); err != nil {
					return err
				}
			}
			res, err := ex.payload(ctx, args[0], entity, payload, hasPayload)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(out, res)
			}
			return res.print(out)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&path, "config", "c", "dam.yaml", "configuration `file` (routes, PostgreSQL, Kafka, kafka.group)")
	fl.BoolVar(&isHex, "hex", false, "ENTITY is hex-encoded bytes")
	fl.StringVar(&topic, "topic", "", "input topic of the record to explain")
	fl.Int32Var(&partition, "partition", 0, "its partition")
	fl.Int64Var(&offset, "offset", 0, "its offset")
	fl.Int64Var(&lookback, "lookback", 10000, "input records read before the offset to find the content it repeated or changed")
	fl.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	addOutputFlag(cmd)
	return cmd
}

// readPayload reads PAYLOAD_FILE or stdin ("-"), up to one byte past the
// hasher's size limit (so that a larger value is reported as too large).
func readPayload(cmd *cobra.Command, name string, h routeHasher) ([]byte, error) {
	in := cmd.InOrStdin()
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	b, err := io.ReadAll(io.LimitReader(in, int64(h.maxSize)+1))
	if err != nil {
		return nil, err
	}
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// explainer answers dam explain from the configuration, the store and
// Kafka.
type explainer struct {
	cfg      config.Config
	store    *dedup.Store
	kafka    *kafkaReader
	lookback int64
}

// entityFunc is a route's identity of a record (pipeline.Route.Entity).
type entityFunc func(r *kgo.Record) ([]byte, error)

// routeHasher is a service's hashing: its route's options or the
// defaults.
type routeHasher struct {
	*canon.Hasher
	route   *config.Route // nil: no route, canon's defaults
	maxSize int
}

func (r routeHasher) describe() string {
	if r.route == nil {
		return "canon's defaults (no route of this service in the configuration)"
	}
	s := fmt.Sprintf("route %s (from %s): format %s", r.route.Service, r.route.From, r.route.Format)
	if len(r.route.Ignore) > 0 {
		s += ", ignore " + strings.Join(r.route.Ignore, " ")
	}
	return s + fmt.Sprintf(", max_depth %d, max_size %d", r.route.MaxDepth, r.route.MaxSize)
}

// hasher returns service's hashing (routes are validated by Load, so the
// options are valid).
func (ex *explainer) hasher(service string) routeHasher {
	for i := range ex.cfg.Routes {
		r := &ex.cfg.Routes[i]
		if r.Service != service {
			continue
		}
		f, _ := canon.ParseFormat(r.Format)
		h, err := canon.New(canon.WithFormat(f), canon.WithIgnore(r.Ignore...), canon.WithMaxDepth(r.MaxDepth), canon.WithMaxSize(r.MaxSize))
		if err != nil {
			panic(fmt.Sprintf("route %s validated but its hasher fails: %v", r.Service, err))
		}
		return routeHasher{Hasher: h, route: r, maxSize: r.MaxSize}
	}
	h, _ := canon.New()
	return routeHasher{Hasher: h, maxSize: canon.DefaultMaxSize}
}

// storedJSON is a stored state.
type storedJSON struct {
	Digest    string      `json:"digest"`
	UpdatedAt time.Time   `json:"updated_at"`
	Source    *sourceJSON `json:"source"` // null: set by a check (dam serve, dedup.Check)
}

type sourceJSON struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

func (s sourceJSON) String() string { return fmt.Sprintf("%s/%d@%d", s.Topic, s.Partition, s.Offset) }

func storedOf(st dedup.State) *storedJSON {
	out := &storedJSON{Digest: st.Digest.String(), UpdatedAt: st.UpdatedAt.UTC()}
	if st.Topic != "" {
		out.Source = &sourceJSON{Topic: st.Topic, Partition: st.Partition, Offset: st.Offset}
	}
	return out
}

func (s *storedJSON) describe() string {
	if s == nil {
		return "none: the next record is forwarded (a new identity, or reset or pruned)"
	}
	from := "by a check (dam serve or dedup.Check)"
	if s.Source != nil {
		from = "from " + s.Source.String()
	}
	return fmt.Sprintf("%s set %s %s", s.Digest, stamp(s.UpdatedAt), from)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// payloadExplanation answers `dam explain SERVICE ENTITY [PAYLOAD]`.
type payloadExplanation struct {
	Service   string      `json:"service"`
	Entity    string      `json:"entity"`
	EntityHex string      `json:"entity_hex"`
	Hashing   string      `json:"hashing"`
	Stored    *storedJSON `json:"stored"`
	// Digest, Decision and Reason answer for the payload, when one is
	// given: Decision is forward, duplicate or invalid.
	Digest     string      `json:"digest,omitempty"`
	Decision   string      `json:"decision,omitempty"`
	Reason     string      `json:"reason"`
	Difference *difference `json:"difference,omitempty"`
	// StoredContent says what became of the stored content when it could
	// not be compared: "no longer readable: ...".
	StoredContent string `json:"stored_content,omitempty"`
}

func (ex *explainer) payload(ctx context.Context, service string, entity, payload []byte, hasPayload bool) (*payloadExplanation, error) {
	h := ex.hasher(service)
	if h.route == nil {
		n, err := ex.store.Count(ctx, service)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, usagef("unknown service %q: no route of the configuration has it and no state is stored for it", service)
		}
	}
	res := &payloadExplanation{Service: service, Entity: showEntity(entity), EntityHex: hex.EncodeToString(entity), Hashing: h.describe()}
	st, err := ex.store.Get(ctx, service, entity)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		res.Stored = storedOf(st)
	}
	storedValue, unreadable := ex.storedContent(ctx, h, res.Stored)
	if !hasPayload {
		res.Reason = "no payload given: the stored state only"
		if res.Stored != nil && unreadable != "" {
			res.StoredContent = unreadable
		}
		if storedValue != nil {
			res.Reason = "no payload given; the stored content is readable at its source offset"
		}
		return res, nil
	}
	d, err := h.Sum(payload)
	if err != nil {
		res.Decision = dedup.Invalid.String()
		res.Reason = "the payload does not hash: " + hashError(err) + "; dam would dead-letter it (or halt the partition)"
		return res, nil
	}
	res.Digest = d.String()
	switch {
	case res.Stored == nil:
		res.Decision, res.Reason = dedup.Forward.String(), "no stored state for this identity: its next record is forwarded"
		return res, nil
	case st.Digest == d:
		res.Decision, res.Reason = dedup.Duplicate.String(), "the payload's digest equals the stored digest: the same content as the record last forwarded"
		return res, nil
	}
	res.Decision, res.Reason = dedup.Forward.String(), "the payload's digest differs from the stored digest"
	if st.Digest.Scheme() != d.Scheme() {
		res.Reason += fmt.Sprintf(" (stored with hash scheme %d, the route now hashes with scheme %d: its format changed)", st.Digest.Scheme(), d.Scheme())
	}
	if unreadable != "" {
		res.StoredContent = unreadable
		return res, nil
	}
	diff, ok, err := firstDifference(h.Hasher, storedValue, payload)
	switch {
	case err != nil:
		res.StoredContent = "not comparable: " + err.Error()
	case ok:
		res.Difference = &diff
	default:
		res.StoredContent = "the record at the source offset equals the payload under the current options: the route's options changed since it was stored"
	}
	return res, nil
}

// kafkaTimeout bounds reading the stored content back from Kafka.
const kafkaTimeout = 10 * time.Second

// storedContent reads the value that set the stored digest back from
// Kafka; without it, it says why ("no longer readable: ...").
func (ex *explainer) storedContent(ctx context.Context, h routeHasher, st *storedJSON) ([]byte, string) {
	if st == nil {
		return nil, ""
	}
	if st.Source == nil {
		return nil, "stored content no longer readable: it was set by a check (dam serve or dedup.Check), which keeps only its digest"
	}
	// Kafka is only needed for the difference: do not spend the whole
	// --timeout on it when the brokers do not answer.
	ctx, cancel := context.WithTimeout(ctx, kafkaTimeout)
	defer cancel()
	b, err := ex.kafka.bounds(ctx, "", st.Source.Topic, st.Source.Partition)
	if err != nil {
		return nil, "stored content no longer readable: " + err.Error()
	}
	rec, err := ex.kafka.readOne(ctx, st.Source.Topic, st.Source.Partition, st.Source.Offset, b)
	if err != nil {
		return nil, "stored content no longer readable: " + err.Error()
	}
	if d, err := h.Sum(rec.Value); err != nil || d.String() != st.Digest {
		return nil, fmt.Sprintf("stored content no longer readable: the record at %s does not hash to the stored digest under the current options (the route's options changed, or the input was rewritten)", st.Source)
	}
	if rec.Value == nil {
		return nil, "" // a tombstone: nil is its content
	}
	return rec.Value, ""
}

func hashError(err error) string {
	var ce *canon.Error
	if errors.As(err, &ce) {
		return fmt.Sprintf("invalid JSON at byte %d: %s", ce.Offset, ce.Reason())
	}
	return err.Error()
}

func (r *payloadExplanation) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "service\t%s\n", r.Service)
	fmt.Fprintf(tw, "entity\t%s\n", r.Entity)
	fmt.Fprintf(tw, "hashing\t%s\n", r.Hashing)
	fmt.Fprintf(tw, "stored\t%s\n", r.Stored.describe())
	if r.Digest != "" {
		fmt.Fprintf(tw, "payload\t%s\n", r.Digest)
	}
	if r.Decision != "" {
		fmt.Fprintf(tw, "decision\t%s: %s\n", r.Decision, r.Reason)
	} else {
		fmt.Fprintf(tw, "note\t%s\n", r.Reason)
	}
	if r.Difference != nil {
		fmt.Fprintf(tw, "difference\t%s (stored -> payload)\n", r.Difference)
	}
	if r.StoredContent != "" {
		fmt.Fprintf(tw, "difference\t%s\n", r.StoredContent)
	}
	return tw.Flush()
}

// offsetRef names an input record that a decision refers to, and where
// that knowledge comes from: "state", "decision log" or "kafka" (found by
// reading the input before the offset).
type offsetRef struct {
	Offset int64     `json:"offset"`
	At     time.Time `json:"at"`
	From   string    `json:"from"`
	// AtOrBefore: the run of equal content reaches back past the records
	// read (--lookback); it may have started earlier.
	AtOrBefore bool `json:"at_or_before,omitempty"`
}

// offsetExplanation answers `dam explain --topic --partition --offset`.
type offsetExplanation struct {
	Topic     string     `json:"topic"`
	Partition int32      `json:"partition"`
	Offset    int64      `json:"offset"`
	Timestamp *time.Time `json:"timestamp,omitempty"` // the record's, when readable
	Service   string     `json:"service"`
	Entity    string     `json:"entity,omitempty"`
	EntityHex string     `json:"entity_hex,omitempty"`
	Digest    string     `json:"digest,omitempty"`
	// Decision is forward, duplicate, invalid, undecided (not decided
	// yet) or unknown (no longer recorded).
	Decision    string      `json:"decision"`
	Reason      string      `json:"reason"`
	DuplicateOf *offsetRef  `json:"duplicate_of,omitempty"`
	Previous    *offsetRef  `json:"previous,omitempty"` // a forward's previous content
	Difference  *difference `json:"difference,omitempty"`
	// Evidence lists what the answer rests on, and what no longer covers
	// the offset.
	Evidence []string `json:"evidence"`
}

// offset explains the decision for one input record.
func (ex *explainer) offset(ctx context.Context, topic string, part int32, offset int64) (*offsetExplanation, error) {
	var route *config.Route
	for i := range ex.cfg.Routes {
		if ex.cfg.Routes[i].From == topic {
			route = &ex.cfg.Routes[i]
		}
	}
	if route == nil {
		return nil, usagef("no route of the configuration reads topic %q", topic)
	}
	h := ex.hasher(route.Service)
	res := &offsetExplanation{Topic: topic, Partition: part, Offset: offset, Service: route.Service}
	p := dedup.Partition{Group: ex.cfg.Kafka.Group, Topic: topic, Partition: part}

	b, err := ex.kafka.bounds(ctx, p.Group, topic, part)
	if err != nil {
		return nil, err
	}
	pr, err := ex.store.ReadProgress(ctx, p)
	if err != nil {
		return nil, err
	}
	od, err := ex.store.DecisionAt(ctx, p, offset)
	if err != nil {
		return nil, err
	}
	decided := pr.HasNext && offset < pr.Next
	res.Evidence = append(res.Evidence, progressLine(pr, b))
	res.Evidence = append(res.Evidence, logLine(od, offset, decided))

	lo := max(b.Start, offset-ex.lookback)
	recs, readErr := ex.kafka.readRange(ctx, topic, part, lo, offset, b)
	if readErr != nil && !errors.Is(readErr, errUnreadable) {
		return nil, readErr
	}
	var rec *kgo.Record
	if n := len(recs); n > 0 && recs[n-1].Offset == offset {
		rec, recs = recs[n-1], recs[:n-1]
	} else if readErr == nil {
		readErr = fmt.Errorf("%s/%d@%d: %w: no committed record at this offset (compacted, aborted or a transaction marker)", topic, part, offset, errUnreadable)
	}
	if rec == nil {
		res.Evidence = append(res.Evidence, "kafka: "+readErr.Error())
		if !od.Covered {
			return nil, fmt.Errorf("%w, and the decision log does not cover offset %d: nothing left to explain it from", readErr, offset)
		}
		res.Decision = od.Decision.String()
		res.Reason = fmt.Sprintf("the decision log says %s; the record itself is no longer readable", od.Decision)
		if od.Entity != nil {
			res.Entity, res.EntityHex = showEntity(od.Entity), hex.EncodeToString(od.Entity)
		}
		return res, nil
	}
	ts := rec.Timestamp.UTC()
	res.Timestamp = &ts
	// The identity as the sidecar reads it (pipeline.Route).
	compiled, err := pipeline.CompileRoute(*route)
	if err != nil {
		return nil, fmt.Errorf("route %s: %w", route.Service, err)
	}
	var entityOf entityFunc = compiled.Entity
	entity, entErr := entityOf(rec)
	var digest canon.Digest
	var hashErr error
	if entErr == nil {
		res.Entity, res.EntityHex = showEntity(entity), hex.EncodeToString(entity)
		if digest, hashErr = h.Sum(rec.Value); hashErr == nil {
			res.Digest = digest.String()
		}
	}
	badInput := entErr != nil || hashErr != nil
	var st *dedup.State
	if !badInput {
		s, err := ex.store.Get(ctx, route.Service, entity)
		switch {
		case errors.Is(err, dedup.ErrNotFound):
			res.Evidence = append(res.Evidence, "state: none stored for this identity (reset or pruned since, or never forwarded)")
		case err != nil:
			return nil, err
		default:
			st = &s
			res.Evidence = append(res.Evidence, "state: "+storedOf(s).describe())
		}
	}

	// The decision.
	fromState := st != nil && st.Topic == topic && st.Partition == part
	switch {
	case !decided:
		res.Decision = "undecided"
		res.Reason = fmt.Sprintf("not decided yet: offsets below %s are decided", nextText(pr))
		if !badInput {
			if st != nil && st.Digest == digest {
				res.Reason += "; decided now, it would be a duplicate (its digest equals the stored one)"
			} else {
				res.Reason += "; decided now, it would be forwarded"
			}
		}
		return res, nil
	case od.Covered:
		res.Decision = od.Decision.String()
	case badInput:
		res.Decision = dedup.Invalid.String()
	case fromState && st.Offset == offset:
		res.Decision = dedup.Forward.String()
	case fromState && st.Offset < offset && st.Digest == digest:
		res.Decision = dedup.Duplicate.String()
	default:
		res.Decision = "unknown"
	}

	switch res.Decision {
	case dedup.Invalid.String():
		why := ""
		switch {
		case entErr != nil:
			why = entErr.Error()
		case hashErr != nil:
			why = hashError(hashErr)
		default:
			why = "valid under the current options: the route's options changed since"
		}
		dest := "it went to the dead-letter topic " + route.DeadLetter
		if route.DeadLetter == "" {
			dest = "the route has no dead_letter topic: it halted the partition"
		}
		res.Reason = fmt.Sprintf("bad input (%s); %s", why, dest)
	case dedup.Duplicate.String():
		res.DuplicateOf = ex.duplicateOf(ctx, p, st, entity, digest, offset, recs, entityOf, h, lo, b)
		if res.DuplicateOf == nil {
			res.Reason = "a duplicate of the content stored when it was decided; the record that forwarded that content is no longer known (beyond the log, the state and --lookback)"
		} else {
			res.Reason = fmt.Sprintf("duplicate of the content forwarded from offset %s at %s", res.DuplicateOf.offsetText(), stamp(res.DuplicateOf.At))
		}
	case dedup.Forward.String():
		prev, prevValue, ok := previousRecord(recs, entity, entityOf, h)
		switch {
		case !ok:
			res.Reason = fmt.Sprintf("forwarded: no earlier record of this entity in offsets [%d, %d): a new identity, or its previous record is beyond --lookback", lo, offset)
		case sameDigest(h, prevValue, digest):
			res.Previous = &offsetRef{Offset: prev.Offset, At: prev.Timestamp.UTC(), From: "kafka"}
			res.Reason = fmt.Sprintf("forwarded although the previous record of this entity (offset %d) has the same content: its state was reset or pruned in between (or changed by a check)", prev.Offset)
		default:
			res.Previous = &offsetRef{Offset: prev.Offset, At: prev.Timestamp.UTC(), From: "kafka"}
			res.Reason = fmt.Sprintf("forwarded: its content differs from the previous record of this entity (offset %d)", prev.Offset)
			if diff, ok, err := firstDifference(h.Hasher, prevValue, rec.Value); err == nil && ok {
				res.Difference = &diff
			}
		}
		if fromState && st.Offset == offset {
			res.Reason += "; it set the stored digest, still current"
		}
	default:
		res.Reason = "the decision is no longer recorded: " + unknownWhy(st, topic, part, offset, digest)
		// The input before the offset still shows what was stored when it
		// was decided (unless the identity was reset in between).
		if prev, prevValue, ok := previousRecord(recs, entity, entityOf, h); ok {
			if d, _ := h.Sum(prevValue); d == digest {
				res.DuplicateOf = runStart(recs, entity, digest, entityOf, h, lo, b)
				res.Reason += fmt.Sprintf("; the input before it suggests a duplicate of the content forwarded from offset %s (unless the identity was reset in between)",
					res.DuplicateOf.offsetText())
			} else {
				res.Previous = &offsetRef{Offset: prev.Offset, At: prev.Timestamp.UTC(), From: "kafka"}
				if diff, ok, err := firstDifference(h.Hasher, prevValue, rec.Value); err == nil && ok {
					res.Difference = &diff
				}
				res.Reason += fmt.Sprintf("; the input before it suggests it was forwarded: it differs from the previous record of this entity (offset %d)", prev.Offset)
			}
		}
	}
	return res, nil
}

func (r *offsetRef) offsetText() string {
	if r.AtOrBefore {
		return fmt.Sprintf("%d or earlier", r.Offset)
	}
	return fmt.Sprint(r.Offset)
}

// duplicateOf finds the forward whose content a duplicate repeated: the
// state's source when it still holds that content, else the last logged
// forward of the entity, else the start of the run of equal content in the
// input read before the offset.
func (ex *explainer) duplicateOf(ctx context.Context, p dedup.Partition, st *dedup.State, entity []byte, d canon.Digest,
	offset int64, before []*kgo.Record, entityOf entityFunc, h routeHasher, lo int64, b bounds) *offsetRef {
	if st != nil && st.Topic == p.Topic && st.Partition == p.Partition && st.Offset < offset && st.Digest == d {
		return &offsetRef{Offset: st.Offset, At: st.UpdatedAt.UTC(), From: "state"}
	}
	if f, ok, err := ex.store.LastForward(ctx, p, entity, offset); err == nil && ok {
		return &offsetRef{Offset: f.Offset, At: f.LoggedAt.UTC(), From: "decision log"}
	}
	return runStart(before, entity, d, entityOf, h, lo, b)
}

// runStart finds, in the records read before an offset, the first record
// of the run of entity's records with digest d that ends there: under
// last-seen, the forward whose content the run repeats. nil when the
// entity has no such record there.
func runStart(before []*kgo.Record, entity []byte, d canon.Digest, entityOf entityFunc, h routeHasher, lo int64, b bounds) *offsetRef {
	var run *kgo.Record
	for i := len(before) - 1; i >= 0; i-- {
		r := before[i]
		e, err := entityOf(r)
		if err != nil || string(e) != string(entity) {
			continue
		}
		rd, err := h.Sum(r.Value)
		if err != nil {
			continue // invalid records change nothing
		}
		if rd != d {
			break
		}
		run = r
	}
	if run == nil {
		return nil
	}
	return &offsetRef{Offset: run.Offset, At: run.Timestamp.UTC(), From: "kafka", AtOrBefore: lo > b.Start && run == firstOf(before, entity, entityOf)}
}

// firstOf returns the first record of entity in recs.
func firstOf(recs []*kgo.Record, entity []byte, entityOf entityFunc) *kgo.Record {
	for _, r := range recs {
		if e, err := entityOf(r); err == nil && string(e) == string(entity) {
			return r
		}
	}
	return nil
}

func sameDigest(h routeHasher, value []byte, d canon.Digest) bool {
	vd, err := h.Sum(value)
	return err == nil && vd == d
}

// previousRecord returns the last valid record of entity in recs: under
// last-seen its content is what was stored when the next one was decided.
func previousRecord(recs []*kgo.Record, entity []byte, entityOf entityFunc, h routeHasher) (*kgo.Record, []byte, bool) {
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		if e, err := entityOf(r); err != nil || string(e) != string(entity) {
			continue
		}
		if _, err := h.Sum(r.Value); err != nil {
			continue
		}
		return r, r.Value, true
	}
	return nil, nil, false
}

func unknownWhy(st *dedup.State, topic string, part int32, offset int64, d canon.Digest) string {
	switch {
	case st == nil:
		return "the identity has no stored state now (reset or pruned since)"
	case st.Topic == "":
		return fmt.Sprintf("the stored digest was since set by a check (dam serve or dedup.Check) at %s", stamp(st.UpdatedAt))
	case st.Topic != topic || st.Partition != part:
		return fmt.Sprintf("the stored digest was since set from another partition (%s/%d@%d)", st.Topic, st.Partition, st.Offset)
	case st.Offset > offset:
		return fmt.Sprintf("the stored digest was since set from offset %d at %s", st.Offset, stamp(st.UpdatedAt))
	}
	return fmt.Sprintf("the stored digest (from offset %d) differs from this record's %s under the current options; the route's options changed since, or the state was restored", st.Offset, d)
}

func nextText(pr dedup.Progress) string {
	if !pr.HasNext {
		return "the partition's progress, which is not set yet"
	}
	return fmt.Sprintf("the partition's progress %d", pr.Next)
}

func progressLine(pr dedup.Progress, b bounds) string {
	c := "none"
	if b.Committed >= 0 {
		c = fmt.Sprint(b.Committed)
	}
	p := "not set"
	if pr.HasNext {
		p = fmt.Sprint(pr.Next)
	}
	return fmt.Sprintf("progress: decided below %s; the group's committed offset is %s; the partition holds [%d, %d)", p, c, b.Start, b.End)
}

func logLine(od dedup.OffsetDecision, offset int64, decided bool) string {
	switch {
	case !decided && od.HasLog:
		return fmt.Sprintf("decision log: does not cover offset %d yet (it holds [%d, %d))", offset, od.LogFrom, od.LogTo)
	case !decided:
		return fmt.Sprintf("decision log: does not cover offset %d yet (empty for this partition)", offset)
	case od.Covered:
		return fmt.Sprintf("decision log: offset %d is in the batch [%d, %d) decided %s: %s", offset, od.First, od.End, stamp(od.LoggedAt), od.Decision)
	case od.HasLog:
		return fmt.Sprintf("decision log: no longer covers offset %d (it holds [%d, %d); it is pruned below the group's committed offset once delivered)", offset, od.LogFrom, od.LogTo)
	}
	return fmt.Sprintf("decision log: no longer covers offset %d (empty for this partition: pruned below the group's committed offset once delivered)", offset)
}

func (r *offsetExplanation) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rec := fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
	if r.Timestamp != nil {
		rec += ", " + stamp(*r.Timestamp)
	}
	fmt.Fprintf(tw, "record\t%s\n", rec)
	fmt.Fprintf(tw, "service\t%s\n", r.Service)
	if r.Entity != "" || r.EntityHex != "" {
		fmt.Fprintf(tw, "entity\t%s\n", r.Entity)
	}
	if r.Digest != "" {
		fmt.Fprintf(tw, "digest\t%s\n", r.Digest)
	}
	fmt.Fprintf(tw, "decision\t%s\n", r.Decision)
	fmt.Fprintf(tw, "why\t%s\n", r.Reason)
	if r.Difference != nil {
		fmt.Fprintf(tw, "difference\t%s (offset %d -> %d)\n", r.Difference, r.Previous.Offset, r.Offset)
	}
	for _, e := range r.Evidence {
		fmt.Fprintf(tw, "evidence\t%s\n", e)
	}
	return tw.Flush()
}
