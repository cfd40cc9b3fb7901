package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"

	"github.com/dam-dedup/dam/config"
)

// Preflight: does the Kafka cluster agree with the configuration? dam
// check prints it (Preflight); Run makes the same topic checks at start
// (checkCluster) and again, while one fails, with the health probes
// (recheckTopics):
//
//   - a broker answers and accepts dam's TLS and SASL settings;
//   - every route's from, to and dead_letter topics exist; their
//     partition counts and max.message.bytes are reported;
//   - a record of the route's max_size fits below its to topic's
//     max.message.bytes (recordOverhead left for key, headers and
//     framing), and, for partitioning: preserve, the to topic has at
//     least as many partitions as the from topic;
//   - a dead letter of such a record fits its dead_letter topic (a
//     warning: a larger one goes without its value).
//
// At start, a route setting the cluster contradicts (max_size, preserve)
// stops Run (ErrConfig). A missing topic does not: dam logs it with the
// command that creates it and waits for it; a missing from or to topic
// makes it not ready meanwhile (the route cannot work), a missing
// dead_letter topic does not (the route works until its first bad
// record, whose partition then pauses until the topic exists).

// CheckStatus is a preflight check's outcome.
type CheckStatus int

const (
	// CheckOK: the check passes.
	CheckOK CheckStatus = iota
	// CheckWarn: the check passes, with something to know (a limit that
	// could not be read, a dead-letter topic smaller than max_size).
	CheckWarn
	// CheckFail: the check fails; Fix says what to do.
	CheckFail
)

// String is "ok", "warn" or "FAIL".
func (s CheckStatus) String() string {
	switch s {
	case CheckOK:
		return "ok"
	case CheckWarn:
		return "warn"
	}
	return "FAIL"
}

// Check is one preflight check's outcome: one line of dam check.
type Check struct {
	// Name is what was checked: "kafka", or a route's topic setting
	// ("routes[0].from").
	Name   string
	Status CheckStatus
	// Detail is what was found ("projections.email: 3 partitions,
	// max.message.bytes 1048588").
	Detail string
	// Fix says what to do about a failure or a warning: a command to run,
	// or a setting to change. Empty when the check passes.
	Fix string
	// Topic is the topic a route's check is about ("" for the brokers);
	// Missing: it does not exist.
	Topic   string
	Missing bool
	// role is the route setting Topic is named by: "from", "to" or
	// "dead_letter".
	role string
}

// Preflight checks the Kafka cluster against cfg's kafka and routes
// settings, changing nothing: a broker answers and accepts dam's
// credentials, then each route's topics (see above). It returns one Check
// per line of dam check, in the routes' order; when no broker answers,
// only the brokers' check. ctx bounds it.
func Preflight(ctx context.Context, cfg config.Config) []Check {
	brokers := Check{Name: "kafka", Detail: strings.Join(cfg.Kafka.Brokers, ", ")}
	var ce *config.Error
	var ae *AuthError
	switch err := CheckBrokers(ctx, cfg.Kafka); {
	case err == nil:
		brokers.Detail = "a broker answers (" + brokers.Detail + ")" + credentials(cfg.Kafka)
	case errors.As(err, &ce):
		brokers.Status, brokers.Detail, brokers.Fix = CheckFail, err.Error(), "fix "+ce.Key
	case errors.As(err, &ae):
		brokers.Status, brokers.Detail = CheckFail, err.Error()
		brokers.Fix = "check kafka.tls (the CA, the client certificate) and kafka.sasl (mechanism, username, password) against the broker's listener"
	default:
		brokers.Status, brokers.Detail = CheckFail, fmt.Sprintf("no broker of %s answers: %v", brokers.Detail, err)
		brokers.Fix = "check kafka.brokers, that the brokers run, and that this host reaches them (port, firewall, advertised listeners)"
	}
	if brokers.Status == CheckFail {
		return []Check{brokers}
	}
	checks := []Check{brokers}
	opts, err := KafkaOptions(cfg.Kafka)
	var cl *kgo.Client
	if err == nil {
		cl, err = kgo.NewClient(append(opts, kgo.SeedBrokers(cfg.Kafka.Brokers...), kgo.ClientID(cfg.Kafka.ClientID))...)
	}
	if err == nil {
		defer cl.Close()
		var topics []Check
		if topics, _, err = topicChecks(ctx, kadm.NewClient(cl), cfg.Kafka, cfg.Routes); err == nil {
			return append(checks, topics...)
		}
	}
	return append(checks, Check{Name: "topics", Status: CheckFail,
		Detail: fmt.Sprintf("reading the routes' topics: %v", err),
		Fix:    "grant dam's principal Describe on the topics, and check that the brokers answer metadata requests"})
}

// credentials says how dam authenticated, for the brokers' check.
func credentials(k config.Kafka) string {
	var s []string
	if k.TLS.Enabled {
		s = append(s, "TLS")
	}
	if k.SASL.Mechanism != "" {
		s = append(s, "SASL "+k.SASL.Mechanism+" as "+k.SASL.Username)
	}
	if len(s) == 0 {
		return ", plaintext, no authentication"
	}
	return ", " + strings.Join(s, ", ") + " accepted"
}

// topicChecks checks every route's topics on the cluster adm talks to. It
// returns the checks, a from/to/dead_letter triple per route in order
// (dead_letter when set), and the max.message.bytes read of each topic.
// Its error means the cluster's metadata could not be read at all.
func topicChecks(ctx context.Context, adm *kadm.Client, k config.Kafka, routes []config.Route) ([]Check, map[string]int32, error) {
	var names []string
	for _, r := range routes {
		names = append(names, r.From, r.To)
		if r.DeadLetter != "" {
			names = append(names, r.DeadLetter)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		return nil, nil, err
	}
	var present []string
	for _, n := range names {
		if d, ok := details[n]; ok && d.Err == nil {
			present = append(present, n)
		}
	}
	limits := map[string]int32{}
	unread := map[string]error{}
	if len(present) > 0 {
		configs, err := adm.DescribeTopicConfigs(ctx, present...)
		if err != nil {
			for _, n := range present {
				unread[n] = err
			}
		}
		for _, rc := range configs {
			if rc.Err != nil {
				unread[rc.Name] = rc.Err
				continue
			}
			for _, c := range rc.Configs {
				if c.Key != "max.message.bytes" || c.Value == nil {
					continue
				}
				if v, err := strconv.ParseInt(*c.Value, 10, 32); err == nil {
					limits[rc.Name] = int32(v)
				}
			}
		}
	}
	partitions := func(topic string) (int, bool) {
		d, ok := details[topic]
		if !ok || d.Err != nil {
			return 0, false
		}
		return len(d.Partitions), true
	}
	var checks []Check
	for i, r := range routes {
		roles := []struct{ role, topic string }{{"from", r.From}, {"to", r.To}}
		if r.DeadLetter != "" {
			roles = append(roles, struct{ role, topic string }{"dead_letter", r.DeadLetter})
		}
		inParts, inOK := partitions(r.From)
		for _, x := range roles {
			c := Check{Name: fmt.Sprintf("routes[%d].%s", i, x.role), Topic: x.topic, role: x.role}
			d, ok := details[x.topic]
			switch {
			case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
				c.Status, c.Missing = CheckFail, true
				c.Detail = x.topic + ": does not exist"
				c.Fix = createTopic(k, x.topic, inParts, inOK && x.role != "from", r.MaxSize, x.role != "from")
			case d.Err != nil:
				c.Status = CheckFail
				c.Detail = fmt.Sprintf("%s: %v", x.topic, d.Err)
				c.Fix = "grant dam's principal Describe (and Read on from, Write on to and dead_letter) on the topic"
				if !errors.Is(d.Err, kerr.TopicAuthorizationFailed) {
					c.Fix = "see the broker's log for the topic"
				}
			default:
				checkTopic(&c, k, r, i, len(d.Partitions), inParts, inOK, limits, unread)
			}
			checks = append(checks, c)
		}
	}
	return checks, limits, nil
}

// checkTopic fills in c for an existing topic of routes[i] with parts
// partitions (its from topic has inParts, when inOK): its size limit
// against max_size, and the preserve rule.
func checkTopic(c *Check, k config.Kafka, r config.Route, i, parts, inParts int, inOK bool, limits map[string]int32, unread map[string]error) {
	limit, known := limits[c.Topic]
	c.Detail = fmt.Sprintf("%s: %s, max.message.bytes %d", c.Topic, plural(parts, "partition"), limit)
	if !known {
		c.Detail = fmt.Sprintf("%s: %s, max.message.bytes unknown", c.Topic, plural(parts, "partition"))
	}
	if c.role == "from" {
		return
	}
	var problems, fixes []string
	need := r.MaxSize + recordOverhead
	switch {
	case !known:
		c.Status = CheckWarn
		why := "not reported"
		if err := unread[c.Topic]; err != nil {
			why = err.Error()
		}
		problems = append(problems, fmt.Sprintf("max.message.bytes unreadable (%s): Kafka checks record sizes when dam produces", why))
		fixes = append(fixes, "grant dam's principal DescribeConfigs on the topic")
	case int(limit) >= need:
		c.Detail += fmt.Sprintf(" (fits max_size %d)", r.MaxSize)
	case c.role == "to":
		c.Status = CheckFail
		problems = append(problems, fmt.Sprintf("routes[%d].max_size: %d bytes does not fit in a record of %s (a value may take at most %d, leaving %d for the key, headers and framing)",
			i, r.MaxSize, c.Topic, int(limit)-recordOverhead, recordOverhead))
		fixes = append(fixes, fmt.Sprintf("lower routes[%d].max_size to %d, or raise the topic's limit: %s", i, max(int(limit)-recordOverhead, 0), alterLimit(k, c.Topic, need)))
	default: // dead_letter
		c.Status = CheckWarn
		problems = append(problems, fmt.Sprintf("a dead letter of a value above %d bytes (max_size is %d) is sent without its value", int(limit)-recordOverhead, r.MaxSize))
		fixes = append(fixes, alterLimit(k, c.Topic, need))
	}
	if c.role == "to" && r.Partitioning == config.PartitioningPreserve && inOK {
		if parts < inParts {
			c.Status = CheckFail
			problems = append(problems, fmt.Sprintf("partitioning: preserve: %s, fewer than the %d of %s", plural(parts, "partition"), inParts, r.From))
			fixes = append(fixes, fmt.Sprintf("%s --alter --topic %s --partitions %d", kafkaTool(k, "kafka-topics.sh"), c.Topic, inParts))
		} else {
			c.Detail += fmt.Sprintf(" (partitioning: preserve: at least the %d of %s)", inParts, r.From)
		}
	}
	if len(problems) > 0 {
		c.Detail += ": " + strings.Join(problems, "; ")
		c.Fix = strings.Join(fixes, "; and ")
	}
}

// plural is "1 partition", "3 partitions".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// kafkaTool is the start of a command line of one of Kafka's tools
// against the first broker.
func kafkaTool(k config.Kafka, tool string) string {
	s := tool
	if len(k.Brokers) > 0 {
		s += " --bootstrap-server " + k.Brokers[0]
	}
	if k.TLS.Enabled || k.SASL.Mechanism != "" {
		s += " --command-config client.properties"
	}
	return s
}

// createTopic is the command that creates a missing topic: as many
// partitions as the route's input when that is known and fits (an output
// topic), and a max.message.bytes that takes max_size when Kafka's
// default does not (sized: an output topic).
func createTopic(k config.Kafka, topic string, inParts int, useIn bool, maxSize int, sized bool) string {
	parts := "<partitions>"
	if useIn {
		parts = strconv.Itoa(inParts)
	}
	s := fmt.Sprintf("%s --create --topic %s --partitions %s", kafkaTool(k, "kafka-topics.sh"), topic, parts)
	if sized && maxSize+recordOverhead > defaultMaxMessageBytes {
		s += fmt.Sprintf(" --config max.message.bytes=%d", maxSize+recordOverhead)
	}
	return s
}

// alterLimit is the command that raises a topic's max.message.bytes.
func alterLimit(k config.Kafka, topic string, bytes int) string {
	return fmt.Sprintf("%s --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d", kafkaTool(k, "kafka-configs.sh"), topic, bytes)
}

// topicCheckTimeout bounds the topic checks at start and each re-check.
const topicCheckTimeout = 10 * time.Second

// checkCluster runs the topic checks before anything is consumed. A
// route setting the cluster contradicts (max_size above the to topic's
// max.message.bytes, a preserve route's to topic with fewer partitions
// than its from topic) is returned (ErrConfig): Run stops. A missing
// topic is logged with its fix and reported by Ready until it exists
// (recheckTopics); so are the checks that could not run yet because no
// broker answers. Each output topic's max.message.bytes becomes the
// producer's batch limit for it.
func (p *Pipeline) checkCluster(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	checks, limits, err := topicChecks(cctx, kadm.NewClient(p.client), p.cfg.Kafka, p.cfg.Routes)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopping before anything started
		}
		p.log.Warn("cannot read the routes' topics yet: they are checked once a broker answers", zap.Error(err))
		p.probes.mu.Lock()
		p.probes.topicsUnread = true
		p.probes.mu.Unlock()
		return nil
	}
	var errs []error
	for _, c := range checks {
		if c.Status == CheckFail && !c.Missing {
			errs = append(errs, fmt.Errorf("%w: %s: %s: %s", ErrConfig, c.Name, c.Detail, c.Fix))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	found := make([]string, 0, len(checks))
	for _, c := range checks {
		if !c.Missing {
			found = append(found, c.Name+": "+c.Detail)
		}
	}
	p.log.Info("kafka topics checked", zap.Strings("topics", found))
	p.reportTopics(checks, limits)
	return nil
}

// recheckTopics runs the topic checks again while one fails or could not
// run (the probe loop calls it): a topic created meanwhile is logged and
// read; a route setting a topic created meanwhile contradicts is logged
// and reported by Ready (dam runs already: it does not stop).
func (p *Pipeline) recheckTopics(ctx context.Context) {
	p.probes.mu.Lock()
	due := p.probes.topicsUnread
	for _, c := range p.probes.topics {
		due = due || c.Status == CheckFail
	}
	p.probes.mu.Unlock()
	if !due {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	checks, limits, err := topicChecks(cctx, kadm.NewClient(p.client), p.cfg.Kafka, p.cfg.Routes)
	if err != nil {
		return // the broker probe reports an unreachable cluster
	}
	p.reportTopics(checks, limits)
}

// reportTopics records the outcome of the topic checks for Ready and
// the re-checks, sets the producer's limits, and logs what changed since
// the last outcome: a failure (with its fix) at error level, a warning at
// warn level, a failure resolved at info level.
func (p *Pipeline) reportTopics(checks []Check, limits map[string]int32) {
	for topic, v := range limits {
		p.limits.set(topic, v)
	}
	now := map[string]Check{}
	for _, c := range checks {
		if c.Status != CheckOK {
			now[c.Name] = c
		}
	}
	p.probes.mu.Lock()
	was := p.probes.topics
	p.probes.topics, p.probes.topicsUnread = now, false
	p.probes.mu.Unlock()
	appeared := false
	for _, c := range checks {
		old, wasBad := was[c.Name]
		if wasBad && old.Status == c.Status && old.Detail == c.Detail {
			continue
		}
		fields := []zap.Field{zap.String("check", c.Name), zap.String("topic", c.Topic), zap.String("detail", c.Detail)}
		if c.Fix != "" {
			fields = append(fields, zap.String("fix", c.Fix))
		}
		switch {
		case c.Missing && c.role == "dead_letter":
			p.log.Error("kafka topic missing: a dead letter to it waits, its partition paused, until the topic exists", fields...)
		case c.Missing:
			p.log.Error("kafka topic missing: not ready until it exists", fields...)
		case c.Status == CheckFail:
			p.log.Error("kafka topic contradicts the configuration: not ready until it is fixed", fields...)
		case c.Status == CheckWarn:
			p.log.Warn("kafka topic: the check passes with a warning", fields...)
		case wasBad && old.Missing:
			p.log.Info("kafka topic exists now", fields...)
			appeared = appeared || old.role == "from"
		case wasBad:
			p.log.Info("kafka topic agrees with the configuration now", fields...)
		}
	}
	if appeared {
		// Consume it now, not at the client's next metadata refresh.
		p.client.ForceMetadataRefresh()
	}
}

// topicProblem is what Ready reports of the topic checks: the first
// missing from or to topic, or setting the cluster contradicts; nil when
// there is none. Called with probes.mu held.
func (pr *probes) topicProblem() *NotReadyError {
	var names []string
	for name, c := range pr.topics {
		if c.Status == CheckFail && !(c.Missing && c.role == "dead_letter") {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	c := pr.topics[names[0]]
	reason := fmt.Sprintf("kafka topic %s missing (%s)", c.Topic, c.Name)
	if !c.Missing {
		reason = fmt.Sprintf("kafka topic %s contradicts %s", c.Topic, c.Name)
	}
	if len(names) > 1 {
		reason += fmt.Sprintf(", and %d more", len(names)-1)
	}
	return &NotReadyError{reason, fmt.Errorf("%w: %s: %s; fix: %s", ErrNotReady, c.Name, c.Detail, c.Fix)}
}

// defaultMaxMessageBytes is Kafka's default max.message.bytes (and
// message.max.bytes), used for a topic whose setting cannot be read.
const defaultMaxMessageBytes = 1048588

// recordOverhead is the room a route's max_size must leave below its output
// topic's max.message.bytes: the record batch header (61 bytes), the
// record's framing, and a key and headers of a few hundred bytes.
const recordOverhead = 1024

// batchLimits is each output topic's max.message.bytes, read at start: the
// producer's batch limit per topic.
type batchLimits struct {
	mu sync.Mutex
	m  map[string]int32
}

func (l *batchLimits) get(topic string) int32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.m[topic]; ok {
		return v
	}
	return defaultMaxMessageBytes
}

func (l *batchLimits) set(topic string, v int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]int32{}
	}
	l.m[topic] = v
}
